"""Write the NNX construction of one hoisted attribute (standard layer or user class)."""

from __future__ import annotations

import dataclasses
import inspect
import typing as tp
from functools import partial

from ..plan import standard_layers, unreached_layers
from ..plan.find_sites import Site
from ..plan.hoist import Hoist, match_child
from ..plan.names import available, loop_targets, names_in
from ..plan.source import libcst
from ..trace.trace import Instance
from ..transforms import (
  flag_remat,
  keyword_dicts,
  module_level_remat,
  partitioned_inits,
  qualified_classes,
)
from ..transforms.attention_widths import untaken_width
from ..transforms.call_time_args import call_time_setting, sizes_nothing
from ..transforms.factory_fields import BOUND, bound_keywords
from ..transforms.norm_feature_axes import batch_norm_refused
from .literals import literal

if tp.TYPE_CHECKING:
  import libcst as cst

# The planner (`rewrite_class.Planner`) is passed in; typed loosely so this module stays below it.
Planner = tp.Any


# The key `bind` files a dict chosen by a test under (`**(a if t else b)`, passed on whole).
CHOSEN = "**"


def bind(
  site: Site,
  cls: type,
  dicts: tp.Mapping[str, tp.Any] | None = None,
) -> tuple[dict[str, cst.BaseExpression], str | None]:
  """Linen field -> argument expression of a construction, or an error text.

  `dicts`: the method's locals assigned once from a dict written out (`inits =
  dict(kernel_init=...)`), whose `**inits` binds each of its keys (big_vision's MLP block), or
  from one dict or another chosen by a test, bound whole under `CHOSEN` (big_vision's ViT head;
  `keyword_dicts.py`).
  """
  c = libcst()
  fields = [f.name for f in dataclasses.fields(cls) if f.name not in ("parent", "name")]
  bound: dict[str, cst.BaseExpression] = {}
  given = list(site.node.args)
  if site.partial is not None:
    # partial(Cls, *a, **k)(*b, **j) builds Cls(*a, *b, **k, **j).
    bound_first = list(site.partial.args[1:])
    given = (
      [a for a in bound_first if a.keyword is None]
      + [a for a in given if a.keyword is None]
      + [a for a in bound_first if a.keyword is not None]
      + [a for a in given if a.keyword is not None]
    )
  for i, arg in enumerate(given):
    if arg.star == "**" and isinstance(arg.value, c.Name) and arg.value.value in (dicts or {}):
      found = (dicts or {})[arg.value.value]
      if not isinstance(found, list):
        if CHOSEN in bound:
          return {}, "a construction given two dicts chosen by a test (`**a, **b`)"
        bound[CHOSEN] = found
        continue
      for key, value in found:
        bound[key] = value
      continue
    if arg.star:
      return {}, "a construction with *args/**kwargs (the draft binds arguments one by one)"
    if arg.keyword is None:
      if i >= len(fields):
        return {}, "more positional arguments than the class has fields"
      bound[fields[i]] = arg.value
    elif arg.keyword.value != "name":
      bound[arg.keyword.value] = arg.value
  del c
  return bound, None


def _field_of(cls: type, field: str, kid: Instance) -> object:
  """The traced value of `field` on one element of a list the construction fills.

  A list can hold blocks of several classes, each built by its own branch (diffusers' UNet
  chooses a cross-attention or a plain block per stage): an element of another class was not
  built here, so this construction has no value for it (None; its index never reaches it).
  """
  return getattr(kid.module, field) if isinstance(kid.module, cls) else None


