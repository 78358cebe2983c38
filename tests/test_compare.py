"""`lb.compare`: a correct port agrees; each planted porting bug is reported at the first module
whose output differs (checked against plain Linen `apply` of the submodules, not against
`compare` itself); bad inputs get errors saying what, why and the fix; the user's model and
classes are left untouched."""

from __future__ import annotations

import json
import threading
import typing as tp

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb
from loopbridge import _compat
from loopbridge._diagnostics.compare_tolerance import HIGHEST, default_tolerance

from conftest import full_precision_tolerance, matmul_tolerance

# The independent reference's float32 tolerance: both sides at full precision, as lb.compare
# runs them (widened on a TPU, whose transcendentals differ in the 5th digit).
RTOL, ATOL = full_precision_tolerance(1e-5, 1e-5)
# Whether this backend's full-precision check is float32's own (1e-5): a unit-variance epsilon
# change (1e-5 relative) is then findable with TIGHT tolerances; on a TPU it is noise
# (tests/test_compare_backend.py finds one on small-variance data on every backend).
EXACT_MATMULS = default_tolerance(precision=HIGHEST).rtol <= 1e-5

D, H = 8, 16  # model width, block hidden width
EPS_BUG = 3e-2  # a planted layer-norm epsilon every backend's default tolerance finds


class Block(nn.Module):
  hidden: int

  @nn.compact
  def __call__(self, x):
    h = nn.LayerNorm(epsilon=1e-6)(x)  # LayerNorm_0
    h = nn.Dense(self.hidden)(h)  # Dense_0
    h = nn.gelu(h)
    h = nn.Dense(x.shape[-1])(h)  # Dense_1
    return x + h


