"""The inputs conversion's evidence runs on: the user's sample and probes made from it.

A sample users really pass is often degenerate: one token (a softmax over one key is 1, so
query and key cannot be told apart), zeros (every kernel gives the bias), a batch of identical
rows, all-positive inputs to a ReLU net. A wrong candidate agrees on such a sample. So every
candidate is also run on `PROBES` inputs made from the sample: what the sample shows to be
data gets new values, what it shows to be structure is kept as given, since two correct
implementations need agree only on inputs that are consistent (a sliding window drawn from
`positions` in one model and from the attention mask in the other agree on the sample's
positions, not on random ones). The rule, leaf by leaf:
- floats are data (standard normal draws), except an additive mask: a float array holding
  `-inf`, `nan` or a sentinel of magnitude `>= 1e9` (`finfo.min`, `-1e9`) is kept;
- integers are structure (positions, segment ids, lengths, indices) and are kept, except
  token ids: an array the sample run shows indexing an embedding (its recorded call's input,
  `num_embeddings` / `vocab_size` of flax's `Embed` and look-alikes) is drawn within the
  vocabulary. A drawn id is never 0 (the usual padding id), and where the sample holds 0
  among other ids the probe keeps it, so a padding mask derived from the ids is the sample's;
- bools (masks), PRNG keys, scalars and non-arrays are kept.
A probe whose drawn rows come out all equal is drawn again; a probe equal to the sample (it
has no data to vary) is left out. A pairing must agree on every input.

`probes=` overrides this: `0` or `()` runs the sample alone, an integer that many drawn
probes, and a list of `(args, kwargs)` the user's own inputs (both models must agree on them).
"""

from __future__ import annotations

import dataclasses
import typing as tp

import jax
import jax.numpy as jnp
import numpy as np

from .._core.errors import CheckpointError

# Probes besides the sample: two, so that one unlucky draw cannot decide alone.
PROBES = 2
SAMPLE = "sample"
_SEED = 20260512
_REDRAWS = 8
# A float entry this large (or not finite) is a mask value, not data (`-1e9`, `finfo.min`).
_MASK_MAGNITUDE = 1e9

# What `probes=` takes: None (the default drawn probes), a count, or the user's own inputs.
ProbeSpec = int | tp.Sequence[tuple[tp.Sequence[object], tp.Mapping[str, object]]] | None

_PROBES_HELP = (
  "probes= takes None (draw the default probes), a count of drawn probes (0 turns them off), "
  "or a list of the inputs both models must agree on, each as (args, kwargs), e.g. "
  "probes=[((tokens, positions), {'mask': mask})]."
)


@dataclasses.dataclass(frozen=True)
class Input:
  """One call both models are run on: the sample, or a probe made from it or given."""

  name: str  # "sample", "probe 1", ...
  args: tuple[object, ...]
  kwargs: dict[str, object]
  # What a drawn probe varied (e.g. "args[0] (floats)"); "" for the sample and given probes.
  drawn: str = ""

  def describe(self) -> str:
    """The input as an error names it."""
    if self.name == SAMPLE:
      return "the sample arguments"
    how = f"drawn from the sample: {self.drawn}" if self.drawn else "given by probes="
    return f"{self.name} ({how})"


def checked_probes(probes: object) -> int | list[tuple[tuple[object, ...], dict[str, object]]]:
  """`probes=` validated: a count of probes to draw, or the user's inputs (a clear error
  otherwise)."""
  if probes is None:
    return PROBES
  if isinstance(probes, bool) or (isinstance(probes, int) and probes < 0):
    raise CheckpointError(f"{_PROBES_HELP} Got {probes!r}.")
  if isinstance(probes, int):
    return probes
  if isinstance(probes, (str, bytes)) or not isinstance(probes, tp.Sequence):
    raise CheckpointError(f"{_PROBES_HELP} Got {type(probes).__name__} {probes!r}.")
  given = []
  for n, probe in enumerate(probes):
    ok = isinstance(probe, (tuple, list)) and len(probe) == 2
    args, kwargs = probe if ok else (None, None)
    if not (isinstance(args, (tuple, list)) and isinstance(kwargs, tp.Mapping)):
      raise CheckpointError(f"{_PROBES_HELP} Probe {n + 1} is {probe!r}.")
    given.append((tuple(args), dict(kwargs)))
  return given