def construction(planner: Planner, hoist: Hoist, index: str | None) -> tuple[str | None, str]:
  """(`nnx.Linear(24, 32, rngs=rngs)`, '') or (None, why it cannot be written)."""
  site = hoist.site
  cls = tp.cast(type, site.target)
  bound, error = bind(site, cls, planner.dict_locals(site.method))
  if error:
    return None, error
  aliases = planner.aliases.get(site.method, {})
  extra = loop_targets(site.loop) | planner.comprehension_targets(site) | set(aliases)
  extra |= planner.scope_names.get(id(site.node), set())
  if site.method == "setup" and site.comp is None:
    # Setup's body runs in `__init__` as written, its loops too: its locals are there at the
    # construction, with the value Linen's setup gave them (vqgan-jax's `block_in`, rebound
    # after each block).
    extra |= planner.setup_locals
  ns = planner.init_namespace
  values: dict[str, str] = {}
  moved: list[str] = []
  settings: list[tuple[str, str]] = []  # (NNX attribute, call-time expression)
  layer = standard_layers.lookup(cls)
  nested = {id(s.node): s for s in planner.sites if s.nested_in is site.node}
  child = planner.ctx.ported.get(cls)
  for field, expr in bound.items():
    code = planner.code(expr)
    if field == CHOSEN:
      # Passed on whole: it may read settings and globals, as `__init__` can, not the call.
      if site.factory_field is not None:
        return None, (
          f"`**` passes a dict chosen by a test ({code}) to a layer built through the field "
          f"{site.factory_field}: write the construction out in each branch by hand"
        )
      if not available(expr, ns, extra):
        return None, (
          f"`**` passes a dict chosen by a test that reads the call ({code}): write the "
          "construction out in each branch by hand"
        )
      values[CHOSEN] = planner.rewrite_expr(code)
      continue
    if child is not None and field in child.dropped:
      continue  # a module factory: the child's port builds its layers itself
    if id(expr) in nested:
      inner, why = _nested(planner, hoist, nested[id(expr)], field, index)
      if inner is None:
        return None, why
      values[field] = inner
    elif (
      layer is not None
      and field in layer.call_time
      and site.outer_call is not None
      and code in ("True", "False")
    ):
      # `nn.Dropout(0.5, deterministic=True)`: frozen by a literal. As a constructor field NNX's
      # `model.train()` would flip it; passed at the call, it stays as Linen runs it.
      moved.append(f"{field}={code}")
    elif available(expr, ns, extra):
      values[field] = planner.rewrite_expr(code)
      planner.used_aliases.update(n for n in names_in(expr) if n in aliases)
    elif layer is not None and field in layer.call_time and site.outer_call is not None:
      moved.append(f"{field}={code}")
    elif layer is not None and sizes_nothing(field):
      # A setting read from the call: set on the layer before each call, never the sample's.
      attr, why = call_time_setting(layer, field, site)
      if attr is None:
        return None, why
      settings.append((attr, planner.rewrite_expr(code)))
    else:
      values[field] = planner.traced(hoist, partial(_field_of, cls, field), field, index)
  if site.factory_field is not None and site.factory_field not in planner.port.dropped:
    # A partial the port keeps: whatever it binds, passed on from it (`BOUND`).
    values[BOUND] = site.factory_field
  elif site.factory_field is not None:
    # `self.conv(8)` with `conv = partial(nn.Conv, use_bias=False)`: what the partial binds is
    # read from the submodule the trace saw.
    for f in dataclasses.fields(cls):
      if f.name in ("parent", "name") or f.name in values or f.name in moved_names(moved):
        continue
      if child is not None and f.name in child.dropped:
        continue  # a module factory of a user class: its port builds those layers itself
      default = f.default if f.default is not dataclasses.MISSING else None
      kids = [k for ks in hoist.children.values() for k in ks]
      if layer is not None and f.name in layer.call_time and site.outer_call is not None:
        # `use_running_average=not train` bound by the parent's partial: the flag is a call
        # argument of this method now, passed by the parent at its call.
        moved.append(f"{f.name}={f.name}")
        planner.port.threaded.setdefault(site.method, {})[f.name] = site.factory_field
        continue
      if kids and any(
        getattr(k.module, f.name) is not default and getattr(k.module, f.name) != default
        for k in kids
      ):
        values[f.name] = planner.traced(
          hoist, lambda k, n=f.name: getattr(k.module, n), f.name, index
        )
  hoist.call_kwargs = moved
  hoist.call_settings = settings
  if layer is None:
    chosen = None
    if CHOSEN in values:
      given = {f for f in values if f != CHOSEN}
      chosen, why = _chosen_for_class(child, cls, values[CHOSEN], given)
      if chosen is None:
        return None, why
    return _user_class(planner, hoist, cls, values, index, chosen), ""
  if layer.nnx_name == "Sequential":
    return _sequential(planner, hoist, index)
  return _standard(planner, hoist, layer, values, index)


def _nested(planner: Planner, hoist: Hoist, inner: Site, field: str, index: str | None):
  """The NNX construction of a module built as another's argument (`nn.RNN(nn.LSTMCell(8))`).

  Linen adopts it where it was built (a sibling, `OptimizedLSTMCell_0`); the trace pairs it by
  the line that called it, as any construction.
  """
  trace = planner.trace
  # The outer module runs it: called where the outer one is (`encoder = nn.RNN(nn.LSTMCell(8))`
  # then `encoder(x)` a line below).
  through = dataclasses.replace(inner, local_lines=[*inner.local_lines, *hoist.site.local_lines])
  children = {
    p: [k for k in trace.children(p) if match_child(through, planner.src, k)]
    for p in hoist.children
  }
  record = Hoist(f"{hoist.attr}_{field}", inner, children, hoist.is_list)
  return construction(planner, record, index)