class Net(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Dense(D, name="Dense_0")(x)
    x = Block(H)(x)  # Block_0
    x = Block(H)(x)  # Block_1
    x = nn.LayerNorm(epsilon=1e-6, name="LayerNorm_0")(x)
    return nn.Dense(D, name="Dense_1")(x)  # square: a transposed kernel keeps its shape


def nnx_list(items):
  # flax 0.12 modules hold lists of submodules as nnx.List; 0.10 as plain lists.
  return nnx.List(items) if hasattr(nnx, "List") else items


class PortBlock(nnx.Module):
  def __init__(self, d, hidden, *, rngs, act=nnx.gelu, epsilon=1e-6, up_bias=True):
    self.norm = nnx.LayerNorm(d, epsilon=epsilon, rngs=rngs)
    self.up = nnx.Linear(d, hidden, use_bias=up_bias, rngs=rngs)
    self.down = nnx.Linear(hidden, d, rngs=rngs)
    self.act = act

  def __call__(self, x):
    return x + self.down(self.act(self.up(self.norm(x))))


class Port(nnx.Module):
  """The NNX port, with its own names (so alignment is by call order and shape)."""

  def __init__(self, *, rngs, blocks=None, head_dtype=None):
    self.embed = nnx.Linear(D, D, rngs=rngs)
    self.blocks = nnx_list(
      blocks if blocks is not None else [PortBlock(D, H, rngs=rngs) for _ in range(2)]
    )
    self.norm = nnx.LayerNorm(D, epsilon=1e-6, rngs=rngs)
    self.head = nnx.Linear(D, D, rngs=rngs, **({"dtype": head_dtype} if head_dtype else {}))

  def __call__(self, x):
    x = self.embed(x)
    for block in self.blocks:
      x = block(x)
    return self.head(self.norm(x))


# Which Linen submodule each Port module ports (the test's own table, independent of compare),
# in call order.
PORT_PATHS = {
  "embed": "Dense_0",
  **{
    f"blocks/{i}/{a}": f"Block_{i}/{b}"
    for i in range(2)
    for a, b in (("norm", "LayerNorm_0"), ("up", "Dense_0"), ("down", "Dense_1"))
  },
  "norm": "LayerNorm_0",
  "head": "Dense_1",
}


def _get(tree, path):
  for key in path.split("/"):
    tree = (
      tree[int(key)]
      if isinstance(tree, list) or (key.isdigit() and not isinstance(tree, dict))
      else (tree[key] if isinstance(tree, dict) else getattr(tree, key))
    )
  return tree


def _module(port, path):
  node = port
  for key in path.split("/"):
    node = node[int(key)] if key.isdigit() else getattr(node, key)
  return node


def load(port, params, *, transpose=(), skip=()):
  """Copy Linen params into the port by PORT_PATHS (kernel transposed where asked)."""
  for port_path, linen_path in PORT_PATHS.items():
    if port_path in skip:
      continue
    module, source = _module(port, port_path), _get(params, linen_path)
    for name, value in source.items():
      variable = getattr(module, name, None)
      # a planted missing bias: no attribute (flax 0.12) or a Param holding None (0.10)
      if variable is None or _compat.variable_value(variable) is None:
        continue
      if name == "kernel" and port_path in transpose:
        value = value.T
      dtype = _compat.variable_value(variable).dtype
      _compat.set_variable_value(variable, jnp.asarray(value, dtype))
  return port


@pytest.fixture(scope="module")
def setup():
  x = 0.5 * jax.random.normal(jax.random.key(1), (2, D))
  variables = Net().init(jax.random.key(0), x)
  # Random biases and scales: Linen initializes biases to zero, which would hide a missing one.
  leaves, treedef = jax.tree.flatten(variables)
  keys = jax.random.split(jax.random.key(2), len(leaves))
  variables = jax.tree.unflatten(
    treedef, [leaf + 0.1 * jax.random.normal(k, leaf.shape) for leaf, k in zip(leaves, keys)]
  )
  return x, variables


def make_port(variables, **kwargs):
  blocks_kwargs = kwargs.pop("block_kwargs", ({}, {}))
  transpose = kwargs.pop("transpose", ())
  rngs = nnx.Rngs(0)
  blocks = [PortBlock(D, H, rngs=rngs, **kw) for kw in blocks_kwargs]
  return load(Port(rngs=rngs, blocks=blocks, **kwargs), variables["params"], transpose=transpose)


def linen_outputs(variables, x):
  """Every Linen submodule output, by path, from plain `apply(capture_intermediates=True)`."""
  _, state = Net().apply(variables, x, capture_intermediates=True, mutable=["intermediates"])
  flat = {}

  def walk(tree, prefix):
    for key, value in tree.items():
      if key == "__call__":
        flat["/".join(prefix)] = value[0]
      else:
        walk(value, (*prefix, key))

  walk(state["intermediates"], ())
  return flat


def port_outputs(port, x):
  """Every port submodule output, recomputed by hand in the port's own order."""
  out = {}
  h = out["embed"] = port.embed(x)
  for i, block in enumerate(port.blocks):
    n = out[f"blocks/{i}/norm"] = block.norm(h)
    u = out[f"blocks/{i}/up"] = block.up(n)
    d = out[f"blocks/{i}/down"] = block.down(block.act(u))
    h = h + d
  n = out["norm"] = port.norm(h)
  out["head"] = port.head(n)
  return out


def first_differing(variables, port, x, rtol=RTOL, atol=ATOL):
  """The first port path (in call order) whose output differs from its Linen counterpart (both
  at full precision, as lb.compare runs them by default)."""
  with jax.default_matmul_precision("highest"):
    ref, cand = linen_outputs(variables, x), port_outputs(port, x)
  for port_path, linen_path in PORT_PATHS.items():
    a, b = np.asarray(ref[linen_path]), np.asarray(cand[port_path])
    if a.shape != b.shape or not np.allclose(b, a, rtol=rtol, atol=atol):
      return port_path
  return None


ORDER = [
  "embed",
  "blocks/0/norm",
  "blocks/0/up",
  "blocks/0/down",
  "blocks/0",
  "blocks/1/norm",
  "blocks/1/up",
  "blocks/1/down",
  "blocks/1",
  "norm",
  "head",
  "",
]


# ----------------------------------------------------------------------------- agreement
def test_correct_port_agrees(setup):
  x, variables = setup
  port = make_port(variables)
  assert first_differing(variables, port, x) is None  # the test's loader is right
  rtol, atol = matmul_tolerance(1e-6, 1e-6)
  np.testing.assert_allclose(port(x), Net().apply(variables, x), rtol=rtol, atol=atol)
  report = lb.compare((Net(), variables), port, x)
  assert report.ok and report.first_divergence is None, str(report)
  assert [p.candidate_path for p in report.pairs] == ORDER
  assert [p.reference_path for p in report.pairs] == [
    "Dense_0",
    "Block_0/LayerNorm_0",
    "Block_0/Dense_0",
    "Block_0/Dense_1",
    "Block_0",
    "Block_1/LayerNorm_0",
    "Block_1/Dense_0",
    "Block_1/Dense_1",
    "Block_1",
    "LayerNorm_0",
    "Dense_1",
    "",
  ]
  assert not report.unmatched_reference and not report.unmatched_candidate
  assert "lb.compare: OK" in str(report)


def test_port_named_like_linen_aligns_by_name(setup):
  x, _variables = setup

  class Named(nnx.Module):
    def __init__(self, rngs):
      self.Dense_1 = nnx.Linear(D, D, rngs=rngs)  # defined first: names, not order, pair it
      self.Dense_0 = nnx.Linear(D, D, rngs=rngs)

    def __call__(self, x):
      return self.Dense_1(self.Dense_0(x))

  class Linen(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(D, name="Dense_1")(nn.Dense(D, name="Dense_0")(x))

  linen_vars = Linen().init(jax.random.key(0), x)
  port = Named(nnx.Rngs(0))
  lb.layers.load_params([linen_vars["params"]], [port])
  report = lb.compare((Linen(), linen_vars), port, x)
  assert report.ok, str(report)
  assert [(p.reference_path, p.candidate_path, p.aligned_by) for p in report.pairs] == [
    ("Dense_0", "Dense_0", "name"),
    ("Dense_1", "Dense_1", "name"),
    ("", "", "name"),
  ]


# ----------------------------------------------------------------------------- planted bugs
TIGHT: dict[str, tp.Any] = {"rtol": 1e-6, "atol": 1e-6}
BUGS = {
  # name: (port options, compare tolerances, expected first differing port path)
  "missing bias": (dict(block_kwargs=({}, {"up_bias": False})), {}, "blocks/1/up"),
  "transposed kernel": (dict(transpose=("head",)), {}, "head"),
  # the activation is not a module: the first module whose output differs is the next one
  "wrong activation": (dict(block_kwargs=({"act": nnx.relu}, {})), {}, "blocks/0/down"),
  # 3e-2 changes the norm's output by ~5e-2, above every backend's default tolerance (1e-3
  # changes it by ~2e-3: found on CPU, inside a GPU's TensorFloat-32 default of 5e-3)
  "layer-norm epsilon": (dict(block_kwargs=({}, {"epsilon": EPS_BUG})), {}, "blocks/1/norm"),
  # PyTorch's default epsilon: a 1e-5 relative change on unit-variance inputs, inside the
  # float32 default tolerance, found with tighter ones
  "layer-norm epsilon 1e-5": (dict(block_kwargs=({}, {"epsilon": 1e-5})), TIGHT, "blocks/1/norm"),
}


@pytest.mark.parametrize("bug", list(BUGS))
def test_planted_bug_is_reported_at_the_first_differing_module(setup, bug):
  x, variables = setup
  options, tolerances, expected = BUGS[bug]
  if tolerances is TIGHT and not EXACT_MATMULS:
    pytest.skip("a 1e-5 relative change is below this backend's float32 matmul noise")
  port = make_port(variables, **options)
  # the independent reference: plain Linen capture against the port's layers called by hand
  assert first_differing(variables, port, x, **(tolerances or {})) == expected
  report = lb.compare((Net(), variables), port, x, **tolerances)
  assert not report.ok
  divergence = report.first_divergence
  assert divergence is not None and divergence.kind == "values"
  assert divergence.candidate_path == expected, str(report)
  assert divergence.reference_path == PORT_PATHS[expected]
  assert divergence.max_abs_err is not None and divergence.max_rel_err is not None
  assert divergence.max_abs_err > tolerances.get("atol", ATOL) and divergence.max_rel_err > 0
  # not earlier: every pair before it agrees; the pair itself and the top level differ
  statuses = {p.candidate_path: p.status for p in report.pairs}
  for path in ORDER[: ORDER.index(expected)]:
    assert statuses[path] == "ok", (path, str(report))
  assert statuses[expected] == "values" and statuses[""] == "values"
  text = str(report)
  marked = [line for line in text.splitlines() if line.startswith(">>")]
  assert len(marked) == 1 and f" {expected} " in marked[0] and "first divergence" in marked[0]


def test_report_to_dict_is_json(setup):
  x, variables = setup
  report = lb.compare((Net(), variables), make_port(variables, transpose=("head",)), x)
  data = json.loads(json.dumps(report.to_dict(), allow_nan=False))
  assert data["ok"] is False
  assert data["first_divergence"]["reference_path"] == "Dense_1"
  assert data["first_divergence"]["candidate_path"] == "head"
  assert len(data["pairs"]) == len(ORDER) and data["pairs"][0]["aligned_by"] == "order"


def test_shape_and_dtype_mismatches_are_listed(setup):
  x, variables = setup
  rngs = nnx.Rngs(0)
  narrow = [PortBlock(D, 12, rngs=rngs), PortBlock(D, H, rngs=rngs)]
  port = Port(rngs=rngs, blocks=narrow, head_dtype=jnp.bfloat16)
  load(port, variables["params"], skip=("blocks/0/up", "blocks/0/down"))
  report = lb.compare((Net(), variables), port, x)
  divergence = report.first_divergence
  assert divergence is not None
  assert divergence.kind == "shape" and divergence.candidate_path == "blocks/0/up"
  assert (divergence.reference, divergence.candidate) == ("float32[2,16]", "float32[2,12]")
  kinds = {p.candidate_path: p.status for p in report.mismatches}
  assert kinds["blocks/0/up"] == "shape"
  assert any(d.candidate == "bfloat16[2,8]" for p in report.mismatches for d in p.leaves)
  assert "shape/dtype mismatches:" in str(report)
  assert "float32[2,16] vs blocks/0/up: float32[2,12]" in str(report)


def test_dtype_only_difference_within_the_looser_tolerance(setup):
  x, variables = setup
  port = make_port(variables, head_dtype=jnp.bfloat16)
  report = lb.compare((Net(), variables), port, x)
  divergence = report.first_divergence
  assert divergence is not None
  assert divergence.kind == "dtype"
  assert divergence.candidate_path == "head"


# ----------------------------------------------------------------------------- other sides
def test_lb_to_nnx_reference_and_candidate(setup):
  x, variables = setup
  model = lb.checkpoint.from_linen_variables(Net(), variables, x)
  assert lb.compare(model, make_port(variables), x).ok
  report = lb.compare((Net(), variables), model, x)
  assert report.ok and all(p.aligned_by == "name" for p in report.pairs)
  bad = lb.compare(model, make_port(variables, transpose=("head",)), x)
  assert bad.first_divergence is not None
  assert bad.first_divergence.reference_path == "Dense_1"


def test_bridged_part_of_a_candidate_is_recorded_inside(setup):
  """Half-way through a migration: block 1 still Linen (bridged), the rest ported."""
  x, variables = setup
  port = make_port(variables, block_kwargs=({"act": nnx.relu}, {}))
  port.blocks[1] = lb.checkpoint.from_linen_variables(
    Block(H), {"params": variables["params"]["Block_1"]}, x
  )
  report = lb.compare((Net(), variables), port, x)
  paths = [p.candidate_path for p in report.pairs]
  assert "blocks/1/Dense_0" in paths and "blocks/1" in paths, str(report)
  assert report.first_divergence is not None
  assert report.first_divergence.candidate_path == "blocks/0/down"


def test_calls_no_callback_can_leave_are_listed_as_not_recorded(monkeypatch):
  """Where jax takes no host callback, a call under a trace is listed, not compared."""
  x, variables = stack_setup(ScanNet())

  def refuse(*args, **kwargs):
    raise NotImplementedError("no callbacks here")

  monkeypatch.setattr(jax.debug, "callback", refuse)
  report = lb.compare((ScanNet(), variables), (ScanNet(), variables), x)
  assert report.ok
  assert "layers/Dense_0" in report.not_recorded_reference
  assert [p.reference_path for p in report.pairs] == ["embed", "head", ""]
  assert "not recorded in the reference" in str(report)


def test_mapping_pairs_and_excludes(setup):
  x, variables = setup
  port = make_port(variables)
  report = lb.compare((Net(), variables), port, x, mapping={"Dense_1": "head", "LayerNorm_0": None})
  how = {p.reference_path: p.aligned_by for p in report.pairs}
  assert how["Dense_1"] == "mapping" and "LayerNorm_0" not in how
  assert [c.path for c in report.unmatched_reference] == ["LayerNorm_0"]
  assert [c.path for c in report.unmatched_candidate] == ["norm"]
  assert report.ok


def test_extra_candidate_call_is_unmatched_not_misaligned(setup):
  x, variables = setup

  class WithDropout(Port):
    def __init__(self, *, rngs):
      super().__init__(rngs=rngs)
      self.drop = nnx.Dropout(0.5, deterministic=True)

    def __call__(self, x):
      x = self.embed(x)
      for block in self.blocks:
        x = block(x)
      return self.head(self.drop(self.norm(x)))

  port = load(WithDropout(rngs=nnx.Rngs(0)), variables["params"])
  report = lb.compare((Net(), variables), port, x)
  assert report.ok, str(report)
  assert [c.path for c in report.unmatched_candidate] == ["drop"]


def test_concurrent_compares_do_not_mix(setup):
  x, variables = setup
  ports = {"ok": make_port(variables), "bug": make_port(variables, transpose=("head",))}
  results = {}

  def run(name):
    results[name] = lb.compare((Net(), variables), ports[name], x)

  threads = [threading.Thread(target=run, args=(n,)) for n in ports]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert results["ok"].ok and len(results["ok"].pairs) == len(ORDER)
  assert results["bug"].first_divergence.candidate_path == "head"
  assert len(results["bug"].pairs) == len(ORDER)


# ----------------------------------------------------------------------------- untouched
def _snapshot(model):
  return [
    (
      path,
      type(node),
      id(node),
      np.asarray(_compat.variable_value(node)).copy() if isinstance(node, nnx.Variable) else None,
    )
    for path, node in _compat.iter_graph(model)
  ]


def test_users_model_and_classes_are_untouched(setup):
  x, variables = setup
  port = make_port(variables, block_kwargs=({"act": nnx.relu}, {}))
  before = _snapshot(port)
  calls = {cls: vars(cls)["__call__"] for cls in (nnx.Linear, nnx.LayerNorm, Port, PortBlock)}
  bases = (Port.__bases__, PortBlock.__bases__, nnx.Linear.__mro__)
  for _ in range(2):
    lb.compare((Net(), variables), port, x)
  with pytest.raises(lb.CompareError):
    lb.compare((Net(), variables), port, jnp.ones((2, 3)))  # fails inside the candidate
  after = _snapshot(port)
  assert [(p, t, i) for p, t, i, _ in after] == [(p, t, i) for p, t, i, _ in before]
  for (_, _, _, a), (_, _, _, b) in zip(before, after):
    if a is not None:
      np.testing.assert_array_equal(a, b)
  assert {cls: vars(cls)["__call__"] for cls in calls} == calls
  assert (Port.__bases__, PortBlock.__bases__, nnx.Linear.__mro__) == bases
  assert "__call__" not in vars(nnx.Module) or nnx.Module.__call__ is vars(nnx.Module)["__call__"]
  # the model still runs as before, unrecorded
  np.testing.assert_allclose(port(x), port_outputs(port, x)["head"])


# ----------------------------------------------------------------------------- bad inputs
def test_unalignable_pair_is_a_clear_error(setup):
  x, variables = setup

  class Other(nnx.Module):
    def __init__(self, rngs):
      self.a = nnx.Linear(D, 5, rngs=rngs)
      self.b = nnx.Linear(5, 3, rngs=rngs)

    def __call__(self, x):
      return self.b(self.a(x))

  with pytest.raises(
    lb.CompareError,
    match=r"no module call of the reference could be aligned"
    r".*Reference calls: Dense_0 .*Candidate calls: a .*mapping=",
  ):
    lb.compare((Net(), variables), Other(nnx.Rngs(0)), x)


@pytest.mark.parametrize(
  "reference, match",
  [
    (
      Net(),
      r"the reference is a Linen module without its variables.*Pass `\(Net\(\.\.\.\), "
      r"variables\)`",
    ),
    (Net, r"the reference is the class Net, not a model: build an instance"),
    ((Net(), [1, 2]), r"second item must be the module's variables"),
    ("model", r"the reference is a str; it must be a Linen module with its variables"),
  ],
)
def test_wrong_kind_of_reference(setup, reference, match):
  x, variables = setup
  with pytest.raises(lb.CompareError, match=match):
    lb.compare(reference, make_port(variables), x)


def test_params_without_their_collection(setup):
  x, variables = setup
  with pytest.raises(
    lb.CompareError,
    match=r"running the reference .* failed.*no 'params' "
    r"collection.*pass the whole dict",
  ):
    lb.compare((Net(), variables["params"]), make_port(variables), x)


def test_uninitialized_to_nnx(setup):
  x, variables = setup
  with pytest.raises(
    lb.CompareError,
    match=r"It has no variables: initialize an lb.ToNNX with "
    r"lb.lazy_init",
  ):
    lb.compare(lb.ToNNX(Net(), rngs=nnx.Rngs(0)), make_port(variables), x)


def test_candidate_that_fails_on_the_inputs(setup):
  x, variables = setup
  with pytest.raises(lb.CompareError, match=r"running the candidate on the given inputs failed"):
    lb.compare((Net(), variables), nnx.Linear(3, D, rngs=nnx.Rngs(0)), x)


def test_bad_mapping(setup):
  x, variables = setup
  port = make_port(variables)
  with pytest.raises(
    lb.CompareError,
    match=r"mapping key 'Dense_9' names no module call of the "
    r"reference.*The reference called: Dense_0 ",
  ):
    lb.compare((Net(), variables), port, x, mapping={"Dense_9": "head"})
  with pytest.raises(
    lb.CompareError,
    match=r"mapping value 'tail' \(for 'Dense_1'\) names no "
    r"module call of the candidate.*The candidate called: embed ",
  ):
    lb.compare((Net(), variables), port, x, mapping={"Dense_1": "tail"})
  with pytest.raises(lb.CompareError, match=r"mapping=a list must be a dict"):
    lb.compare((Net(), variables), port, x, mapping=["Dense_1", "head"])
  with pytest.raises(lb.CompareError, match=r"is not a pair of paths"):
    lb.compare((Net(), variables), port, x, mapping={("Dense_1",): "head"})


def test_bad_tolerance_and_traced_inputs(setup):
  x, variables = setup
  port = make_port(variables)
  with pytest.raises(lb.CompareError, match=r"rtol=-1 must be a number >= 0"):
    lb.compare((Net(), variables), port, x, rtol=-1)
  with pytest.raises(lb.CompareError, match=r"the inputs are JAX tracers.*runs eagerly"):
    jax.jit(lambda x: lb.compare((Net(), variables), port, x))(x)


def test_tolerances_are_used(setup):
  x, variables = setup
  port = make_port(variables, block_kwargs=({}, {"epsilon": 1e-5}))
  assert lb.compare((Net(), variables), port, x).ok  # within the float32 default
  if EXACT_MATMULS:
    assert not lb.compare((Net(), variables), port, x, **TIGHT).ok
  port = make_port(variables, block_kwargs=({}, {"epsilon": EPS_BUG}))
  assert not lb.compare((Net(), variables), port, x).ok
  assert lb.compare((Net(), variables), port, x, rtol=1.0, atol=1.0).ok


class LogNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    return jnp.log(nn.Dense(D, name="Dense_0")(x))  # NaN where the Dense output is negative


class LogPort(nnx.Module):
  def __init__(self, rngs, shift=0.0):
    self.Dense_0 = nnx.Linear(4, D, rngs=rngs)
    self.shift = shift

  def __call__(self, x):
    return jnp.log(self.Dense_0(x)) + self.shift


def test_nan_in_the_same_places_is_equal():
  x = jax.random.normal(jax.random.key(1), (2, 4))
  variables = LogNet().init(jax.random.key(0), x)
  reference = np.asarray(LogNet().apply(variables, x))
  assert np.isnan(reference).any() and not np.isnan(reference).all()  # the case under test
  port = LogPort(nnx.Rngs(0))
  lb.layers.load_params([variables["params"]], [port])
  report = lb.compare((LogNet(), variables), port, x)
  assert report.ok, str(report)
  port.shift = 1.0  # same NaN places, other finite values: still a divergence
  report = lb.compare((LogNet(), variables), port, x)
  divergence = report.first_divergence
  assert not report.ok and divergence is not None and divergence.kind == "values"


def test_infinite_atol_compares_structure_shapes_and_dtypes_only(setup):
  x, variables = setup
  port = make_port(variables, block_kwargs=({}, {"epsilon": EPS_BUG}))
  assert not lb.compare((Net(), variables), port, x).ok
  report = lb.compare((Net(), variables), port, x, atol=float("inf"))
  assert report.ok and "values are not compared" in str(report), str(report)


# ----------------------------------------------------------------------------- layer stacks
L = 4  # layers in a stack


class ScanBlock(nn.Module):
  """A block written for nn.scan: (carry, x) -> (carry, y)."""

  @nn.compact
  def __call__(self, x, _):
    h = nn.gelu(nn.Dense(H)(x))  # Dense_0
    return x + nn.Dense(D)(h), None  # Dense_1


class ScanNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    x = nn.Dense(D, name="embed")(x)
    stack = nn.scan(ScanBlock, variable_axes={"params": 0}, split_rngs={"params": True}, length=L)
    x, _ = stack(name="layers")(x, None)
    return nn.Dense(D, name="head")(x)


class PerLayerNet(nn.Module):
  """The same network with one Linen module per layer: layers_0 ... layers_3."""

  @nn.compact
  def __call__(self, x):
    x = nn.Dense(D, name="embed")(x)
    for i in range(L):
      x, _ = ScanBlock(name=f"layers_{i}")(x, None)
    return nn.Dense(D, name="head")(x)


class OwnBlock(nnx.Module):
  def __init__(self, rngs):
    self.up = nnx.Linear(D, H, rngs=rngs)
    self.down = nnx.Linear(H, D, rngs=rngs)

  def __call__(self, x):
    return x + self.down(nnx.gelu(self.up(x)))


class ListPort(nnx.Module):
  def __init__(self, rngs):
    self.embed = nnx.Linear(D, D, rngs=rngs)
    self.blocks = nnx_list([OwnBlock(rngs) for _ in range(L)])
    self.head = nnx.Linear(D, D, rngs=rngs)

  def __call__(self, x):
    x = self.embed(x)
    for block in self.blocks:
      x = block(x)
    return self.head(x)


class StackedPort(nnx.Module):
  """The blocks as one module with a leading layer axis (nnx.vmap), run by nnx.scan."""

  def __init__(self, rngs):
    self.embed = nnx.Linear(D, D, rngs=rngs)

    @nnx.split_rngs(splits=L)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create(rngs):
      return OwnBlock(rngs)

    self.blocks = create(rngs)
    self.head = nnx.Linear(D, D, rngs=rngs)

  def __call__(self, x):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    def run(x, block):
      return block(x)

    return self.head(run(self.embed(x), self.blocks))


def _set(variable, value):
  _compat.set_variable_value(variable, jnp.asarray(value))


def _stacked_linen_params(params):
  """nn.scan params (a leading layer axis); per-layer params are stacked into that layout."""
  if "layers" in params:
    return params["layers"]
  return jax.tree.map(lambda *a: jnp.stack(a), *[params[f"layers_{i}"] for i in range(L)])


def load_stack_port(port, params, *, bug_layer=None):
  """Load Linen params into a list or stacked port; add 0.5 to one layer's `down` bias."""
  for name in ("embed", "head"):
    _set(getattr(port, name).kernel, params[name]["kernel"])
    _set(getattr(port, name).bias, params[name]["bias"])
  layers = _stacked_linen_params(params)
  table = {"up": layers["Dense_0"], "down": layers["Dense_1"]}
  for name, linen in table.items():
    kernel, bias = np.asarray(linen["kernel"]), np.array(linen["bias"])
    if name == "down" and bug_layer is not None:
      bias[bug_layer] += 0.5
    if isinstance(port, StackedPort):
      _set(getattr(port.blocks, name).kernel, kernel)
      _set(getattr(port.blocks, name).bias, bias)
    else:
      for i, block in enumerate(port.blocks):
        _set(getattr(block, name).kernel, kernel[i])
        _set(getattr(block, name).bias, bias[i])
  return port


def stack_setup(net, shape=(2, D)):
  x = 0.5 * jax.random.normal(jax.random.key(1), shape)
  variables = net.init(jax.random.key(0), x)
  leaves, treedef = jax.tree.flatten(variables)  # random biases: zeros would hide a bias bug
  keys = jax.random.split(jax.random.key(2), len(leaves))
  variables = jax.tree.unflatten(
    treedef, [leaf + 0.1 * jax.random.normal(k, leaf.shape) for leaf, k in zip(leaves, keys)]
  )
  return x, variables


def linen_layer_outputs(params, x):
  """Each layer's (Dense_0, Dense_1, block) outputs by plain Linen apply of sliced params."""
  layers = _stacked_linen_params(params)
  h = nn.Dense(D).apply({"params": params["embed"]}, x)
  out = []
  for i in range(L):
    p = jax.tree.map(lambda a, i=i: a[i], layers)
    up = nn.Dense(H).apply({"params": p["Dense_0"]}, h)
    down = nn.Dense(D).apply({"params": p["Dense_1"]}, nn.gelu(up))
    h = h + down
    out.append((up, down, h))
  return out


def port_layer_outputs(port, x):
  """The same per layer from the port's own layers, called one by one."""
  blocks = (
    [lb.layers.layer(port.blocks, i) for i in range(L)]
    if isinstance(port, StackedPort)
    else list(port.blocks)
  )
  h, out = port.embed(x), []
  for block in blocks:
    up = block.up(h)
    down = block.down(nnx.gelu(up))
    h = h + down
    out.append((up, down, h))
  return out


STACK_CASES = {
  "nn.scan vs list": (ScanNet, ListPort, "layers", "blocks"),
  "nn.scan vs nnx.vmap stack in nnx.scan": (ScanNet, StackedPort, "layers", "blocks"),
  "per-layer Linen vs nnx.vmap stack in nnx.scan": (PerLayerNet, StackedPort, "layers", "blocks"),
}


@pytest.mark.slow  # three models with nnx.scan/nn.scan traced twice each; the bug test stays fast
@pytest.mark.parametrize("case", list(STACK_CASES))
def test_layer_stacks_are_compared_layer_by_layer(case):
  net_type, port_type, ref_stack, cand_stack = STACK_CASES[case]
  x, variables = stack_setup(net_type())
  port = load_stack_port(port_type(nnx.Rngs(0)), variables["params"])
  # the independent reference: every layer of the port agrees with plain Linen per layer
  for ref, cand in zip(linen_layer_outputs(variables["params"], x), port_layer_outputs(port, x)):
    for a, b in zip(ref, cand):
      np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL)
  report = lb.compare((net_type(), variables), port, x)
  assert report.ok, str(report)
  layered = [p for p in report.pairs if p.reference_layer is not None]
  assert [p.reference_layer for p in layered] == [i for i in range(L) for _ in range(3)]
  assert [p.candidate_layer for p in layered] == [p.reference_layer for p in layered]
  assert {p.reference_stack for p in layered} == {ref_stack}
  assert {p.candidate_stack for p in layered} == {cand_stack}
  assert not report.not_recorded_reference and not report.not_recorded_candidate


@pytest.mark.parametrize("case", list(STACK_CASES))
def test_bug_in_one_layer_is_reported_at_that_stack_and_layer(case):
  net_type, port_type, ref_stack, cand_stack = STACK_CASES[case]
  x, variables = stack_setup(net_type())
  port = load_stack_port(port_type(nnx.Rngs(0)), variables["params"], bug_layer=2)
  # the independent reference: layers 0, 1 and layer 2's `up` agree, layer 2's `down` does not
  ref, cand = linen_layer_outputs(variables["params"], x), port_layer_outputs(port, x)
  for i in range(2):
    for a, b in zip(ref[i], cand[i]):
      np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(cand[2][0], ref[2][0], rtol=RTOL, atol=ATOL)
  assert not np.allclose(cand[2][1], ref[2][1], rtol=RTOL, atol=ATOL)
  report = lb.compare((net_type(), variables), port, x)
  divergence = report.first_divergence
  assert divergence is not None and divergence.kind == "values", str(report)
  before = [p for p in report.pairs if p.reference_layer is not None and p.reference_layer < 2]
  assert len(before) == 6 and all(p.status == "ok" for p in before), str(report)
  assert [p.candidate_layer for p in before] == [0, 0, 0, 1, 1, 1]
  assert (divergence.reference_stack, divergence.reference_layer) == (ref_stack, 2)
  assert (divergence.candidate_stack, divergence.candidate_layer) == (cand_stack, 2)
  expected_ref = "layers_2/Dense_1" if net_type is PerLayerNet else "layers[2]/Dense_1"
  expected_cand = "blocks/2/down" if port_type is ListPort else "blocks[2]/down"
  assert (divergence.reference_path, divergence.candidate_path) == (expected_ref, expected_cand)
  assert f"layer 2 of the reference's stack {ref_stack}" in str(report)
  assert f"layer 2 of the candidate's stack {cand_stack}" in str(report)


def test_mapping_names_a_scanned_path_or_one_layer():
  x, variables = stack_setup(ScanNet())
  port = load_stack_port(StackedPort(nnx.Rngs(0)), variables["params"])
  report = lb.compare(
    (ScanNet(), variables),
    port,
    x,
    mapping={"layers/Dense_0": "blocks/up", "layers[3]/Dense_1": "blocks[3]/down"},
  )
  assert report.ok, str(report)
  how = {p.reference_path: (p.candidate_path, p.aligned_by) for p in report.pairs}
  assert all(how[f"layers[{i}]/Dense_0"] == (f"blocks[{i}]/up", "mapping") for i in range(L))
  assert how["layers[3]/Dense_1"] == ("blocks[3]/down", "mapping")


def test_nn_remat_body_is_recorded_as_plain_calls():
  class Remat(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.remat(ScanBlock)(name="block")(x, None)[0]

  x, variables = stack_setup(Remat())
  report = lb.compare((Remat(), variables), (Remat(), variables), x)
  assert report.ok and not report.not_recorded_reference
  assert [p.reference_path for p in report.pairs] == ["block/Dense_0", "block/Dense_1", "block", ""]
  assert all(p.reference_layer is None for p in report.pairs)


def test_align_modules_pairs_linen_and_nnx_modules_per_layer():
  """The alignment other tools reuse: own names, own (random) weights, a stacked port."""
  from loopbridge._diagnostics.compare_align import align_modules

  x, variables = stack_setup(ScanNet())
  pairs = align_modules(ScanNet(), variables, (x,), StackedPort(nnx.Rngs(5)), (x,))
  got = [
    (p.linen.path, p.linen.layer, p.nnx.path, p.nnx.layer, p.nnx.scanned)
    for p in pairs
    if p.linen.path
  ]
  expected = [("embed", None, "embed", None, False)]
  for i in range(L):
    expected += [
      ("layers/Dense_0", i, "blocks/up", i, True),
      ("layers/Dense_1", i, "blocks/down", i, True),
      ("layers", i, "blocks", i, True),
    ]
  assert got == [*expected, ("head", None, "head", None, False)]
  assert {p.linen.stack for p in pairs if p.linen.layer is not None} == {"layers"}


# A ViT-style encoder: `nn.scan(nn.remat(Block))` whose block holds a user submodule (MlpBlock),
# ported as an nnx.vmap-built stack run by nnx.scan, with nnx.remat inside.
VIT_L = 3  # encoder blocks


class MlpBlock(nn.Module):
  @nn.compact
  def __call__(self, x, deterministic=True):
    h = nn.gelu(nn.Dense(H)(x))  # Dense_0
    h = nn.Dropout(rate=0.1)(h, deterministic)  # Dropout_0
    return nn.Dense(D)(h)  # Dense_1


class EncoderBlock(nn.Module):
  @nn.compact
  def __call__(self, x, deterministic):
    y = nn.LayerNorm()(x)  # LayerNorm_0
    x = x + MlpBlock()(y, deterministic)  # MlpBlock_0
    return nn.LayerNorm()(x), None  # LayerNorm_1


class Encoder(nn.Module):
  @nn.compact
  def __call__(self, x, train=False):
    block = nn.remat(EncoderBlock, prevent_cse=False, static_argnums=(2,))
    x, _ = nn.scan(
      block,
      variable_axes={"params": 0},
      split_rngs={"params": True, "dropout": True},
      in_axes=nn.broadcast,
      length=VIT_L,
    )(name="encoderblock")(x, not train)
    return nn.LayerNorm(name="encoder_norm")(x)


class PortMlpBlock(nnx.Module):
  def __init__(self, rngs):
    self.Dense_0 = nnx.Linear(D, H, rngs=rngs)
    # No rngs: only deterministic calls, and a stream's scalar count would keep flax 0.10's
    # stack from being sliced into layers by lb.layers.layer (the per-layer reference).
    self.Dropout_0 = nnx.Dropout(0.1)
    self.Dense_1 = nnx.Linear(H, D, rngs=rngs)

  def __call__(self, x, deterministic=True):
    h = self.Dropout_0(nnx.gelu(self.Dense_0(x)), deterministic=deterministic)
    return self.Dense_1(h)


class PortEncoderBlock(nnx.Module):
  def __init__(self, rngs):
    self.LayerNorm_0 = nnx.LayerNorm(D, rngs=rngs)
    self.MlpBlock_0 = PortMlpBlock(rngs)
    self.LayerNorm_1 = nnx.LayerNorm(D, rngs=rngs)

  def __call__(self, x, deterministic):
    x = x + self.MlpBlock_0(self.LayerNorm_0(x), deterministic)
    return self.LayerNorm_1(x), None


class PortEncoder(nnx.Module):
  """The blocks as an nnx.vmap stack run by nnx.scan through nnx.remat.

  `unbound`: the remat wraps the class's own function (`PortEncoderBlock.__call__`, as a
  drafted port writes `nn.remat(Block)`), so the block is called without its instance's
  `__call__`: only the modules inside it are seen being called.
  """

  def __init__(self, rngs, *, unbound=True):
    @nnx.split_rngs(splits=VIT_L)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def create(rngs):
      return PortEncoderBlock(rngs)

    self.encoderblock = create(rngs)
    self.encoder_norm = nnx.LayerNorm(D, rngs=rngs)
    self.unbound = unbound

  def __call__(self, x, train=False):
    if self.unbound:
      block = nnx.remat(PortEncoderBlock.__call__, prevent_cse=False, static_argnums=(2,))
    else:
      block = nnx.remat(lambda layer, x, det: layer(x, det), prevent_cse=False, static_argnums=(2,))
    x, _ = nnx.scan(
      lambda layer, carry: block(layer, carry, not train),
      in_axes=(0, nnx.Carry),
      out_axes=(nnx.Carry, 0),
    )(self.encoderblock, x)
    return self.encoder_norm(x)


def encoder_setup():
  return stack_setup(Encoder(), (2, 3, D))  # (batch, tokens, width)


def load_encoder_port(port, params, *, bug_layer=None):
  """Copy Linen's params into the port by their equal paths; 0.5 added to one layer's
  MlpBlock_0/Dense_0 bias."""
  for path, node in _compat.iter_graph(port):
    if isinstance(node, nnx.Param):
      value = params
      for name in path:
        value = value[str(name)]
      value = np.array(value)
      if bug_layer is not None and tuple(map(str, path[-3:])) == ("MlpBlock_0", "Dense_0", "bias"):
        value[bug_layer] += 0.5
      _set(node, value)
  return port


def linen_encoder_layers(params, x):
  """Each layer's (MlpBlock_0/Dense_0, MlpBlock_0, block) outputs by plain Linen apply."""
  out = []
  for i in range(VIT_L):
    p = jax.tree.map(lambda a, i=i: a[i], params["encoderblock"])
    y = nn.LayerNorm().apply({"params": p["LayerNorm_0"]}, x)
    up = nn.Dense(H).apply({"params": p["MlpBlock_0"]["Dense_0"]}, y)
    mlp = nn.Dense(D).apply({"params": p["MlpBlock_0"]["Dense_1"]}, nn.gelu(up))
    x = nn.LayerNorm().apply({"params": p["LayerNorm_1"]}, x + mlp)
    out.append((up, mlp, x))
  return out


def port_encoder_layers(port, x):
  """The same per layer from the port's own layers, called one by one."""
  out = []
  for i in range(VIT_L):
    block = lb.layers.layer(port.encoderblock, i)
    up = block.MlpBlock_0.Dense_0(block.LayerNorm_0(x))
    mlp = block.MlpBlock_0(block.LayerNorm_0(x))
    x = block(x, True)[0]
    out.append((up, mlp, x))
  return out


@pytest.mark.parametrize("unbound", [True, False], ids=["block's class function", "bound block"])
def test_scanned_remat_block_with_a_nested_submodule_pairs_layer_by_layer(unbound):
  x, variables = encoder_setup()
  port = load_encoder_port(PortEncoder(nnx.Rngs(0), unbound=unbound), variables["params"])
  # the independent reference: plain Linen per layer, and the whole model
  ref, cand = linen_encoder_layers(variables["params"], x), port_encoder_layers(port, x)
  for a_layer, b_layer in zip(ref, cand):
    for a, b in zip(a_layer, b_layer):
      np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(port(x), Encoder().apply(variables, x), rtol=RTOL, atol=ATOL)
  report = lb.compare((Encoder(), variables), port, x)
  assert report.ok, str(report)
  layered = [p for p in report.pairs if p.reference_layer is not None]
  assert {p.reference_stack for p in layered} == {"encoderblock"}, str(report)
  assert {p.candidate_stack for p in layered} == {"encoderblock"}, str(report)
  assert [p.candidate_layer for p in layered] == [p.reference_layer for p in layered]
  assert sorted({p.reference_layer for p in layered}) == list(range(VIT_L))
  paths = [(p.reference_path, p.candidate_path) for p in report.pairs]
  for i in range(VIT_L):
    assert (f"encoderblock[{i}]/MlpBlock_0/Dense_0",) * 2 in paths, str(report)
    assert (f"encoderblock[{i}]/MlpBlock_0",) * 2 in paths, str(report)
  # A block run through its class's function makes no call of its own to pair with Linen's.
  blocks = [f"encoderblock[{i}]" for i in range(VIT_L)] if unbound else []
  assert [c.path for c in report.unmatched_reference] == blocks, str(report)
  assert not report.unmatched_candidate, str(report)
  assert not report.not_recorded_reference and not report.not_recorded_candidate


def test_bug_in_a_nested_submodule_of_a_scanned_remat_block_is_reported_at_its_layer():
  x, variables = encoder_setup()
  port = load_encoder_port(PortEncoder(nnx.Rngs(0)), variables["params"], bug_layer=1)
  # the independent reference: layer 0 agrees; layer 1's MlpBlock_0/Dense_0 does not
  ref, cand = linen_encoder_layers(variables["params"], x), port_encoder_layers(port, x)
  for a, b in zip(ref[0], cand[0]):
    np.testing.assert_allclose(b, a, rtol=RTOL, atol=ATOL)
  assert not np.allclose(cand[1][0], ref[1][0], rtol=RTOL, atol=ATOL)
  report = lb.compare((Encoder(), variables), port, x)
  divergence = report.first_divergence
  assert divergence is not None and divergence.kind == "values", str(report)
  before = [p for p in report.pairs if p.reference_layer == 0]
  assert before and all(p.status == "ok" and p.candidate_layer == 0 for p in before), str(report)
  assert (divergence.reference_stack, divergence.reference_layer) == ("encoderblock", 1)
  assert (divergence.candidate_stack, divergence.candidate_layer) == ("encoderblock", 1)
  assert (divergence.reference_path, divergence.candidate_path) == (
    ("encoderblock[1]/MlpBlock_0/Dense_0",) * 2
  ), str(report)
  assert "layer 1 of the candidate's stack encoderblock" in str(report)


def test_the_running_trace_tells_one_tracing_from_another():
  """compare groups a body's calls by the jax trace they run in: a jax whose trace state
  stopped telling tracings apart would fail here, not silently split a stack's layers again."""
  seen = []

  def body(x):
    seen.append(_compat.current_trace())
    seen.append(_compat.current_trace())
    return x

  jax.jit(body)(1.0)
  jax.jit(lambda x: body(x) + 1)(1.0)
  assert len(seen) == 4
  assert seen[0] == seen[1] and seen[2] == seen[3] and seen[0] != seen[2]


def test_jitted_port_is_recorded_inside_on_every_compare(setup):
  """`nnx.jit` on the port's `__call__`: its calls are traced, and a second compare retraces."""
  x, variables = setup

  class JittedPort(Port):
    @nnx.jit
    def __call__(self, x):  # pyright: ignore[reportIncompatibleMethodOverride]  (a jitted method)
      return super().__call__(x)

  rngs = nnx.Rngs(0)
  port = JittedPort(rngs=rngs, blocks=[PortBlock(D, H, rngs=rngs) for _ in range(2)])
  load(port, variables["params"], transpose=("head",))
  for _ in range(2):
    report = lb.compare((Net(), variables), port, x)
    assert [p.candidate_path for p in report.pairs] == ORDER, str(report)
    assert report.first_divergence is not None
    assert report.first_divergence.candidate_path == "head"


def test_no_callback_is_placed_in_nn_scans_broadcast_pass(monkeypatch):
  # Linen's nn.scan first traces its body under partial evaluation to find the broadcast
  # outputs; that staged body never runs. On jax 0.11 an ordered callback placed there makes
  # flax raise "broadcasted variable has a data dependency on the scan body" (seen on a GPU
  # image with jax 0.11.2), so compare must place its per-layer callbacks in the real scan only.
  placed = []
  callback = jax.debug.callback

  def spy(fn, *args, **kwargs):
    placed.append(_compat.in_linen_scan_broadcast_pass())
    return callback(fn, *args, **kwargs)

  monkeypatch.setattr(jax.debug, "callback", spy)
  x, variables = stack_setup(ScanNet())
  report = lb.compare((ScanNet(), variables), (ScanNet(), variables), x)
  assert report.ok and not report.not_recorded_reference, str(report)
  assert placed and not any(placed)  # callbacks were placed, none in the broadcast pass
  assert [p.reference_layer for p in report.pairs if p.reference_stack] == [
    i for i in range(L) for _ in range(3)
  ]


def test_the_broadcast_pass_is_recognised_by_its_frame_and_by_its_tracers():
  # Can fail: both ways of telling the broadcast pass must see it, and only it.
  seen = []

  class Probe(nn.Module):
    @nn.compact
    def __call__(self, c, _):
      y = nn.Dense(D)(c)
      seen.append((_compat.in_linen_scan_broadcast_pass(), _compat.is_partial_eval_tracer(y)))
      return y, None

  class Scanned(nn.Module):
    @nn.compact
    def __call__(self, x):
      stack = nn.scan(Probe, variable_axes={"params": 0}, split_rngs={"params": True}, length=2)
      return stack()(x, None)[0]

  x = jnp.ones((2, D))
  variables = Scanned().init(jax.random.key(0), x)
  seen.clear()
  Scanned().apply(variables, x)
  assert seen[0][0] and not seen[-1][0] and not _compat.in_linen_scan_broadcast_pass()
  assert not seen[-1][1]  # the real scan's body is no partial-evaluation trace
