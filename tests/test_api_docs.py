"""Every public name is documented, its example is a doctest, and docs/api.md is up to date.

The rule, per name in `loopbridge.__all__`:
- exception and warning types: a docstring (one line suffices);
- other classes: a one-line summary, an `Args:` section when the class defines a constructor
  taking arguments (dataclass-generated constructors of result types are exempt), and an
  `Example:` section holding a doctest (`>>>`);
- functions: a one-line summary, `Args:` when they take arguments, `Returns:`, `Raises:` when the
  function's own body contains a `raise` statement, and an `Example:` doctest.
The doctests themselves run through pytest's `--doctest-modules` over `src/loopbridge` (checked
below), so an example that stops working fails the suite.
"""

from __future__ import annotations

import ast
import dataclasses
import doctest
import importlib.util
import inspect
import pathlib
import textwrap

import pytest

import loopbridge

ROOT = pathlib.Path(__file__).resolve().parents[1]
PUBLIC = sorted(loopbridge.__all__)


def _sections(doc: str) -> set[str]:
  return {line.strip()[:-1] for line in doc.splitlines()
          if line.strip().endswith(":") and line.strip()[:-1].isalpha()}


def _takes_arguments(fn) -> bool:
  params = list(inspect.signature(fn).parameters.values())
  if params and params[0].name in ("self", "cls"):
    params = params[1:]
  return bool(params)


def _raises_itself(fn) -> bool:
  """Whether the function's own body (not nested functions) has a `raise` statement."""
  try:
    source = textwrap.dedent(inspect.getsource(fn))
  except (OSError, TypeError):
    return False
  tree = ast.parse(source)
  func = tree.body[0]

  def visit(node) -> bool:
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
        continue
      if isinstance(child, ast.Raise) or visit(child):
        return True
    return False

  return visit(func)


def _problems(name: str) -> list[str]:
  obj = getattr(loopbridge, name)
  doc = inspect.getdoc(obj)
  if not doc or not doc.strip():
    return ["no docstring"]
  if isinstance(obj, type) and issubclass(obj, BaseException):
    return []  # exception / warning types: the one-line docstring is the documentation
  problems = []
  summary = doc.split("\n\n", 1)[0]
  if not summary.strip():
    problems.append("no one-line summary")
  sections = _sections(doc)
  if isinstance(obj, type):
    init = vars(obj).get("__init__")
    if (init is not None and not dataclasses.is_dataclass(obj) and _takes_arguments(init)
        and "Args" not in sections):
      problems.append("constructor takes arguments but the docstring has no Args: section")
  else:
    if _takes_arguments(obj) and "Args" not in sections:
      problems.append("no Args: section")
    if "Returns" not in sections:
      problems.append("no Returns: section")
    if _raises_itself(obj) and "Raises" not in sections:
      problems.append("raises, but the docstring has no Raises: section")
  if "Example" not in sections and "Examples" not in sections:
    problems.append("no Example: section")
  else:
    example = doc.split("Example", 1)[1]
    if not doctest.DocTestParser().get_examples(example):
      problems.append("the Example: section holds no doctest (>>> lines)")
  return problems


@pytest.mark.parametrize("name", PUBLIC)
def test_public_name_is_documented(name: str):
  problems = _problems(name)
  assert not problems, f"lb.{name}: " + "; ".join(problems)


def test_all_is_sorted_and_exported():
  assert list(loopbridge.__all__) == sorted(loopbridge.__all__)
  missing = [n for n in loopbridge.__all__ if not hasattr(loopbridge, n)]
  assert not missing


def test_the_rule_catches_an_undocumented_function():
  def f(x):
    if x:
      raise ValueError(x)
    return x

  loopbridge.__dict__["_probe"] = f
  try:
    f.__doc__ = "Summary only."
    assert _problems("_probe") == ["no Args: section", "no Returns: section",
                                   "raises, but the docstring has no Raises: section",
                                   "no Example: section"]
    f.__doc__ = "Summary.\n\nArgs:\n  x: x.\n\nReturns:\n  x.\n\nExample:\n  nothing here\n"
    assert _problems("_probe") == ["raises, but the docstring has no Raises: section",
                                   "the Example: section holds no doctest (>>> lines)"]
    f.__doc__ = None
    assert _problems("_probe") == ["no docstring"]
  finally:
    del loopbridge.__dict__["_probe"]


def test_doctests_are_collected_by_pytest():
  """The examples only count if pytest runs them: --doctest-modules over src/loopbridge."""
  config = (ROOT / "pyproject.toml").read_text()
  assert "--doctest-modules" in config and '"src/loopbridge"' in config


def _gen_api():
  spec = importlib.util.spec_from_file_location("gen_api", ROOT / "tools" / "gen_api.py")
  assert spec is not None and spec.loader is not None
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_api_reference_is_up_to_date():
  expected = _gen_api().render()
  current = (ROOT / "docs" / "api.md").read_text()
  assert current == expected, "docs/api.md is out of date: run python tools/gen_api.py"
  for name in loopbridge.__all__:
    assert f"### lb.{name}\n" in current
