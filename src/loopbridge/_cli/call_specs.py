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
) -> dict[str, tp.Any]:
  """The keyword inputs with each array spec made into an array (`inputs.sample_inputs`).

  Args:
    items: `(name, value)` pairs as `parse_kwarg` reads them.
    seed: the seed of the arrays.
    reserved: names refused (the sample call's keywords go through `lb.port.draft`'s
      `**sample_kwargs`; a `--call`'s through `lb.port.Call`, which reserves `method` only).

  Raises:
    CliError: (usage) a keyword named in `reserved`.
  """
  out: dict[str, tp.Any] = {}
  for i, (name, value) in enumerate(items):
    if name in reserved:
      raise CliError(
        f"--kwarg {name}=...: {name!r} is a parameter of lb.port.draft itself, so a model "
        f"input of that name cannot be passed (the names taken: {', '.join(DRAFT_PARAMETERS)}; "
        "for the method use --method, or method= inside --call)",
        USAGE_ERROR,
      )
    if isinstance(value, inputs.ArgSpec):
      value = inputs.sample_inputs([value], seed + 1000 + i)[0]
    out[name] = value
  return out
