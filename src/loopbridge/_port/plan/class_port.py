"""The records of drafting: what every class of one draft shares (`Context`) and one class's
port as it is drafted (`ClassPort`)."""

from __future__ import annotations

import dataclasses

from ..records import Change, Todo
from ..trace.trace import Trace
from ..trace.tracing.widths import SymbolicWidths
from .source import ClassSource
from .values import Resolver


@dataclasses.dataclass
class Context:
  """What every class of one draft shares."""

  trace: Trace
  modern: bool  # flax 0.12 idioms: nnx.List, `variable[...]`, nnx.scan splitting rng streams
  ported: dict[type, ClassPort]
  linen_names: set[str]  # names the user's modules bind to flax.linen
  # Module path -> {cache variable: shape} of the user's Linen variables (a decode cache sized
  # by an init on the full length, not by the sample call).
  cache_shapes: dict[tuple[str, ...], dict[str, tuple[int, ...]]] = dataclasses.field(
    default_factory=dict
  )
  helpers: set[str] = dataclasses.field(default_factory=set)  # `helpers.py` classes used
  # Linen collections of the user's own whose Variable type the port declares
  # (`custom_collections.py`).
  collections: set[str] = dataclasses.field(default_factory=set)
  # The traces of the derived configurations (`configs.py`): evidence for width expressions.
  alt_traces: list[Trace] = dataclasses.field(default_factory=list)
  # Class -> (attribute, "attention" | "module" | "list") whose decode caches its
  # `init_cache` method sizes (`cache_idiom.py`).
  caches: dict[type, list[tuple[str, str]]] = dataclasses.field(default_factory=dict)
  # The symbolic trace (`trace/tracing/`), the last of `alt_traces` when it ran.
  symbolic: SymbolicWidths | None = None


@dataclasses.dataclass
class ClassPort:
  cls: type
  source: ClassSource
  code: str = ""
  resolver: Resolver | None = None
  todos: list[Todo] = dataclasses.field(default_factory=list)
  changes: list[Change] = dataclasses.field(default_factory=list)
  uses_rngs_attr: bool = False
  attributes: dict[str, int] = dataclasses.field(default_factory=dict)  # attr -> class line

  # Fields the port takes no argument for: module-factory fields, and fields declared with
  # `dataclasses.field(init=False)` that setup assigns (T5's `embedding: Array`), which no
  # constructor sets and no unbound Linen module holds.
  dropped: set[str] = dataclasses.field(default_factory=set)
  # method -> {call argument added: the factory field whose partial bound it in Linen}
  threaded: dict[str, dict[str, str]] = dataclasses.field(default_factory=dict)
  # A method scanned by a Linen decorator (`scanned_method.py`): Linen records one call of the
  # module per step, the port one call for the whole scan.
  scans_a_method: bool = False
  # Setup attributes computed from a param (`self.A = c * self.param("p", ...)`): A -> p,
  # made properties by `computed_params.py`.
  computed: dict[str, str] = dataclasses.field(default_factory=dict)
  # Layers built always though under a test of the call's shapes (`shape_guards.py`): the
  # draft's TODOs where the check at input sizes equal to the settings fails.
  shape_guards: list[Todo] = dataclasses.field(default_factory=list)

  def __post_init__(self) -> None:
    if dataclasses.is_dataclass(self.cls):
      self.dropped |= {f.name for f in dataclasses.fields(self.cls) if not f.init}

  def field_names(self) -> list[str]:
    return [f.name for f in dataclasses.fields(self.cls) if f.name not in ("parent", "name")]