def _is_array(leaf: object) -> bool:
  return isinstance(leaf, (jax.Array, np.ndarray)) and np.ndim(leaf) >= 1


def _is_key(leaf: object) -> bool:
  dtype = getattr(leaf, "dtype", None)
  return dtype is not None and jnp.issubdtype(dtype, jax.dtypes.prng_key)


def _is_integer(leaf: object) -> bool:
  if not _is_array(leaf) or _is_key(leaf):
    return False
  return bool(jnp.issubdtype(tp.cast(tp.Any, leaf).dtype, jnp.integer))


def _kind(leaf: object, vocabulary: int | None) -> str | None:
  """'float' (data), 'ids' (token ids) or None (structure: kept as given) for a sample leaf."""
  if not _is_array(leaf) or _is_key(leaf):
    return None
  dtype = np.dtype(tp.cast(tp.Any, leaf).dtype)
  if jnp.issubdtype(dtype, jnp.floating) or jnp.issubdtype(dtype, jnp.complexfloating):
    magnitude = np.abs(np.asarray(leaf).astype(np.complex128 if dtype.kind == "c" else np.float64))
    masked = not np.all(np.isfinite(magnitude)) or bool(np.any(magnitude >= _MASK_MAGNITUDE))
    return None if masked else "float"
  if jnp.issubdtype(dtype, jnp.integer) and vocabulary is not None:
    return "ids"
  return None


def _all_equal_rows(a: np.ndarray) -> bool:
  """Whether the slices along some axis longer than 1 are all equal (a degenerate draw)."""
  return any(
    a.shape[axis] > 1 and bool(np.all(a == np.take(a, [0], axis=axis))) for axis in range(a.ndim)
  )


def _draw_ids(leaf: object, key: jax.Array, vocabulary: int) -> object:
  """Token ids within the vocabulary: never the padding id 0, which stays where the sample
  pads (it holds 0 among other ids)."""
  shape, dtype = np.shape(tp.cast(tp.Any, leaf)), tp.cast(tp.Any, leaf).dtype
  sample = np.asarray(leaf)
  if vocabulary <= 2:
    return leaf  # no id but the sample's is known to be valid and not padding here
  padding = (sample == 0) & bool(np.any(sample != 0))
  out = jax.random.randint(key, shape, 1, vocabulary, dtype)
  for n in range(_REDRAWS):
    if not _all_equal_rows(np.asarray(out)):
      break
    out = jax.random.randint(jax.random.fold_in(key, n + 1), shape, 1, vocabulary, dtype)
  return jnp.where(padding, jnp.zeros((), dtype), out) if padding.any() else out


def _draw(leaf: object, kind: str, key: jax.Array, vocabulary: int | None) -> object:
  if kind == "float":
    return jax.random.normal(key, np.shape(tp.cast(tp.Any, leaf)), tp.cast(tp.Any, leaf).dtype)
  return _draw_ids(leaf, key, tp.cast(int, vocabulary))


