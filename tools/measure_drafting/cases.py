"""The data a measured class is described by: where its source is, two settings, their inputs.

A `Case` names one Linen class in one public repository at one commit and two `Setting`s of
it: `first`, the instance and sample call the drafter is given, and `second`, another
instance (every width, tuple and config field changed) the drafted port must also equal
Linen at, built from the draft with no edits. Values that must be built inside the case's
own checkout (a config object, an enum member) are written as `Ref` / `Obj`, so that these
files import nothing from the measured repositories.
"""

from __future__ import annotations

import dataclasses
import importlib
import typing as tp

import numpy as np

# The sets of cases pinned to repositories at commits (each a module of this folder).
PINNED_SETS = (
  "holdout",
  "holdout_b",
  "holdout_c",
  "holdout_d",
  "holdout_e",
  "holdout_f",
  "holdout_g",
  "holdout_h",
  "tuning",
)


@dataclasses.dataclass(frozen=True)
class Arr:
  """A random normal float array of this shape (a fresh draw per seed)."""

  shape: tuple[int, ...]
  dtype: str = "float32"


@dataclasses.dataclass(frozen=True)
class Ints:
  """A random integer array in [low, high) (token ids, labels)."""

  shape: tuple[int, ...]
  high: int
  dtype: str = "int32"
  low: int = 0


@dataclasses.dataclass(frozen=True)
class Ones:
  """An array of ones (attention masks): the same for every seed."""

  shape: tuple[int, ...]
  dtype: str = "int32"


@dataclasses.dataclass(frozen=True)
class Positions:
  """Positions 0..shape[-1]-1 along the last axis, broadcast to `shape` (segment positions)."""

  shape: tuple[int, ...]
  dtype: str = "int32"


@dataclasses.dataclass(frozen=True)
class Ref:
  """An object imported from the case's checkout: 'package.module:Attr.attr'."""

  target: str


@dataclasses.dataclass(frozen=True)
class Obj:
  """`Ref(target)` called with these arguments (a config object, a partial)."""

  target: str
  kwargs: dict[str, tp.Any] = dataclasses.field(default_factory=dict)
  args: tuple[tp.Any, ...] = ()


@dataclasses.dataclass(frozen=True)
class Setting:
  """One instance of the class (`fields`) and one call of it (`args`, `kwargs`, `method`)."""

  fields: dict[str, tp.Any]
  args: tuple[tp.Any, ...] = ()
  kwargs: dict[str, tp.Any] = dataclasses.field(default_factory=dict)
  method: str | None = None


@dataclasses.dataclass(frozen=True)
class Case:
  """One measured class.

  Attributes:
    name: a short unique label (`--only` takes it).
    repo: 'owner/name' on GitHub; '' for a class of an installed package (HF transformers).
    commit: the commit its source is taken at ('' for an installed package: `version`).
    module: the dotted module the class is imported from.
    cls: the class name.
    first: the drafted instance and its sample call.
    second: the other instance the port must equal Linen at, with its call.
    path: the folder inside the checkout that goes on `sys.path` ('' for its root).
    kind: what sort of layer it is (for the table).
    version: the installed package version an installed-package case was chosen at.
  """

  name: str
  repo: str
  commit: str
  module: str
  cls: str
  first: Setting
  second: Setting
  path: str = ""
  kind: str = ""
  version: str = ""

  @property
  def checkout_dir(self) -> str:
    """The folder name of the case's exported tree under `--checkouts`."""
    return self.repo.replace("/", "+")


def resolve_ref(target: str) -> tp.Any:
  """Import 'package.module:Attr.attr' and return the attribute."""
  module_name, _, attr_path = target.partition(":")
  value: tp.Any = importlib.import_module(module_name)
  for part in filter(None, attr_path.split(".")):
    value = getattr(value, part)
  return value


def build_value(spec: tp.Any) -> tp.Any:
  """A field value: `Ref` / `Obj` built, containers built element by element."""
  if isinstance(spec, Ref):
    return resolve_ref(spec.target)
  if isinstance(spec, Obj):
    args = tuple(build_value(a) for a in spec.args)
    kwargs = {k: build_value(v) for k, v in spec.kwargs.items()}
    return resolve_ref(spec.target)(*args, **kwargs)
  if isinstance(spec, tuple):
    return tuple(build_value(v) for v in spec)
  if isinstance(spec, list):
    return [build_value(v) for v in spec]
  if isinstance(spec, dict):
    return {k: build_value(v) for k, v in spec.items()}
  return spec


def build_input(spec: tp.Any, seed: int) -> tp.Any:
  """A call argument: arrays drawn from `seed` (numpy, so no accelerator is touched)."""
  rng = np.random.default_rng(seed)
  return _build_input(spec, rng)


def _build_input(spec: tp.Any, rng: np.random.Generator) -> tp.Any:
  import jax.numpy as jnp

  if isinstance(spec, Arr):
    return jnp.asarray(rng.standard_normal(spec.shape), dtype=spec.dtype)
  if isinstance(spec, Ints):
    return jnp.asarray(rng.integers(spec.low, spec.high, size=spec.shape), dtype=spec.dtype)
  if isinstance(spec, Ones):
    return jnp.ones(spec.shape, dtype=spec.dtype)
  if isinstance(spec, Positions):
    return jnp.broadcast_to(jnp.arange(spec.shape[-1], dtype=spec.dtype), spec.shape)
  if isinstance(spec, (Ref, Obj)):
    return build_value(spec)
  if isinstance(spec, tuple):
    return tuple(_build_input(v, rng) for v in spec)
  if isinstance(spec, list):
    return [_build_input(v, rng) for v in spec]
  if isinstance(spec, dict):
    return {k: _build_input(v, rng) for k, v in spec.items()}
  return spec


def build_call(setting: Setting, seed: int) -> tuple[tuple[tp.Any, ...], dict[str, tp.Any]]:
  """The setting's positional and keyword inputs, arrays drawn from `seed`."""
  rng = np.random.default_rng(seed)
  args = tuple(_build_input(a, rng) for a in setting.args)
  kwargs = {k: _build_input(v, rng) for k, v in setting.kwargs.items()}
  return args, kwargs


def input_dims(spec: tp.Any) -> list[tuple[str, int]]:
  """Every (position label, size) of the arrays in a call spec, in order."""
  out: list[tuple[str, int]] = []

  def walk(value: tp.Any, label: str) -> None:
    if isinstance(value, (Arr, Ints, Ones, Positions)):
      out.extend((f"{label}.shape[{i}]", d) for i, d in enumerate(value.shape))
    elif isinstance(value, (tuple, list)):
      for i, v in enumerate(value):
        walk(v, f"{label}[{i}]")
    elif isinstance(value, dict):
      for k, v in value.items():
        walk(v, f"{label}[{k!r}]")

  walk(spec, "")
  return out


def by_name(cases: tp.Sequence[Case]) -> dict[str, Case]:
  """The cases keyed by name; refuses a repeated name."""
  named: dict[str, Case] = {}
  for case in cases:
    if case.name in named:
      raise ValueError(f"two cases are named {case.name!r}; names must be unique")
    named[case.name] = case
  return named
