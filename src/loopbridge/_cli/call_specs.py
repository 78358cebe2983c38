"""Keyword inputs and whole calls on the command line: `--kwarg NAME=VALUE` and `--call SPEC`.

A keyword value is a Python literal (`True`, `3`, `0.5`, `'relu'`, `None`) or an array spec as
`--arg` takes it (`float32[1,16]`). A `--call` is one string of whitespace-separated items, the
positional inputs as `--arg` specs in order and keyword inputs as `NAME=VALUE`; the item
`method=NAME` chooses the Linen method: `--call 'float32[2,24] train=True'`,
`--call 'method=generate float32[3,8]'`.
"""

from __future__ import annotations

import ast
import dataclasses
import re
import typing as tp

from . import inputs
from .errors import USAGE_ERROR, CliError

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CALL_EXAMPLE = "e.g. --call 'float32[2,24] train=True' or --call 'method=generate float32[3,8]'"


@dataclasses.dataclass(frozen=True)
class CallSpec:
  """One call from the command line: positional array specs, keyword values, the method.

  Keyword values are Python literals or `inputs.ArgSpec` (an array made from the seed).

  Examples:
    >>> str(parse_call_spec("method=generate float32[3,8] scale=0.5"))
    'method=generate float32[3,8] scale=0.5'
  """

  args: tuple[inputs.ArgSpec, ...]
  kwargs: tuple[tuple[str, object], ...] = ()
  method: str | None = None

  def __str__(self) -> str:
    items = [f"method={self.method}"] if self.method else []
    items += [str(a) for a in self.args]
    items += [f"{k}={v if isinstance(v, inputs.ArgSpec) else repr(v)}" for k, v in self.kwargs]
    return " ".join(items)


def parse_kwarg(text: str, option: str = "--kwarg") -> tuple[str, object]:
  """Read one `NAME=VALUE` keyword input.

  Args:
    text: e.g. `'train=False'`, `'temperature=0.7'`, `'mask=bool[2,8]'`.
    option: how messages name where it came from.

  Returns:
    The name and the value: a Python literal, or an `inputs.ArgSpec` for an array.

  Raises:
    CliError: (usage) no `=`, a name that is not an identifier, or a value that is neither a
      Python literal nor an array spec.

  Examples:
    >>> parse_kwarg("train=False")
    ('train', False)
    >>> parse_kwarg("mask=bool[2,8]")
    ('mask', ArgSpec(dtype='bool', shape=(2, 8)))
  """
  name, sep, value = text.partition("=")
  name, value = name.strip(), value.strip()
  if not sep or not _NAME_RE.match(name) or not value:
    raise CliError(
      f"{option} {text!r}: expected NAME=VALUE, e.g. 'train=False', 'temperature=0.7' or "
      "'mask=bool[2,8]'",
      USAGE_ERROR,
    )
  if "[" in value and value.endswith("]"):
    return name, inputs.parse_arg_spec(value)
  try:
    return name, ast.literal_eval(value)
  except (ValueError, SyntaxError):
    raise CliError(
      f"{option} {text!r}: {value!r} is not a Python literal (True, 3, 0.5, 'text', None) "
      "or an array spec such as 'float32[1,16]'; quote a string value: "
      f"{name}=\"'{value}'\"",
      USAGE_ERROR,
    ) from None


def parse_call_spec(text: str) -> CallSpec:
  """Read one `--call`: array specs (positional, in order), `NAME=VALUE`, `method=NAME`.

  Raises:
    CliError: (usage) an empty call, a malformed item, `method=` twice or not a name, a
      keyword given twice, or a positional input after a keyword one.

  Examples:
    >>> spec = parse_call_spec("float32[2,24] train=True")
    >>> spec.args, spec.kwargs, spec.method
    ((ArgSpec(dtype='float32', shape=(2, 24)),), (('train', True),), None)
  """
  items = text.split()
  if not items:
    raise CliError(f"--call {text!r} is empty; {CALL_EXAMPLE}", USAGE_ERROR)
  args: list[inputs.ArgSpec] = []
  kwargs: dict[str, object] = {}
  method = None
  for item in items:
    name, sep, value = item.partition("=")
    if sep and "[" not in name:
      if name == "method":
        if method is not None or not _NAME_RE.match(value):
          raise CliError(
            f"--call {text!r}: method= names one Linen method once, e.g. method=generate",
            USAGE_ERROR,
          )
        method = value
        continue
      key, val = parse_kwarg(item, option="--call")
      if key in kwargs:
        raise CliError(f"--call {text!r}: keyword {key!r} given twice", USAGE_ERROR)
      kwargs[key] = val
      continue
    if kwargs:
      raise CliError(
        f"--call {text!r}: positional input {item!r} after a keyword one; write the array "
        f"specs first; {CALL_EXAMPLE}",
        USAGE_ERROR,
      )
    try:
      args.append(inputs.parse_arg_spec(item))
    except CliError as e:
      raise CliError(f"--call {text!r}: {e}; {CALL_EXAMPLE}", USAGE_ERROR) from None
  return CallSpec(tuple(args), tuple(kwargs.items()), method)


# Keyword parameters of `lb.port.draft` itself: a model input of one of these names cannot be
# passed through its `**sample_kwargs`.
DRAFT_PARAMETERS = ("method", "calls", "variables", "check")