def _sequential(planner: Planner, hoist: Hoist, index: str | None) -> tuple[str | None, str]:
  """`nn.Sequential([a, f, b])` -> `nnx.Sequential(a', f, b')`, each module built as Linen's
  `layers_i` (i its position in the list; a plain function such as `nn.relu` stays one)."""
  trace = planner.trace
  by_node = {id(s.node): s for s in planner.sites if s.nested_in is hoist.site.node}
  arg = hoist.site.node.args[0].value if hoist.site.node.args else None
  elements = getattr(arg, "elements", None)
  if elements is None:
    return None, "nn.Sequential over something other than a list written out"
  parts = []
  aliases = planner.aliases.get(hoist.site.method, {})
  # Built in a compact method, the layers are the parent's (`Dense_0`, `Dense_1`: made on this
  # line, in list order); built in setup, the Sequential's own (`layers_0`, ...).
  seen: dict[type, int] = {}
  for i, element in enumerate(elements):
    inner = by_node.get(id(element.value))
    if inner is None:
      if not available(element.value, planner.init_namespace, set(aliases)):
        return None, "nn.Sequential over an element that depends on the call"
      parts.append(planner.rewrite_expr(planner.code(element.value)))
      continue
    name = f"layers_{i}"
    nth = seen.get(tp.cast(type, inner.target), 0)
    seen[tp.cast(type, inner.target)] = nth + 1
    children: dict[tuple[str, ...], list[tp.Any]] = {}
    for p, kids in hoist.children.items():
      own = [trace.instances[(*k.path, name)] for k in kids if (*k.path, name) in trace.instances]
      siblings = [k for k in trace.children(p) if match_child(inner, planner.src, k)]
      children[p] = own or siblings[nth : nth + 1]
    code, why = construction(planner, Hoist(f"{hoist.attr}_{name}", inner, children, False), index)
    if code is None:
      return None, why
    parts.append(code)
  return f"nnx.Sequential({', '.join(parts)})", ""


def moved_names(moved: list[str]) -> set[str]:
  return {m.split("=", 1)[0] for m in moved}


