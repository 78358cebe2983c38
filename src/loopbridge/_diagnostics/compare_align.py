"""Aligning the recorded calls of two models, for `lb.compare` (and for moving state by them).

Alignment pairs the two call lists: first a user mapping, then equal paths (an NNX list path
`layers/0` also matches Linen's `layers_0`), then the remaining calls in order where their
output shapes agree (a weighted longest common subsequence), and last, calls left over
between two aligned pairs in equal numbers, in order (these differ in shape).
"""

from __future__ import annotations

import dataclasses
import itertools
import typing as tp

import flax.linen as nn
import jax
import numpy as np
from flax import nnx

from .._core.errors import CompareError
from .compare_capture import LINEN, NNX, Call, record
from .compare_report import BY_MAPPING, BY_NAME, BY_ORDER, BY_POSITION, shown_path
from .compare_values import as_numpy, numeric, tree_text

_MAX_LISTED = 12  # calls listed in an error message before "... and N more"

# Among calls with equal output shapes, order alignment prefers pairs whose outputs also agree
# on a sample of values (loosely: a tie-break, not the comparison).
_SAMPLE_SIZE = 32
_SAMPLE_RTOL, _SAMPLE_ATOL = 1e-3, 1e-3


def prepare(calls: list[Call]) -> None:
  for index, call in enumerate(calls):
    call.index = index
    call.leaves = [
      (jax.tree_util.keystr(k), v) for k, v in jax.tree_util.tree_leaves_with_path(call.output)
    ]
    call.signature = tuple(as_numpy(v).shape for _, v in call.leaves)
    call.sample = _sample(call.leaves)


def _sample(leaves: list[tuple[str, tp.Any]]) -> np.ndarray:
  """Up to `_SAMPLE_SIZE` values per leaf at evenly spaced positions (same shapes, same places)."""
  parts = []
  for _, leaf in leaves:
    array = as_numpy(leaf)
    if not numeric(array) or array.dtype.kind == "c" or array.size == 0:
      continue
    flat = array.reshape(-1)
    positions = np.linspace(0, flat.size - 1, min(_SAMPLE_SIZE, flat.size)).astype(np.int64)
    parts.append(flat[positions].astype(np.float64))
  return np.concatenate(parts) if parts else np.zeros(0)


def call_list(calls: tp.Sequence[Call]) -> str:
  shown = [f"{shown_path(c.shown)} {tree_text(c.output, 60)}" for c in calls[:_MAX_LISTED]]
  more = f", ... and {len(calls) - _MAX_LISTED} more" if len(calls) > _MAX_LISTED else ""
  return "; ".join(shown) + more if shown else "none"


def _forced_partners(
  ref: list[Call], cand: list[Call], mapping: tp.Mapping[str, str | None] | None
) -> tuple[dict[int, tuple[int, str]], set[int], set[int]]:
  """Pairs fixed by the mapping and by equal paths; reference and candidate calls mapped away."""
  # A mapping names a module path (every call of it, layers in order) or one layer of a
  # scanned stack as the report writes it (`layers[2]/Dense_0`).
  by_path_r: dict[str, list[int]] = {}
  by_path_c: dict[str, list[int]] = {}
  for calls, by_path in ((ref, by_path_r), (cand, by_path_c)):
    for c in calls:
      for name in dict.fromkeys((c.path, c.shown)):
        by_path.setdefault(name, []).append(c.index)
  partners: dict[int, tuple[int, str]] = {}
  excluded_r: set[int] = set()
  mapped_r: set[int] = set()
  claimed_c: set[int] = set()
  mapping = dict(mapping or {})
  for ref_path, cand_path in mapping.items():
    if not isinstance(ref_path, str) or not (cand_path is None or isinstance(cand_path, str)):
      raise CompareError(
        f"lb.compare: mapping entry {ref_path!r}: {cand_path!r} is not a pair of paths: "
        "write {'Block_0/Dense_0': 'blocks/0/linear'} ('/'-joined module paths as the "
        "report shows them, '' for the top level; None for a reference call with no "
        "counterpart)."
      )
    if ref_path not in by_path_r:
      raise CompareError(
        f"lb.compare: mapping key {ref_path!r} names no module call of the reference, so it "
        f"cannot be paired. The reference called: {call_list(ref)}. Use these paths "
        "('/'-joined, as the report shows them)."
      )
    if cand_path is None:
      excluded_r.update(by_path_r[ref_path])
      continue
    if cand_path not in by_path_c:
      raise CompareError(
        f"lb.compare: mapping value {cand_path!r} (for {ref_path!r}) names no module call of "
        f"the candidate, so it cannot be paired. The candidate called: {call_list(cand)}. "
        "Use these paths ('/'-joined, as the report shows them)."
      )
    claimed_c.update(by_path_c[cand_path])
    mapped_r.update(by_path_r[ref_path])
    for i, j in zip(by_path_r[ref_path], by_path_c[cand_path]):
      partners[i] = (j, BY_MAPPING)
  # Equal keys: equal paths, an NNX list index or a scanned layer standing for Linen's `_N`.
  by_key_r: dict[str, list[int]] = {}
  by_key_c: dict[str, list[int]] = {}
  for c in ref:
    if c.index not in mapped_r and c.index not in excluded_r:
      by_key_r.setdefault(c.key, []).append(c.index)
  for c in cand:
    if c.index not in claimed_c:
      by_key_c.setdefault(c.key, []).append(c.index)
  for key, indices in by_key_r.items():
    for i, j in zip(indices, by_key_c.get(key, ())):
      partners[i] = (j, BY_NAME)
  return partners, excluded_r, claimed_c


