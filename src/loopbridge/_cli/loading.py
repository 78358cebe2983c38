"""TARGET arguments: import `package.module:attribute` and build the model it names.

A Linen target (`inspect TARGET`, `compare OLD_TARGET`) is a module instance, a module class
with no required fields, or a function of no arguments returning one. An NNX target
(`compare NEW_TARGET`) is a module instance, or a class or function building one from no
arguments or from `rngs` alone.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import inspect
import os
import sys
import typing as tp

from flax import linen, nnx

from .._core.errors import first_line
from .errors import USAGE_ERROR, CliError


def _required_fields(cls: type[linen.Module]) -> list[str]:
  return [
    f.name
    for f in dataclasses.fields(cls)
    if f.init
    and f.name not in ("parent", "name")
    and f.default is dataclasses.MISSING
    and f.default_factory is dataclasses.MISSING
  ]


def _required_parameters(function: tp.Callable[..., object]) -> list[str] | None:
  """The parameters a call must give, or None when the signature cannot be read."""
  try:
    signature = inspect.signature(function)
  except (TypeError, ValueError):
    return None
  return [
    p.name
    for p in signature.parameters.values()
    if p.default is p.empty
    and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
  ]


# A TARGET written as a file (`models.py:Net`, `src/models.py:Net`) rather than a module.
FILE_NOT_MODULE = (
  "{what} {target!r} names a file, but TARGET names a module as Python imports it: "
  "did you mean {fixed!r}? (drop '.py'; run from the file's directory or put it on PYTHONPATH)"
)
# The attribute is not there; the closest names the module (or class) has.
NO_ATTRIBUTE = "module {module!r} has no attribute {attr!r}"
DID_YOU_MEAN = "; did you mean {fixed!r}?"


def _as_module(module_name: str) -> str | None:
  """`models` for `models.py`, `src.models` for `src/models.py`; None for a module name."""
  if not module_name.endswith(".py"):
    return None
  dotted = module_name.removesuffix(".py").replace("\\", "/").strip("./").replace("/", ".")
  return dotted if all(part.isidentifier() for part in dotted.split(".")) else None


def _closest(name: str, owner: object) -> str | None:
  """The attribute of `owner` a misspelled `name` most likely meant (case first)."""
  names = [n for n in dir(owner) if not n.startswith("_")]
  same_case = [n for n in names if n.lower() == name.lower()]
  if same_case:
    return same_case[0]
  close = difflib.get_close_matches(name, names, n=1, cutoff=0.75)
  return close[0] if close else None


def resolve(target: str, what: str = "TARGET") -> object:
  """Import `package.module:attr` and return the attribute.

  Args:
    target: the command-line text; `attr` may be dotted (`models:Zoo.MLP`).
    what: how messages name the argument (`TARGET`, `OLD_TARGET`, `NEW_TARGET`).

  Raises:
    CliError: malformed text (usage), a module that cannot be imported, raises or calls
      `sys.exit` while importing, or an attribute it lacks.
  """
  module_name, sep, attr = target.partition(":")
  as_module = _as_module(module_name)
  if as_module is not None and attr:
    raise CliError(
      FILE_NOT_MODULE.format(what=what, target=target, fixed=f"{as_module}:{attr}"), USAGE_ERROR
    )
  if (
    not sep
    or not module_name
    or not attr
    or not all(part.isidentifier() for part in module_name.split(".") + attr.split("."))
  ):
    raise CliError(
      f"{what} {target!r} is not of the form package.module:attribute (e.g. mypackage.models:MLP)",
      USAGE_ERROR,
    )
  # Like `python -m`: modules of the current directory are importable.
  if os.getcwd() not in sys.path and "" not in sys.path:
    sys.path.insert(0, os.getcwd())
  try:
    module = importlib.import_module(module_name)
  except ModuleNotFoundError as e:
    if e.name and module_name.startswith(e.name):
      raise CliError(
        f"cannot import module {module_name!r} ({e}); is its directory on PYTHONPATH "
        "or the current directory?"
      ) from e
    raise CliError(f"importing {module_name!r} failed: {type(e).__name__}: {e}") from e
  except Exception as e:  # the module itself raised while importing
    raise CliError(f"importing {module_name!r} failed: {type(e).__name__}: {first_line(e)}") from e
  except SystemExit as e:  # e.g. a script's unguarded `sys.exit(main())`: not a model
    raise CliError(
      f"importing {module_name!r} called sys.exit({e.code!r}), so it defines no model to "
      "inspect. Fix: guard the script part of that module with "
      '`if __name__ == "__main__":`, or point TARGET at a module that only defines the '
      "model"
    ) from None
  obj: object = module
  parts = attr.split(".")
  for i, part in enumerate(parts):
    if not hasattr(obj, part):
      message = NO_ATTRIBUTE.format(module=module_name, attr=attr)
      closest = _closest(part, obj)
      if closest is not None:
        fixed = ".".join([*parts[:i], closest, *parts[i + 1 :]])
        message += DID_YOU_MEAN.format(fixed=f"{module_name}:{fixed}")
      raise CliError(message)
    obj = getattr(obj, part)
  return obj


def load_linen_target(target: str, command: str = "inspect", what: str = "TARGET") -> linen.Module:
  """The Linen module instance a target names (built if it names a class or a function).

  Args:
    target: `package.module:attribute`.
    command: the subcommand, for messages (`inspect`, `compare`).
    what: how messages name the argument.

  Raises:
    CliError: `resolve`'s errors, an NNX module, a class with required fields, a function with
      required parameters, or building the module failed or returned something else.
  """
  obj = resolve(target, what)
  where = f"{target!r}"
  if isinstance(obj, linen.Module):
    return obj
  if isinstance(obj, type) and issubclass(obj, linen.Module):
    missing = _required_fields(obj)
    if missing:
      raise CliError(
        f"{where} is the Linen module class {obj.__name__}, which has required fields "
        f"({', '.join(missing)}); point TARGET at an instance or at a function taking no "
        "arguments that builds one"
      )
    try:
      return obj()
    except Exception as e:
      raise CliError(
        f"{where}: {obj.__name__}() failed: {type(e).__name__}: {first_line(e)}"
      ) from e
  if isinstance(obj, nnx.Module) or (isinstance(obj, type) and issubclass(obj, nnx.Module)):
    raise CliError(
      f"{where} is an NNX module; loopbridge {command} takes a Linen module"
      + (" (the model it wraps with lb.ToNNX)" if command == "inspect" else f" as {what}")
    )
  if callable(obj) and not isinstance(obj, type):
    required = _required_parameters(obj)
    if required:
      raise CliError(
        f"{where} is a function with required parameters ({', '.join(required)}); "
        "TARGET must be a Linen module, a Linen module class, or a function taking no "
        "arguments"
      )
    try:
      result = obj()
    except Exception as e:
      raise CliError(f"{where}: calling it failed: {type(e).__name__}: {first_line(e)}") from e
    if not isinstance(result, linen.Module):
      raise CliError(f"{where} returned a {type(result).__name__}, not a Linen module")
    return result
  raise CliError(
    f"{where} is a {type(obj).__name__}, not a Linen module, a Linen module class or a "
    "function taking no arguments"
  )


def load_nnx_target(target: str, seed: int) -> nnx.Module:
  """The NNX module instance NEW_TARGET names, built with `nnx.Rngs(seed)` if it needs `rngs`.

  Raises:
    CliError: `resolve`'s errors, a Linen module, something that builds no NNX module, or a
      class or function needing arguments other than `rngs`.
  """
  obj = resolve(target, "NEW_TARGET")
  where = f"NEW_TARGET {target!r}"
  if isinstance(obj, nnx.Module):
    return obj
  if isinstance(obj, linen.Module) or (isinstance(obj, type) and issubclass(obj, linen.Module)):
    raise CliError(
      f"{where} is a Linen module; loopbridge compare takes the NNX port as "
      "NEW_TARGET (the Linen original is OLD_TARGET)"
    )
  if not callable(obj):
    raise CliError(
      f"{where} is a {type(obj).__name__}, not an NNX module, an NNX module class "
      "or a function building one"
    )
  # NNX module classes construct through a metaclass taking (*args, **kwargs): read __init__.
  required = _required_parameters(obj.__init__ if isinstance(obj, type) else obj) or []
  if isinstance(obj, type) and required[:1] == ["self"]:
    required = required[1:]
  if required and required != ["rngs"]:
    raise CliError(
      f"{where} needs arguments ({', '.join(required)}); point NEW_TARGET at an "
      "instance, or at a class or function taking no arguments or only `rngs`"
    )
  try:
    result = obj(rngs=nnx.Rngs(seed)) if required else obj()
  except Exception as e:
    raise CliError(f"{where}: building it failed: {type(e).__name__}: {first_line(e)}") from e
  if not isinstance(result, nnx.Module):
    raise CliError(f"{where} returned a {type(result).__name__}, not an NNX module")
  return result