def _standard(planner, hoist, layer, values, index) -> tuple[str | None, str]:
  params = layer.parameters()
  known = {p.name for p in params}
  args: dict[str, str] = {}
  kids = [k for ks in hoist.children.values() for k in ks]
  # None of the user's instances made it (a branch): which widths it needs, from another
  # configuration that did (their values come from there too, `Planner.traced`).
  kids = kids or planner.alt_made(hoist)
  widths_seen = layer.widths(kids[0]) if kids else {}
  if (why := untaken_width(layer.nnx_name, widths_seen, known)) is not None:
    return None, why
  if layer.nnx_name == "BatchNorm":
    why = batch_norm_refused(kids, values, hoist.call_kwargs)
    if why is not None:
      return None, why
  given = {layer.renames.get(f, f): f for f in values if f not in layer.consumed}
  overridden: set[str] = set()
  for name in widths_seen:
    field = given.get(name)
    if field is not None and all(
      layer.widths(k).get(name) in (None, getattr(k.module, field, None)) for k in kids
    ):
      continue  # the field the user wrote says the same as the trace: its expression stays
    width = lambda k, n=name: layer.widths(k)[n]  # noqa: E731
    # Where no field explains it, a setup local that equals it everywhere (Dinov2's
    # twice-computed `hidden_features`), rather than an argument or a literal.
    args[name] = planner.traced(
      hoist, width, name, index, fallback=lambda w=width: planner.setup_local_for(hoist, w)
    )
    if field is not None:
      overridden.add(field)
      planner.change(
        hoist.site.lines,
        f"{field}={values[field]}",
        f"{name}={args[name]}",
        f"nn.{layer_name(hoist)} runs at the width of what it is given, not at its {field}=",
      )
  for field, code in values.items():
    if field in layer.consumed or field in overridden or field in (CHOSEN, BOUND):
      continue
    if field in layer.translated:
      how = layer.translated[field]
      more, why = how.translate(code, known)
      if why is not None:
        return None, why
      args.update(more)
      new = ", ".join(f"{k}={v}" for k, v in more.items()) or "(dropped)"
      planner.change(hoist.site.lines, f"{field}={code}", new, how.why)
      continue
    target = layer.renames.get(field, field)
    if target not in known:
      return None, f"nn.{layer_name(hoist)}'s {field}= has no counterpart in nnx.{layer.nnx_name}"
    made = partitioned_inits.variable_of(field)
    if made and partitioned_inits.boxed([*kids, *planner.alt_made(hoist)], "params", made):
      code = partitioned_inits.unboxed_init(planner, code, hoist.site.lines, hoist.site.method)
    args[target] = code
  linen_fields = {f.name: f for f in dataclasses.fields(tp.cast(type, hoist.site.target))}
  for p in params:
    field = linen_fields.get(p.name)
    if field is None or p.name in args or field.default is dataclasses.MISSING:
      continue
    text = literal(field.default)
    if field.default is not None and text is not None and p.default is None:
      # NNX leaves it open (and then demands it); Linen's default is what the model ran with.
      args[p.name] = text
  chosen = None  # `**(a if t else b)`, passed on whole
  if CHOSEN in values:
    chosen, why = _chosen_for_layer(layer, hoist, values[CHOSEN], params, args, widths_seen)
    if chosen is None:
      return None, why
  bound = None
  if BOUND in values:
    written = {*args, *widths_seen, "rngs"}
    bound = bound_keywords(planner, values[BOUND], layer.renames, written)
  if "rngs" in known:
    args["rngs"] = "rngs"
  missing = [
    p.name
    for p in params
    if p.default is inspect.Parameter.empty
    and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    and p.name not in args
  ]
  if missing and not kids:
    # A branch no traced call ran (GPT-2's cross-attention norm): the width of the value the
    # source shows it would be given, where a trace saw that value.
    passed = planner.passed_widths(hoist, layer.widths)
    args.update({n: passed[n] for n in missing if n in passed})
    for n in missing:
      if n in passed:
        planner.change(
          hoist.site.lines,
          f"self.{hoist.site.setup_attr}: no traced call",
          f"{n}={passed[n]}",
          "the width of the value the source shows this layer is given, where a trace saw "
          "that value; translated, not checked (no traced call reached the layer)",
        )
    missing = [n for n in missing if n not in passed]
  added = unreached_layers.optional_widths(planner, hoist, missing) if missing else {}
  args.update(added)
  missing = [n for n in missing if n not in added]
  if missing:
    # HF Wav2Vec2's weight-normed conv is never called (its kernel is read and applied by
    # hand): no trace gives the width NNX needs at construction.
    return None, (
      f"nnx.{layer.nnx_name} needs {', '.join(missing)}, which Linen reads from the layer's "
      "input, and no traced call reached this layer; pass it by hand"
    )
  parts: list[str] = []
  positional = True
  for p in params:
    if p.name not in args:
      if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
        positional = False
      continue
    if positional and p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
      parts.append(args[p.name])
    else:
      positional = False
      parts.append(f"{p.name}={args[p.name]}")
  parts += [p for p in (chosen, bound) if p is not None]
  hoist.post = []
  if layer.nnx_name == "MultiHeadAttention" and index is None:
    kids = [k[0] for k in hoist.children.values() if k]
    if kids and any(getattr(k.module, "decode", False) for k in kids):
      # Linen sizes the decode cache by the input of an init; NNX by `init_cache(shape)`,
      # which the class's own `init_cache` method calls (`cache_idiom.py`): no size from
      # the sample is baked into __init__.
      planner.ctx.caches.setdefault(planner.port.cls, []).append((hoist.attr, "attention"))
  if layer.helper:
    planner.ctx.helpers.add(layer.nnx_name)
  code = f"{layer.code_name}({', '.join(parts)})"
  return (unreached_layers.when_given(code, added) if added else code), ""


def _chosen_for_layer(layer, hoist, code, params, args, widths) -> tuple[str | None, str]:
  """`**(...)` passing a dict chosen by a test to an NNX layer, each key spelled as NNX spells
  it; or (None, why) for a key the draft cannot pass on that way."""
  node = keyword_dicts.chosen(libcst().parse_expression(code))
  if node is None:
    return None, f"`**` passes a dict chosen by a test the draft cannot read ({code})"
  required = {p.name for p in params if p.default is inspect.Parameter.empty}
  known = {p.name for p in params}
  spelling: dict[str, str] = {}
  for key in keyword_dicts.keys(node):
    target = layer.renames.get(key, key)
    if target not in known:
      return None, (
        f"nn.{layer_name(hoist)}'s {key}=, passed in a dict chosen by a test, has no "
        f"counterpart in nnx.{layer.nnx_name}: write the construction out by hand"
      )
    if (
      key in layer.consumed
      or key in layer.translated
      or key in layer.call_time
      or target in args
      or target in widths
      or target in required
    ):
      return None, (
        f"{key}=, passed in a dict chosen by a test, is an argument the draft writes itself "
        f"for nnx.{layer.nnx_name} (a width, a call-time flag, or one written out): write "
        "the construction out in each branch by hand"
      )
    spelling[key] = target
  return f"**({keyword_dicts.respelled(code, spelling)})", ""