def make_inputs(
  sample_args: tuple[object, ...],
  sample_kwargs: tp.Mapping[str, object],
  vocabulary: tp.Callable[[object], int | None],
  probes: int | tp.Sequence[tuple[tuple[object, ...], dict[str, object]]] = PROBES,
) -> list[Input]:
  """The sample first, then the probes: `probes` drawn from it (a count), or the given ones.

  Args:
    sample_args: the user's positional sample arguments.
    sample_kwargs: the user's keyword sample arguments.
    vocabulary: for an integer leaf of the sample, the vocabulary of the embedding it
      indexes (None: not token ids, kept as given).
    probes: how many to draw (see the module's rule), or the user's `(args, kwargs)`.
  """
  inputs = [Input(SAMPLE, tuple(sample_args), dict(sample_kwargs))]
  if not isinstance(probes, int):
    return inputs + [Input(f"probe {n + 1}", a, k) for n, (a, k) in enumerate(probes)]
  with_paths, treedef = jax.tree_util.tree_flatten_with_path(
    (tuple(sample_args), dict(sample_kwargs))
  )
  leaves = [leaf for _, leaf in with_paths]
  names = [_leaf_name(path) for path, _ in with_paths]
  vocab = [vocabulary(leaf) if _is_integer(leaf) else None for leaf in leaves]
  kinds = [_kind(leaf, v) for leaf, v in zip(leaves, vocab)]
  for p in range(probes):
    key = jax.random.fold_in(jax.random.key(_SEED), p)
    drawn = [
      leaf if kind is None else _draw(leaf, kind, jax.random.fold_in(key, i), v)
      for i, (leaf, kind, v) in enumerate(zip(leaves, kinds, vocab))
    ]
    if all(a is b for a, b in zip(drawn, leaves)):
      break  # nothing here is data: a probe would be the sample again
    args, kwargs = jax.tree.unflatten(treedef, drawn)
    varied = ", ".join(
      f"{name} ({'floats' if kind == 'float' else 'token ids'})"
      for name, kind in zip(names, kinds)
      if kind is not None
    )
    inputs.append(Input(f"probe {p + 1}", tuple(args), dict(kwargs), varied))
  return inputs


def _leaf_name(path: tuple[object, ...]) -> str:
  """A sample leaf as the user wrote it: `args[0]`, `kwargs['mask']`, `args[1][0]`."""
  head, rest = path[0], jax.tree_util.keystr(tuple(path[1:]))
  return ("args" if getattr(head, "idx", 0) == 0 else "kwargs") + rest


def probes_only_message(
  source: str,
  agreeing: int,
  total: int,
  failed: tp.Sequence[Input],
  detail: str = "",
  module: str = "",
) -> str:
  """The refusal when candidates reproduce the sample and only probes rule every one out
  (`detail`: what else to say before the fix, e.g. the open choices; `module`: the source
  module whose own call the candidates were checked on, where it was not the model's)."""
  counts = {i.name: sum(f.name == i.name for f in failed) for i in failed}
  where = "; ".join(
    f"{n} on {next(i for i in failed if i.name == name).describe()}" for name, n in counts.items()
  )
  if module:
    head = (
      f"candidates for the {source} module `{module}` reproduce its call on the sample "
      f"arguments, but none agrees on {failed[0].describe()}, so too many stay open for the "
      f"model's runs"
    )
  elif total == 1:
    head = (
      f"the conversion reproduces the {source} model's output on the sample arguments but not "
      f"on {failed[0].describe()}"
    )
  else:
    head = (
      f"{agreeing} of {total} candidate conversions reproduce the {source} model's output "
      f"on the sample arguments, but each disagrees on a probe ({where})"
    )
  return (
    f"{head}. Probes keep what the sample shows to be structure (integer positions, masks) "
    "and vary its data (floats, token ids), so that a degenerate sample cannot decide; yet two "
    "correct implementations can still disagree off the sample (a padding or window mask "
    "derived from the varied values in one model and passed in the other). "
    + (detail if detail.endswith("\n") else detail.strip() + " " if detail else "")
    + "Fix: pass probes=[(args, kwargs), ...] with inputs on which both models should agree, "
    "or probes=0 to decide on the sample alone; if they should agree on this probe, check the "
    "port with lb.compare on it."
  )


def same_array(a: object, b: object) -> bool:
  """Whether two leaves are the same integer array (a recorded call's input and a sample's)."""
  return (
    _is_array(a)
    and _is_array(b)
    and np.shape(tp.cast(tp.Any, a)) == np.shape(tp.cast(tp.Any, b))
    and not _is_key(a)
    and not _is_key(b)
    and np.asarray(a).dtype == np.asarray(b).dtype
    and bool(np.array_equal(np.asarray(a), np.asarray(b)))
  )
