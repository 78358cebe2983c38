"""A submodule Linen builds in setup that no traced configuration calls.

HF's heads build their base model with a flag that turns one of its layers off
(`FlaxBertModule(config, add_pooling_layer=False)` in `...ForMaskedLM`, `...ForCausalLM`,
`...ForQuestionAnswering`, ...), while the base model's setup still assigns the layer::

  self.pooler = FlaxBertPooler(self.config, dtype=self.dtype)
  ...
  pooled = self.pooler(hidden_states) if self.add_pooling_layer else None

Linen builds a setup attribute lazily: never called, it has no weights. NNX builds every
attribute in `__init__`, so the port would need the layer's widths, which no trace shows. The
port builds nothing there: a `NeverCalled` (the draft's helper) stands in the attribute's
place and raises, naming the layer and the fix, if a configuration no trace reached calls it.
Stood in for: a user class no trace built, and a flax layer (ALBERT's pooler `nn.Dense`) no
traced call reached, each assigned to one setup attribute outside loops and lifts, which the
class only ever calls, under a test of its settings alone. A layer whose kernel is read or
which is applied with given params (a weight-normed conv), or one a call argument gates, stays
a TODO, as does anything else the trace did not reach.

Hooks: `ClassPlanner._plan_construct` (the plan) and `Rewriter.leave_Call` (the code).
"""

from __future__ import annotations

import typing as tp

from ..plan import standard_layers
from ..plan.names import names_in
from ..plan.source import dotted, libcst

WHY = "called in no traced configuration: no weights, not ported; raises if called"


def _one_setup_attribute(site: tp.Any) -> bool:
  return (
    site.method == "setup"
    and site.setup_attr is not None
    and not site.setup_list
    and site.list_attr is None
    and site.loop is None
    and site.lift is None
  )


def only_called_under_settings(planner: tp.Any, attr: str) -> bool:
  """`self.<attr>` appears in the source once assigned and otherwise only called, each call
  under an `if` (or `a if t else b`) testing the module's settings alone (`self.add_pooling`).
  A setting of the class is flipped in the configurations the draft derives, and one its parent
  sets is the same in every call, so no configuration left untraced reaches such a call; a call
  under a test of the call's arguments (`if context is not None`) is reached by another call,
  and stays a TODO."""
  c = libcst()
  name = f"self.{attr}"
  uses: list[tp.Any] = []
  calls: list[tp.Any] = []

  class Uses(c.CSTVisitor):
    def visit_Attribute(self, node: tp.Any) -> None:
      if dotted(node) == name:
        uses.append(node)

    def visit_Call(self, node: tp.Any) -> None:
      if dotted(node.func) == name:
        calls.append(node)

  planner.module.visit(Uses())
  return (
    bool(calls)
    and len(uses) == len(calls) + 1
    and all(_under_settings(planner, call) for call in calls)
  )


def _under_settings(planner: tp.Any, node: tp.Any) -> bool:
  c = libcst()
  child, parent = node, planner.parents.get(node)
  while parent is not None and not isinstance(parent, c.FunctionDef):
    test = None
    if (isinstance(parent, c.If) and child is parent.body) or (
      isinstance(parent, c.IfExp) and child is parent.body
    ):
      test = parent.test
    if test is not None and names_in(test) == {"self"}:
      return True
    child, parent = parent, planner.parents.get(parent)
  return False


def plan_never_called(planner: tp.Any, site: tp.Any, cls: type) -> bool:
  """Stand a `NeverCalled` in for the construction at `site`, if it qualifies (see above):
  a user class or a flax layer with an NNX counterpart, no traced instance of the class
  having called it."""
  if (
    not _one_setup_attribute(site)
    or (standard_layers.is_linen_layer(cls) and cls not in standard_layers.TABLE)
    or any(planner.made_by(site, inst, planner.trace) for inst in planner.instances)
    or any(planner._made_elsewhere(site))  # another configuration called it: ported from there
    or not only_called_under_settings(planner, site.setup_attr)
  ):
    return False
  line = planner.src.line(site.lines[0])
  planner.never_called[id(site.node)] = (
    f"{cls.__qualname__} (built at {planner.src.file}:{line}) was called in no configuration "
    "the draft traced, so it was not ported: port it by hand, or draft again with "
    "draft(configs=[...]) holding an instance whose call reaches it"
  )
  planner.ctx.helpers.add("NeverCalled")
  return True


def never_called_code(planner: tp.Any, original: tp.Any) -> str | None:
  """The port's code for a construction `plan_never_called` took, or None."""
  why = planner.never_called.get(id(original))
  if why is None:
    return None
  planner.change(planner.site_of[id(original)].lines, planner.code(original), "NeverCalled", WHY)
  return f"NeverCalled({why!r})"