def _chosen_for_class(child_port, cls, code, given) -> tuple[str | None, str]:
  """`**(...)` passing a dict chosen by a test to a drafted class, whose `__init__` takes its
  Linen fields by name; or (None, why)."""
  node = keyword_dicts.chosen(libcst().parse_expression(code))
  if node is None:
    return None, f"`**` passes a dict chosen by a test the draft cannot read ({code})"
  fields = {f.name for f in dataclasses.fields(cls)} - {"parent", "name"}
  for key in keyword_dicts.keys(node):
    if key not in fields or key in child_port.dropped or key in given:
      return None, (
        f"{key}=, passed to {cls.__name__} in a dict chosen by a test, is no argument its "
        "port takes by that name: write the construction out in each branch by hand"
      )
  return f"**({code})", ""


def layer_name(hoist: Hoist) -> str:
  return tp.cast(type, hoist.site.target).__name__


def _user_class(planner, hoist, cls, values, index, chosen: str | None) -> str:
  """`chosen`: a `**(...)` dict chosen by a test (`_chosen_for_class`), or None."""
  site = hoist.site
  parts: list[str] = []
  fields = [f.name for f in dataclasses.fields(cls) if f.name not in ("parent", "name")]
  positional = [a for a in site.node.args if a.keyword is None and not a.star]
  child_port = planner.ctx.ported[cls]
  by_keyword = False
  for i, _ in enumerate(positional):
    if fields[i] in child_port.dropped:
      by_keyword = True  # the child's port has no such argument (a module factory)
      continue
    parts.append(f"{fields[i]}={values[fields[i]]}" if by_keyword else values[fields[i]])
  for arg in site.node.args:
    keyword = arg.keyword.value if arg.keyword is not None else None
    if keyword is not None and keyword != "name" and keyword not in child_port.dropped:
      parts.append(f"{keyword}={values[keyword]}")
  named = {f for f, _ in zip(fields, positional)} | {
    a.keyword.value for a in site.node.args if a.keyword is not None
  }
  if BOUND in values:  # a kept partial's keywords, passed on whole
    written = named | set(child_port.resolver.extras) | {"rngs"}
    parts.append(bound_keywords(planner, values[BOUND], {}, written))
  # What a partial binds (a module-level partial, or one a field holds): by keyword.
  parts += [
    f"{f}={values[f]}"
    for f in fields
    if f in values and f not in named and f not in child_port.dropped
  ]
  for extra in tp.cast(tp.Any, child_port.resolver).extras.values():
    # An instance without a value never reads the argument (say, the input width of a layer
    # it does not build: the added bool that guards it is False there): None.
    code = planner.traced(hoist, lambda k, e=extra: e.value_of(k), extra.name, index)
    if code != extra.default:  # a width left at None leaves its layer unbuilt: not written
      parts.append(f"{extra.name}={code}")
  if chosen is not None:
    parts.append(chosen)
  parts.append("rngs=rngs")
  if planner.ctx.caches.get(cls):  # its port has decode caches: this class sizes them too
    kind = "list" if hoist.is_list else "module"
    if (hoist.attr, kind) not in planner.ctx.caches.setdefault(planner.port.cls, []):
      planner.ctx.caches[planner.port.cls].append((hoist.attr, kind))
  # Through a lift or a field holding the class (`self.block_cls(...)`): the drafted class.
  drafted = site.lift is not None or site.factory_field is not None
  func = cls.__name__ if drafted else planner.code(site.node.func)
  for rewrite, why in (
    (qualified_classes.drafted_name, qualified_classes.WHY),
    (flag_remat.inlined, flag_remat.WHY),
    (module_level_remat.construction, module_level_remat.WHY),
  ):
    better = None if drafted else rewrite(planner, site, cls)
    if better is not None:
      planner.change(site.lines, func, better, why)
      func = better
      break
  return f"{func}({', '.join(parts)})"