def align(
  ref: list[Call], cand: list[Call], mapping: tp.Mapping[str, str | None] | None
) -> list[tuple[int, int, str]]:
  """(reference index, candidate index, how) for every aligned pair."""
  partners, excluded_r, claimed_c = _forced_partners(ref, cand, mapping)
  n, m = len(ref), len(cand)
  partnered_c = {j for j, _ in partners.values()}
  free_c = np.array([j not in partnered_c and j not in claimed_c for j in range(m)], bool)
  signature_ids: dict[tuple, int] = {}
  sig_c = np.array(
    [signature_ids.setdefault(c.signature, len(signature_ids)) for c in cand], np.int64
  )
  # Weights: a pair by shape counts `unit`, plus 2 when sampled values agree and 1 when the
  # layer types agree (bonuses only break ties between equally long alignments); a forced
  # pair outweighs them all.
  unit = 3 * (n + m) + 1
  kind_c = np.array([c.kind for c in cand], object)
  big = unit * (n + m + 1)
  groups: dict[int, tuple[np.ndarray, np.ndarray]] = {}
  for sid in set(sig_c.tolist()):
    members = np.flatnonzero((sig_c == sid) & free_c)
    if members.size:
      groups[sid] = (members, np.stack([cand[j].sample for j in members]))

  def weights(i: int) -> np.ndarray:
    w = np.zeros(m, np.int64)
    if i in partners:
      w[partners[i][0]] = big
    elif i not in excluded_r:
      sid = signature_ids.get(ref[i].signature)
      if sid in groups:
        members, samples = groups[sid]
        x = ref[i].sample
        with np.errstate(invalid="ignore"):
          agree = np.all(np.abs(samples - x) <= _SAMPLE_ATOL + _SAMPLE_RTOL * np.abs(x), axis=1)
        same_kind = kind_c[members] == ref[i].kind
        w[members] = unit + 2 * agree.astype(np.int64) + same_kind.astype(np.int64)
    return w

  # Weighted longest common subsequence, one row at a time: row[j] is the best total weight
  # aligning ref[:i] with cand[:j]; the prefix maximum carries "skip a candidate call".
  table = np.zeros((n + 1, m + 1), np.int64)
  rows_w = []
  for i in range(n):
    w = weights(i)
    rows_w.append(w)
    prev = table[i]
    step = np.maximum(prev[1:], np.where(w > 0, prev[:-1] + w, 0))
    table[i + 1, 1:] = np.maximum.accumulate(step)
  chain: list[tuple[int, int]] = []
  i, j = n, m
  while i > 0 and j > 0:
    w = rows_w[i - 1][j - 1]
    if w > 0 and table[i, j] == table[i - 1, j - 1] + w:
      chain.append((i - 1, j - 1))
      i, j = i - 1, j - 1
    elif table[i, j] == table[i - 1, j]:
      i -= 1
    else:
      j -= 1
  chain.reverse()
  pairs: dict[int, tuple[int, str]] = {}
  for i, j in chain:
    pairs[i] = (j, partners[i][1] if i in partners else BY_ORDER)
  # Forced pairs the chain could not hold (the two sides call them in another order).
  for i, (j, how) in partners.items():
    if i not in pairs and j not in {jj for jj, _ in pairs.values()}:
      pairs[i] = (j, how)
  # Calls left over between two consecutive chain pairs, as many on each side: the same
  # modules with outputs of another shape (a port that changed a width).
  used_c = {j for j, _ in pairs.values()}
  bounds = [(-1, -1), *chain, (n, m)]
  for (i0, j0), (i1, j1) in itertools.pairwise(bounds):
    left_r = [i for i in range(i0 + 1, i1) if i not in pairs and i not in excluded_r]
    left_c = [j for j in range(j0 + 1, j1) if j not in used_c and j not in claimed_c]
    if left_r and len(left_r) == len(left_c):
      for i, j in zip(left_r, left_c):
        pairs[i] = (j, BY_POSITION)
  return sorted((i, j, how) for i, (j, how) in pairs.items())


