"""One table: each standard Linen layer, its NNX counterpart and how its arguments carry over.

A Linen field keeps its name in NNX unless `renames` says otherwise; what NNX needs and Linen
infers from the input (an input width) comes from the traced call (`widths`); a field NNX
takes at call time (`Dropout.deterministic`) moves to the call when it names call-time values.
A field that NNX has no parameter for is never dropped: the construction becomes a TODO.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing as tp

import jax
from flax import linen as nn
from flax import nnx

from ..trace.trace import Instance, size
from ..transforms.attention_widths import cross_attention_widths, self_attention_widths
from ..transforms.norm_feature_axes import batch_norm_widths, layer_norm_widths
from ..transforms.rnn_rngs import WHY as SPLIT_RNGS_WHY
from ..transforms.rnn_rngs import split_rngs

Widths = tp.Callable[[Instance], dict[str, object]]


def _last(param: str) -> Widths:
  return lambda inst: {param: inst.width()}


def _dense_general(inst: Instance) -> dict[str, object]:
  axis = getattr(inst.module, "axis", -1)
  call = inst.inputs.get("__call__")
  shape: tp.Any = getattr(call[0][0], "shape", ()) if call else ()
  if isinstance(axis, int):
    return {"in_features": size(shape[axis])}
  return {"in_features": tuple(size(shape[a]) for a in axis)}


def _einsum_bias(inst: Instance) -> dict[str, object]:
  # Linen infers the bias's shape from the einsum string (use_bias); NNX is given it.
  bias = inst.variables.get(("params", "bias"))
  return {"bias_shape": None if bias is None else tuple(bias.shape)}  # pyright: ignore[reportAttributeAccessIssue]


def _cell(inst: Instance) -> dict[str, object]:
  # A cell is called as cell(carry, x): the input width is the last axis of x. Linen's cells
  # take their hidden width from the carry they are given (`features` only sizes
  # `initialize_carry`); NNX's from `hidden_features`.
  call = inst.inputs.get("__call__")
  leaves = jax.tree.leaves(call[0][0]) if call and call[0] else []
  shape = getattr(leaves[-1], "shape", None) if leaves else None
  return {"in_features": inst.width(arg=1), "hidden_features": size(shape[-1]) if shape else None}


@dataclasses.dataclass(frozen=True)
class FieldTranslation:
  """A Linen field with no NNX parameter of its name, and what NNX takes for it."""

  # (the field's code, NNX's parameter names) -> (NNX arguments, or why it is not drafted)
  translate: tp.Callable[[str, set[str]], tuple[dict[str, str], str | None]]
  why: str  # the report's reason for the change


@dataclasses.dataclass(frozen=True)
class LayerMap:
  """How one Linen layer class becomes its NNX counterpart."""

  nnx_name: str
  widths: Widths = lambda inst: {}
  renames: tp.Mapping[str, str] = dataclasses.field(default_factory=dict)
  call_time: frozenset[str] = frozenset()
  # Its submodules do other work than the NNX layer's (Linen's OptimizedLSTMCell returns its
  # kernels from `ii`, `hi`, ...): only the layer's own output is compared.
  opaque: bool = False
  consumed: frozenset[str] = frozenset()  # Linen fields `widths` already accounts for

  helper: bool = False  # a class the draft writes itself (`helpers.py`), not flax's
  # A Linen field NNX spells otherwise: field -> how (`rnn_rngs.SPLIT_RNGS`).
  translated: tp.Mapping[str, FieldTranslation] = dataclasses.field(default_factory=dict)
  # The user's subclass of the layer a parent builds as the layer, by the subclass's name
  # (`transforms/param_override`).
  port_name: str | None = None

  @property
  def nnx_class(self) -> type:
    if self.helper:
      from ..emit.helpers import helper_class

      return helper_class(self.nnx_name)
    return getattr(nnx, self.nnx_name)

  @property
  def code_name(self) -> str:
    if self.port_name is not None:
      return self.port_name
    return self.nnx_name if self.helper else f"nnx.{self.nnx_name}"

  def parameters(self) -> list[inspect.Parameter]:
    return list(inspect.signature(self.nnx_class.__init__).parameters.values())[1:]


_CELL_RENAMES = {"features": "hidden_features"}

TABLE: dict[type, LayerMap] = {
  nn.Dense: LayerMap("Linear", _last("in_features"), {"features": "out_features"}),
  nn.DenseGeneral: LayerMap("LinearGeneral", _dense_general, {"features": "out_features"}),
  nn.Conv: LayerMap("Conv", _last("in_features"), {"features": "out_features"}),
  nn.ConvTranspose: LayerMap("ConvTranspose", _last("in_features"), {"features": "out_features"}),
  nn.Embed: LayerMap("Embed"),
  nn.LayerNorm: LayerMap("LayerNorm", layer_norm_widths),
  nn.RMSNorm: LayerMap("RMSNorm", layer_norm_widths),
  nn.GroupNorm: LayerMap("GroupNorm", _last("num_features")),
  nn.BatchNorm: LayerMap(
    "BatchNorm", batch_norm_widths, call_time=frozenset({"use_running_average"})
  ),
  nn.Dropout: LayerMap("Dropout", call_time=frozenset({"deterministic"})),
  nn.MultiHeadDotProductAttention: LayerMap(
    "MultiHeadAttention", cross_attention_widths, call_time=frozenset({"deterministic"})
  ),
  nn.SelfAttention: LayerMap(
    "MultiHeadAttention", self_attention_widths, call_time=frozenset({"deterministic"})
  ),
  nn.LSTMCell: LayerMap("LSTMCell", _cell, _CELL_RENAMES),
  # Linen's OptimizedLSTMCell keeps LSTMCell's parameters (ii, if, ..., hi, ...) and computes
  # the same function; NNX's fuses its kernels (dense_i, dense_h), so LSTMCell is the port.
  nn.OptimizedLSTMCell: LayerMap("LSTMCell", _cell, _CELL_RENAMES, opaque=True),
  # NNX's GRUCell fuses its gates' kernels; the draft writes Linen's layout in NNX instead.
  nn.GRUCell: LayerMap("LinenGRUCell", _cell, _CELL_RENAMES, helper=True),
  nn.Einsum: LayerMap(
    "Einsum", _einsum_bias, renames={"shape": "kernel_shape"}, consumed=frozenset({"use_bias"})
  ),
  # Its layers are built from the constructions in the list it is given (`layers_0`, ...).
  nn.Sequential: LayerMap("Sequential"),
  # The cell is built by the construction passed as `cell=` (it is the RNN's child `cell`).
  nn.RNN: LayerMap("RNN", translated={"split_rngs": FieldTranslation(split_rngs, SPLIT_RNGS_WHY)}),
}
"""Linen layer class -> its NNX mapping (nn.Sequential is not here yet)."""


def call_keywords(linen_cls: type, layer: LayerMap, count: int) -> list[str | None]:
  """For each of `count` positional call arguments: the keyword NNX needs it under (or None).

  `nn.Dropout(0.1)(x, True)` passes `deterministic` by position; NNX takes it by keyword.
  """
  linen = list(inspect.signature(linen_cls.__call__).parameters.values())[1:]
  nnx_params = list(inspect.signature(layer.nnx_class.__call__).parameters.values())[1:]
  out: list[str | None] = []
  for i in range(count):
    mine = linen[i] if i < len(linen) else None
    theirs = nnx_params[i] if i < len(nnx_params) else None
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in (mine, theirs) if p is not None):
      out += [None] * (count - i)  # `*args` on either side: positions carry over as they are
      break
    positional = theirs is not None and theirs.kind in (
      inspect.Parameter.POSITIONAL_ONLY,
      inspect.Parameter.POSITIONAL_OR_KEYWORD,
    )
    same = positional and mine is not None and theirs is not None and theirs.name == mine.name
    out.append(None if same or mine is None else mine.name)
  return out


def lookup(cls: type) -> LayerMap | None:
  found = TABLE.get(cls)
  if found is None and isinstance(cls, type) and not is_linen_layer(cls):
    # A user subclass overriding `param` is built as its layer, by its own name.
    from ..transforms.param_override import overridden_layer

    base = overridden_layer(cls)
    return None if base is None else dataclasses.replace(TABLE[base], port_name=cls.__name__)
  return found


def is_linen_layer(cls: object) -> bool:
  """A flax.linen Module class of flax's own (as opposed to one the user wrote)."""
  return isinstance(cls, type) and issubclass(cls, nn.Module) and cls.__module__.startswith("flax.")