def keyword_values(
  items: tp.Sequence[tuple[str, object]],
  seed: int,
  reserved: tp.Collection[str] = DRAFT_PARAMETERS,
  owner: str = "lb.port.draft",
) -> dict[str, tp.Any]:
  """The keyword inputs with each array spec made into an array (`inputs.sample_inputs`).

  Args:
    items: `(name, value)` pairs as `parse_kwarg` reads them.
    seed: the seed of the arrays.
    reserved: names refused (the sample call's keywords go through `lb.port.draft`'s
      `**sample_kwargs`; a `--call`'s through `lb.port.Call`, which reserves `method` only).
    owner: the function whose parameters those are, for the message.

  Raises:
    CliError: (usage) a keyword named in `reserved`.
  """
  out: dict[str, tp.Any] = {}
  for i, (name, value) in enumerate(items):
    if name in reserved:
      raise CliError(
        f"--kwarg {name}=...: {name!r} is a parameter of {owner} itself, so a model input "
        f"of that name cannot be passed (the names taken: {', '.join(reserved)}; for the "
        "method use --method, or method= inside --call)",
        USAGE_ERROR,
      )
    if isinstance(value, inputs.ArgSpec):
      value = inputs.sample_inputs([value], seed + 1000 + i)[0]
    out[name] = value
  return out


@dataclasses.dataclass(frozen=True)
class SampleCall:
  """The sample call of a subcommand, as the shared options give it (`read_call`).

  `specs` are the positional inputs (`--arg`), `kwarg_items` the keyword ones (`--kwarg`, as
  `parse_kwarg` reads them), `method` the Linen method (`--method`), `calls` the further
  calls (`--call`, where the subcommand takes them).
  """

  specs: tuple[inputs.ArgSpec, ...]
  kwarg_items: tuple[tuple[str, object], ...] = ()
  method: str | None = None
  calls: tuple[CallSpec, ...] = ()

  def args(self, seed: int) -> list[tp.Any]:
    """The positional inputs made from the seed (`inputs.sample_inputs`)."""
    return inputs.sample_inputs(self.specs, seed)

  def kwargs(
    self, seed: int, reserved: tp.Collection[str] = (), owner: str = "lb.port.draft"
  ) -> dict[str, tp.Any]:
    """The keyword inputs, array specs made from the seed (`keyword_values`)."""
    return keyword_values(self.kwarg_items, seed, reserved=reserved, owner=owner)

  def described(self) -> str:
    """The call as options, e.g. `--arg float32[2,4] --kwarg train=False` (or `no inputs`)."""
    items = [f"--arg {s}" for s in self.specs]
    items += [
      f"--kwarg {k}={v if isinstance(v, inputs.ArgSpec) else repr(v)}" for k, v in self.kwarg_items
    ]
    items += [f"--method {self.method}"] if self.method else []
    return " ".join(items) or "no inputs"

  def check_method(self, model: object, what: str) -> None:
    """Raises CliError (usage) when `model` has no method `--method` (or a `--call`'s)."""
    wanted = [(self.method, "--method")] + [(c.method, f"--call {c}") for c in self.calls]
    for method, option in wanted:
      if method is not None and not callable(getattr(model, method, None)):
        raise CliError(f"{what}{type(model).__name__} has no method {method!r} ({option})")


def read_call(ns: tp.Any, default_args: tp.Sequence[str] = ()) -> SampleCall:
  """Read the shared call options (`options.add_call_options`) of a parsed command line.

  Args:
    ns: the parsed namespace (`args`, `kwargs`, `method`, and `calls` where registered).
    default_args: the `--arg` specs used when none is given.

  Raises:
    CliError: (usage) a malformed `--arg`, `--kwarg` or `--call`.
  """
  return SampleCall(
    specs=tuple(inputs.parse_arg_spec(t) for t in (ns.args or default_args)),
    kwarg_items=tuple(parse_kwarg(t) for t in (ns.kwargs or [])),
    method=ns.method,
    calls=tuple(parse_call_spec(t) for t in (getattr(ns, "calls", None) or [])),
  )


# Python's message for a call that lacks arguments: "f() missing 1 required keyword-only
# argument: 'train'", "missing 2 required positional arguments: 'x' and 'mask'".
_MISSING = re.compile(
  r"missing \d+ required (?P<kind>keyword-only |positional )?arguments?: (?P<names>.+)$"
)


def missing_argument_hint(error: BaseException) -> str:
  """The options to add when `error` says the sample call lacks arguments; '' otherwise.

  Examples:
    >>> missing_argument_hint(TypeError("f() missing 1 required keyword-only argument: 'train'"))
    ' Fix: add --kwarg train=... (e.g. --kwarg train=False).'
  """
  found = None
  current: BaseException | None = error
  for _ in range(8):  # the TypeError itself, or one a command's own error came from
    if current is None:
      return ""
    lines = str(current).strip().splitlines()
    found = _MISSING.search(lines[0]) if isinstance(current, TypeError) and lines else None
    if found is not None:
      break
    current = current.__cause__ or current.__context__
  if found is None:
    return ""
  names = re.findall(r"'(\w+)'", found["names"])
  if not names:
    return ""
  if found["kind"] == "positional ":
    return (
      f" Fix: add one --arg DTYPE[DIMS] per positional input, in order (missing: "
      f"{', '.join(names)}), e.g. --arg float32[1,16]."
    )
  options = " ".join(f"--kwarg {n}=..." for n in names)
  example = " ".join(f"--kwarg {n}={_EXAMPLE_VALUES.get(n, 'VALUE')}" for n in names)
  return f" Fix: add {options} (e.g. {example})."


# Keyword inputs most Linen models take as flags, with their evaluation value: a hint's example.
_EXAMPLE_VALUES = {
  "train": "False",
  "training": "False",
  "is_training": "False",
  "deterministic": "True",
  "use_running_average": "True",
  "decode": "False",
}