# ----------------------------------------------------------------------------- for other tools
@dataclasses.dataclass(frozen=True)
class ModuleCall:
  """One side of an aligned pair: which module made the call, and where in the run."""

  path: str  # '/'-joined module path, '' for the top level (a scanned layer: the stack's path)
  call: int  # position in this side's call order, from 0
  stack: str  # the layer stack the call belongs to ('' for none)
  layer: int | None  # its layer in that stack (None outside a stack)
  scanned: bool  # a layer of a stacked module (nn.scan, nnx.scan over an nnx.vmap stack)
  module_type: str  # the module's class name


@dataclasses.dataclass(frozen=True)
class AlignedModules:
  """A Linen module call and the NNX module call aligned with it."""

  linen: ModuleCall
  nnx: ModuleCall
  aligned_by: str  # mapping | name | order | position


def _module_call(call: Call) -> ModuleCall:
  return ModuleCall(call.path, call.index, call.stack, call.layer, call.scanned, call.module_type)


def align_modules(
  linen_module: nn.Module,
  variables: tp.Mapping[str, object],
  linen_args: tuple[object, ...],
  port: nnx.Module,
  port_args: tuple[object, ...],
  *,
  mapping: tp.Mapping[str, str | None] | None = None,
  linen_kwargs: tp.Mapping[str, object] | None = None,
  port_kwargs: tp.Mapping[str, object] | None = None,
) -> list[AlignedModules]:
  """Which NNX module of a port stands for which Linen module, by the calls both models make.

  Both models run once, eagerly (each on its own sample inputs, the user's objects left
  untouched) and their module calls are aligned as `lb.compare` aligns them: `mapping`, then
  equal paths, then call order and output shape. Values only break ties, so a port with its
  own (random) weights aligns too. Calls inside `nn.scan`/`nnx.scan`/vmap bodies come once
  per layer; a list of layers gives each layer its own path.

  Args:
    linen_module: the Linen model.
    variables: its variables (`{'params': ...}`, as `init` returns them).
    linen_args: the Linen model's sample positional inputs.
    port: the NNX port.
    port_args: the port's sample positional inputs.
    mapping: `{linen_path: nnx_path}` pairs to align explicitly (as in `lb.compare`).
    linen_kwargs: keyword inputs of the Linen model.
    port_kwargs: keyword inputs of the port.

  Returns:
    Every aligned pair, in Linen call order: `AlignedModules(linen, nnx, aligned_by)`, each
    side a `ModuleCall` (path, call position, stack, layer, class name).

  Raises:
    CompareError: a model that fails on its inputs, or a mapping path that names no call.

  Examples:
    >>> import jax, jax.numpy as jnp, flax.linen as nn
    >>> from flax import nnx
    >>> class Port(nnx.Module):
    ...   def __init__(self, rngs):
    ...     self.proj = nnx.Linear(2, 3, rngs=rngs)
    ...   def __call__(self, x):
    ...     return self.proj(x)
    >>> class Linen(nn.Module):
    ...   @nn.compact
    ...   def __call__(self, x):
    ...     return nn.Dense(3)(x)
    >>> x = jnp.ones((1, 2))
    >>> variables = Linen().init(jax.random.key(0), x)
    >>> pairs = align_modules(Linen(), variables, (x,), Port(nnx.Rngs(0)), (x,))
    >>> [(p.linen.path, p.nnx.path, p.aligned_by) for p in pairs]
    [('Dense_0', 'proj', 'order'), ('', '', 'name')]
  """
  ref, _ = record(
    "reference", LINEN, (linen_module, dict(variables)), linen_args, dict(linen_kwargs or {})
  )
  cand, _ = record("candidate", NNX, port, port_args, dict(port_kwargs or {}))
  prepare(ref)
  prepare(cand)
  return [
    AlignedModules(_module_call(ref[i]), _module_call(cand[j]), how)
    for i, j, how in align(ref, cand, mapping)
  ]
