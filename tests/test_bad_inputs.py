"""The bad-input catalog: every way to misuse the public API gets a clear error.

One parametrized test. Each case: what the user does, the exception type, and a `match=` on
the message covering what went wrong and the fix (and, where the message gives one, why).
The case needing a device mesh that does not divide the batch is marked `sharding`; it runs in
the 8-device process (see SHARDING_COMMAND in conftest.py) and is skipped elsewhere.
"""

from __future__ import annotations

import dataclasses
import typing as tp

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb
from loopbridge._core import recorder as _recorder

from conftest import SHARDING_COMMAND, SHARDING_DEVICES


class Inner(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(3)(x)
    self.sow("intermediates", "h", h)
    return h


class Net(nn.Module):
  """Two sow sites: intermediates/x and intermediates/Inner_0/h."""

  @nn.compact
  def __call__(self, x):
    self.sow("intermediates", "x", x)
    return Inner()(x)

  def encode(self, x):
    return x


class GrowsCache(nn.Module):
  """Creates a 'cache' variable only for batches larger than one: a later call adds state."""

  @nn.compact
  def __call__(self, x):
    if x.shape[0] > 1:
      self.variable("cache", "seen", jnp.zeros, x.shape)
    return x


X = jnp.ones((1, 2))


def _model(capacity: tp.Any = 2, overflow: str = "error", module: nn.Module | None = None):
  model = lb.ToNNX(module or Net(), rngs=nnx.Rngs(0))
  return lb.lazy_init(model, X, capacity=capacity, overflow=overflow)


def _overflowed_read():
  model = _model(capacity=1)
  model(X)
  model(X)
  return lb.recorded(model)


def _traced_capacity():
  return jax.jit(lambda c: lb.ToNNX(Net(), capacity=c) and 0)(3)


def _checkpoint_mismatch(tmp_path):
  path = lb.checkpoint.save(tmp_path / "c", _model(capacity=2))
  return lb.checkpoint.restore(path, _model(module=GrowsCache()))  # another module


def _checkpoint_other_policy(tmp_path):
  path = lb.checkpoint.save(tmp_path / "c", _model(capacity=2))
  return lb.checkpoint.restore(path, _model(capacity=2, overflow="wrap"))


def _checkpoint_smaller(tmp_path):
  path = lb.checkpoint.save(tmp_path / "c", _model(capacity=3))
  return lb.checkpoint.restore(path, _model(capacity=2))


def _checkpoint_grown_after_overflow(tmp_path):
  model = _model(capacity=1, overflow="wrap")
  model(X)
  model(X)
  path = lb.checkpoint.save(tmp_path / "c", model)
  return lb.checkpoint.restore(path, _model(capacity=4, overflow="wrap"))


def _checkpoint_damaged(tmp_path):
  path = lb.checkpoint.save(tmp_path / "c", _model())
  with open(f"{path}/_CHECKPOINT_METADATA", "wb") as f:
    f.write(b"\xff\xfe")
  return lb.checkpoint.restore(path, _model())


def _checkpoint_empty_directory(tmp_path):
  (tmp_path / "empty").mkdir()
  return lb.checkpoint.restore(tmp_path / "empty", _model())


def _uneven_mesh():
  from jax.sharding import Mesh
  from jax.sharding import PartitionSpec as P

  mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
  model = lb.lazy_init(lb.ToNNX(Net(), rngs=nnx.Rngs(0)), jnp.ones((6, 2)), capacity=2)
  return lb.sharding.shard_buffers(model, P("data"), mesh=mesh)


def _dtype_drift():
  model = _model()
  return model(X.astype(jnp.bfloat16))


def _loop_writes_outside_carry():
  model = _model()
  return lb.fori_loop(0, 2, lambda i, x: (model(x), x)[1], X)


def _second_site_mismatch():
  class Branchy(nn.Module):
    @nn.compact
    def __call__(self, x):
      self.sow("intermediates", "a", x[:1])  # the same shape for every batch size
      self.sow("intermediates", "b", x)
      return x

  model = lb.lazy_init(lb.ToNNX(Branchy(), rngs=nnx.Rngs(0)), X, capacity=2)
  return model(jnp.ones((2, 2)))


def _count_at_int32_limit():
  from loopbridge._core import buffers as _buffers

  model = _model(capacity=2, overflow="wrap")
  (site,) = [s for s in _recorder.sites_of(model) or () if s.key == ("intermediates", "x")]
  _buffers.set_site_count(model.loopbridge__counts, site.count_index, _buffers.COUNT_LIMIT)
  return lb.recorded(model)


def _native_sow_without_buffer():
  class Switch(nnx.Module):
    def __call__(self, x, other=False):
      self.sow(nnx.Intermediate, "other" if other else "h", x)
      return x

  model = lb.preallocate(Switch(), X, capacity=2)
  return model(X, other=True)


def _native_without_capacity():
  class Sows(nnx.Module):
    def __call__(self, x):
      self.sow(nnx.Intermediate, "h", x)
      return x

  return lb.preallocate(Sows(), X)


class _CliExit(Exception):
  """The command line's exit status and stderr, raised so the catalog can match them."""


def _compile_step_inside_jit():
  model = _model(capacity=4)
  step = lb.compile_step(lambda m, x: m(x), model)
  return jax.jit(step)(X)


def _cli_exit_code(*argv):
  import contextlib
  import io

  from loopbridge._cli.main import main

  err = io.StringIO()
  with contextlib.redirect_stderr(err):
    code = main(list(argv))
  raise _CliExit(f"exit {code}: {err.getvalue().strip()}")


@dataclasses.dataclass(frozen=True)
class Case:
  run: tp.Callable[..., tp.Any]
  error: type[BaseException]
  match: str
  needs_tmp: bool = False


CASES: dict[str, Case] = {
  "capacity-zero": Case(
    lambda: _model(capacity=0),
    lb.CapacityError,
    r"capacity must be a positive int, got 0.*Pass a positive int",
  ),
  "capacity-float": Case(
    lambda: _model(capacity=2.5), lb.CapacityError, r"got 2\.5 of type float.*Pass a positive int"
  ),
  "capacity-bool": Case(lambda: _model(capacity=True), lb.CapacityError, r"got True of type bool"),
  "capacity-negative-in-mapping": Case(
    lambda: _model(capacity={"intermediates": -1}),
    lb.CapacityError,
    r"capacity\['intermediates'\] must be a positive int, got -1",
  ),
  "capacity-key-matches-nothing": Case(
    lambda: _model(capacity={"intermediates": 2, "Innr_0/h": 3}),
    lb.CapacityError,
    r"\['Innr_0/h'\] match no sow site.*usually a typo.*sites of this call are",
  ),
  "capacity-glob-matches-nothing": Case(
    lambda: _model(capacity={"intermediates": 2, "Decoder_*/*": 3}),
    lb.CapacityError,
    r"\['Decoder_\*/\*'\] match no sow site",
  ),
  "capacity-site-not-covered": Case(
    lambda: _model(capacity={"x": 2}),
    lb.CapacityError,
    r"no capacity key covers sow site\(s\) intermediates/Inner_0/h.*Fix: add a key",
  ),
  "capacity-traced": Case(
    _traced_capacity, lb.CapacityError, r"traced value.*outside jit.*Fix: pass a plain Python int"
  ),
  "overflow-unknown-name": Case(
    lambda: _model(overflow="ring"), lb.CapacityError, r"overflow='ring' is not a policy.*'wrap'"
  ),
  "call-before-init": Case(
    lambda: lb.ToNNX(Net(), rngs=nnx.Rngs(0))(X),
    lb.NotDeclaredError,
    r"called before it was initialized.*Why.*Fix: lb\.lazy_init",
  ),
  "mutable-call-before-init-without-capacity": Case(
    lambda: lb.ToNNX(Net(), rngs=nnx.Rngs(0))(X, mutable=True),
    lb.CapacityError,
    r"Net sows at 2 site\(s\).*no capacity was declared.*Why.*Fix",
  ),
  "preallocate-before-init": Case(
    lambda: lb.preallocate(lb.ToNNX(Net()), X, capacity=2),
    lb.NotDeclaredError,
    r"Fix: lb\.lazy_init",
  ),
  "sown-shape-drift": Case(
    lambda: _model()(jnp.ones((4, 2))),
    lb.NotDeclaredError,
    r"received a value of shape \(4, 2\).*declared for shape \(1, 2\)"
    r".*Why.*Fix.*lb\.preallocate",
  ),
  "sown-dtype-drift": Case(
    _dtype_drift,
    lb.NotDeclaredError,
    r"dtype bfloat16.*declared for shape \(1, 2\) and dtype float32",
  ),
  "new-variable-on-later-traced-call": Case(
    lambda: nnx.jit(lambda m, x: m(x, mutable=True))(_model(module=GrowsCache()), jnp.ones((2, 2))),
    lb.StructureChangeError,
    r"created the variable 'cache/seen', which did not exist after lazy_init, inside a "
    r"traced function.*Why.*Fix",
  ),
  "not-a-linen-module-nnx": Case(
    lambda: lb.ToNNX(nnx.Linear(2, 2, rngs=nnx.Rngs(0))),
    TypeError,
    r"got Linear\. It is an NNX module.*preallocate",
  ),
  "not-a-linen-module-class": Case(lambda: lb.ToNNX(Net), TypeError, r"Fix: pass an instance"),
  "not-a-linen-module-function": Case(
    lambda: lb.ToNNX(lambda x: x), TypeError, r"wraps a Linen module.*got function"
  ),
  "lazy-init-on-raw-linen": Case(
    lambda: lb.lazy_init(Net(), X, capacity=2), TypeError, r"Fix: wrap the Linen module first"
  ),
  "method-does-not-exist": Case(
    lambda: _model_method("decode"),
    AttributeError,
    r"method='decode' is not a method of the Linen module Net \(its methods: __call__, "
    r"encode\).*Why.*Fix: pass one of those names",
  ),
  "read-after-overflow-error-policy": Case(
    _overflowed_read,
    lb.BufferOverflowError,
    r"recorded 2 values but its buffer holds capacity=1.*Why.*Fix.*overflow='wrap'",
  ),
  "checkpoint-structure-mismatch": Case(
    _checkpoint_mismatch,
    lb.checkpoint.CheckpointError,
    r"does not match the model's structure: saved but not in the model: "
    r"Inner_0/Dense_0/bias.*Why.*Fix",
    needs_tmp=True,
  ),
  "checkpoint-other-overflow-policy": Case(
    _checkpoint_other_policy,
    lb.checkpoint.CheckpointError,
    r"declared differently from the model: .*intermediates/x: overflow saved 'error' vs "
    r"model 'wrap'.*Why.*Fix",
    needs_tmp=True,
  ),
  "checkpoint-smaller-capacity": Case(
    _checkpoint_smaller,
    lb.checkpoint.CheckpointError,
    r"capacity saved 3 vs model 2 \(smaller.*Why.*Fix",
    needs_tmp=True,
  ),
  "checkpoint-larger-capacity-after-overflow": Case(
    _checkpoint_grown_after_overflow,
    lb.checkpoint.CheckpointError,
    r"cannot be restored into a larger capacity: .*had 2 values sown into capacity 1.*Fix",
    needs_tmp=True,
  ),
  "checkpoint-damaged-metadata": Case(
    _checkpoint_damaged,
    lb.checkpoint.CheckpointError,
    r"cannot restore the checkpoint at .*/c: its step metadata.*UnicodeDecodeError.*Why.*"
    r"Fix",
    needs_tmp=True,
  ),
  "checkpoint-empty-directory": Case(
    _checkpoint_empty_directory,
    lb.checkpoint.CheckpointError,
    r"no checkpoint at .*empty: the directory is empty.*Fix",
    needs_tmp=True,
  ),
  "checkpoint-path-does-not-exist": Case(
    lambda: lb.checkpoint.restore("/nonexistent/checkpoint", _model()),
    lb.checkpoint.CheckpointError,
    r"no checkpoint at /nonexistent/checkpoint: the path does not exist.*Fix",
  ),
  "loop-body-writes-outside-carry": Case(
    _loop_writes_outside_carry,
    lb.StructureChangeError,
    r"lb.fori_loop: the body writes to a module it reaches outside the loop carry "
    r"\(ToNNX.*Why.*Fix: pass that module in the carry",
  ),
  "cli-arg-dtype-jax-cannot-hold": Case(
    lambda: _cli_exit_code("inspect", "--arg", "object[1]"),
    _CliExit,
    r"exit 2: .*--arg 'object\[1\]': JAX arrays cannot have dtype 'object'.*use a number",
  ),
  "linen-variables-bare-params": Case(
    lambda: lb.checkpoint.from_linen_variables(
      Net(), Net().init(jax.random.key(0), X)["params"], X
    ),
    lb.checkpoint.CheckpointError,
    r"bare params tree: pass \{'params': params\}.*Fix",
  ),
  "linen-variables-with-capacity": Case(
    lambda: lb.checkpoint.from_linen_variables(
      Net(), Net().init(jax.random.key(0), X), X, capacity=2
    ),
    TypeError,
    r"takes no capacity=.*Why: one place declares capacity.*"
    r"Fix: .*lb\.preallocate\(model, \*args, capacity=\.\.\.\)",
  ),
  "shard-spec-without-mesh": Case(
    lambda: lb.sharding.shard_buffers(_model(), jax.sharding.PartitionSpec("data")),
    lb.sharding.ShardingError,
    r"no mesh.*Fix: pass lb\.sharding\.shard_buffers\(model, spec, mesh=mesh\)",
  ),
  "shard-key-matches-nothing": Case(
    lambda: lb.sharding.shard_buffers(_model(), {"y": None}),
    lb.sharding.ShardingError,
    r"key\(s\) \['y'\] name no buffer.*are: \['intermediates/Inner_0/h', 'intermediates/x'\]",
  ),
  "call-fails-at-second-site": Case(
    _second_site_mismatch,
    lb.NotDeclaredError,
    r"sow site intermediates/b received a value of shape \(2, 2\).*Fix: declare buffers",
  ),
  "count-at-int32-limit": Case(
    _count_at_int32_limit,
    lb.BufferOverflowError,
    r"largest count an int32 holds.*Fix: call lb.reset\(model\)",
  ),
  "read-before-declaring": Case(
    lambda: lb.recorded(lb.ToNNX(Net(), rngs=nnx.Rngs(0))),
    lb.NotDeclaredError,
    r"lb.ToNNX\(Net\) has not declared its buffers yet.*Fix: lb.lazy_init",
  ),
  "read-a-plain-nnx-module": Case(
    lambda: lb.counts(nnx.Linear(2, 2, rngs=nnx.Rngs(0))),
    lb.NotDeclaredError,
    r"Linear holds no loopbridge buffers.*Fix:.*lb.preallocate",
  ),
  "capacity-beyond-memory": Case(
    lambda: _model(capacity=10**13),
    lb.CapacityError,
    r"need [\d,]+ bytes per device but only [\d,]+ bytes.*Fix: a smaller capacity",
  ),
  "native-sow-without-buffer": Case(
    _native_sow_without_buffer,
    lb.NotDeclaredError,
    r"Switch: intermediates/other was sown, but this module has no buffer.*Fix: declare it",
  ),
  "native-sows-without-capacity": Case(
    _native_without_capacity,
    lb.CapacityError,
    r"Sows sows at 1 site\(s\) \(intermediates/h\) but no capacity was declared.*Fix",
  ),
  "compile-step-called-inside-jax-jit": Case(
    _compile_step_inside_jit,
    lb.StructureChangeError,
    r"lb.compile_step was called inside a traced function \(jax.jit.*while its model lives "
    r"outside it.*Why: the step updates the model in place.*Fix: call the step from Python",
  ),
  "mesh-does-not-divide-batch": Case(
    _uneven_mesh,
    lb.sharding.ShardingError,
    r"axis 0 \(size 6\) is split over mesh axes 'data' of total size 4, which does not "
    r"divide 6.*Fix: make that axis \(e\.g\. the batch\) a multiple of 4",
  ),
}

NEEDS_MESH = {"mesh-does-not-divide-batch"}


def _model_method(name):
  model = lb.ToNNX(Net(), rngs=nnx.Rngs(0))
  return lb.lazy_init(model, X, capacity=2, method=name)


def _params():
  for name, case in CASES.items():
    marks = []
    if name in NEEDS_MESH:
      marks = [
        pytest.mark.sharding,
        pytest.mark.skipif(
          jax.device_count() < SHARDING_DEVICES,
          reason=f"needs {SHARDING_DEVICES} devices; run: {SHARDING_COMMAND}",
        ),
      ]
    yield pytest.param(case, id=name, marks=marks)


@pytest.mark.parametrize("case", list(_params()))
def test_bad_input_raises_a_clear_error(case: Case, tmp_path):
  with pytest.raises(case.error, match=case.match):
    case.run(tmp_path) if case.needs_tmp else case.run()


# ------------------------------------------------------------------ round 3: more bad inputs
# Kept in their own block (and test) so that other additions to CASES merge without conflict.


class _SowsTypedKey(nn.Module):
  @nn.compact
  def __call__(self, x):
    self.sow("intermediates", "key", jax.random.key(0))
    return x


class _NativeSowsTypedKey(nnx.Module):
  def __call__(self, x):
    self.sow(nnx.Intermediate, "key", jax.random.key(0))
    return x


def _linears(n=2):
  return [nnx.Linear(2, 2, rngs=nnx.Rngs(i)) for i in range(n)]


def _port_without_bias_cli(tmp_path):
  import sys

  (tmp_path / "lb_catalog_port.py").write_text(
    "import flax.linen as nn\n"
    "from flax import nnx\n"
    "class Mlp(nn.Module):\n"
    "  @nn.compact\n"
    "  def __call__(self, x):\n"
    "    return nn.Dense(3, name='Dense_1')(nn.Dense(4, name='Dense_0')(x))\n"
    "class Port(nnx.Module):\n"
    "  def __init__(self, rngs):\n"
    "    self.Dense_0 = nnx.Linear(2, 4, rngs=rngs)\n"
    "    self.Dense_1 = nnx.Linear(4, 3, use_bias=False, rngs=rngs)\n"
    "  def __call__(self, x):\n"
    "    return self.Dense_1(self.Dense_0(x))\n"
  )
  sys.path.insert(0, str(tmp_path))
  try:
    return _cli_exit_code(
      "compare", "lb_catalog_port:Mlp", "lb_catalog_port:Port", "--arg", "float32[1,2]"
    )
  finally:
    sys.path.remove(str(tmp_path))
    sys.modules.pop("lb_catalog_port", None)


def _save_twice(tmp_path):
  lb.checkpoint.save(tmp_path / "c", _model())
  return lb.checkpoint.save(tmp_path / "c", _model())


MORE_CASES: dict[str, Case] = {
  "capacity-array": Case(
    lambda: _model(capacity=jnp.ones(2)),
    lb.CapacityError,
    r"capacity must be a positive int, got a float32 array of shape \(2,\).*single integer"
    r".*Pass a positive int",
  ),
  "capacity-string": Case(
    lambda: _model(capacity="8"),
    lb.CapacityError,
    r"got '8' of type str.*Pass a positive int for every sow site \(capacity=8\)",
  ),
  "capacity-empty-mapping": Case(
    lambda: _model(capacity={}), lb.CapacityError, r"capacity=\{\} declares nothing.*Pass"
  ),
  "capacity-key-not-a-string": Case(
    lambda: _model(capacity={1: 2}),
    lb.CapacityError,
    r"capacity key 1 must be a non-empty string \(a collection name.*Pass",
  ),
  "capacity-block-negative": Case(
    lambda: lb.capacity(-1).__enter__(),
    lb.CapacityError,
    r"capacity must be a positive int, got -1: a buffer needs room for at least one value",
  ),
  "overflow-unknown-in-constructor": Case(
    lambda: lb.ToNNX(Net(), rngs=nnx.Rngs(0), overflow="Wrap"),
    lb.CapacityError,
    r"overflow='Wrap' is not a policy.*Choose one of 'error'.*'drop'.*'wrap'",
  ),
  "to-nnx-rngs-an-int": Case(
    lambda: lb.ToNNX(Net(), rngs=0),
    TypeError,
    r"rngs= must be an nnx\.Rngs.*got int\. Why: .*streams\. Fix: rngs=nnx\.Rngs\(0\)",
  ),
  "to-nnx-capture-intermediates-a-string": Case(
    lambda: lb.ToNNX(Net(), rngs=nnx.Rngs(0), capture_intermediates="yes"),
    TypeError,
    r"capture_intermediates= must be True, False or a filter function.*got 'yes'\. Fix",
  ),
  "preallocate-method-of-wrong-type": Case(
    lambda: lb.preallocate(_model(), X, capacity=2, method=123),
    TypeError,
    r"lb\.preallocate: method= must be the name of a method of the Linen module or the "
    r"function itself.*got int",
  ),
  "sow-typed-prng-key": Case(
    lambda: lb.lazy_init(lb.ToNNX(_SowsTypedKey(), rngs=nnx.Rngs(0)), X, capacity=2),
    lb.NotDeclaredError,
    r"sow site intermediates/key sows a typed PRNG key \(key<fry>.*Why: record buffers hold "
    r"numeric arrays.*Fix: .*jax\.random\.key_data\(key\).*wrap_key_data",
  ),
  "native-sow-typed-prng-key": Case(
    lambda: lb.preallocate(_NativeSowsTypedKey(), X, capacity=2),
    lb.NotDeclaredError,
    r"native sow site intermediates/key sows a typed PRNG key.*Why.*Fix: .*key_data",
  ),
  "stack-no-modules": Case(
    lambda: lb.layers.stack([]),
    lb.layers.StackError,
    r"lb\.layers\.stack got no modules: pass a non-empty list of NNX modules",
  ),
  "stack-params-empty-list": Case(
    lambda: lb.layers.stack_params([]),
    lb.layers.StackError,
    r"stack_params got an empty list: there are no layers to stack.*Fix: pass the per-layer",
  ),
  "stack-params-a-name": Case(
    lambda: lb.layers.stack_params("layers"),
    lb.layers.StackError,
    r"stack_params takes per-layer params.*got str\. Fix: pass the params tree itself",
  ),
  "load-params-none": Case(
    lambda: lb.layers.load_params(None, _linears()),
    lb.layers.StackError,
    r"load_params takes per-layer params.*got NoneType\. Fix",
  ),
  "export-params-none": Case(
    lambda: lb.layers.export_params(None),
    lb.layers.StackError,
    r"export_params takes a layer stack.*got NoneType\. Fix: pass the stacked module",
  ),
  "layer-index-out-of-range": Case(
    lambda: lb.layers.layer(lb.layers.stack(_linears()), 5),
    IndexError,
    r"layer index 5 is out of range for a stack of 2 layers",
  ),
  "fori-loop-fractional-bound": Case(
    lambda: lb.fori_loop(0, 2.5, lambda i, c: c, X),
    TypeError,
    r"lb\.fori_loop: upper=2\.5 must be an integer.*Why: the bounds count loop steps.*"
    r"Fix: pass int\(upper\)",
  ),
  "fori-loop-arguments-out-of-order": Case(
    lambda: lb.fori_loop(0, 2, X, lambda i, c: c),
    TypeError,
    r"lb\.fori_loop: body_fn must be a function, got .*Note the order: "
    r"lb\.fori_loop\(lower, upper, body_fn, carry\)",
  ),
  "while-loop-condition-not-a-function": Case(
    lambda: lb.while_loop(True, lambda c: c, X),
    TypeError,
    r"lb\.while_loop: cond_fn must be a function, got bool.*lb\.while_loop\(cond_fn, body_fn",
  ),
  "explain-arguments-out-of-order": Case(
    lambda: lb.explain(X, lambda c: c),
    TypeError,
    r"lb\.explain: body_fn must be the loop step.*Note the order: lb\.explain\(body_fn, carry",
  ),
  "checkpoint-save-arguments-out-of-order": Case(
    lambda: lb.checkpoint.save(_model(), "/tmp/never-written"),
    lb.checkpoint.CheckpointError,
    r"lb\.checkpoint\.save: the directory must be a path.*got ToNNX; note the order: "
    r"lb\.checkpoint\.save\(directory, model\)",
  ),
  "checkpoint-save-over-existing": Case(
    _save_twice,
    lb.checkpoint.CheckpointError,
    r"lb\.checkpoint\.save: .*/c already exists\. Why: .*never done silently\. "
    r"Fix: pass overwrite=True",
    needs_tmp=True,
  ),
  "checkpoint-restore-path-none": Case(
    lambda: lb.checkpoint.restore(None, _model()),
    lb.checkpoint.CheckpointError,
    r"lb\.checkpoint\.restore: the directory must be a path \(a str or pathlib\.Path\), "
    r"got NoneType",
  ),
  "compare-linen-module-without-variables": Case(
    lambda: lb.compare(Net(), _model(), X),
    lb.CompareError,
    r"the reference is a Linen module without its variables.*Pass `\(Net\(\.\.\.\), variables\)`",
  ),
  "sow-sites-of-a-plain-nnx-module": Case(
    lambda: lb.sow_sites(nnx.Linear(2, 2, rngs=nnx.Rngs(0))),
    TypeError,
    r"lb\.sow_sites needs an lb\.ToNNX, got Linear\. Fix: wrap the Linen module",
  ),
  "cli-arg-dimension-beyond-int64": Case(
    lambda: _cli_exit_code("inspect", "--arg", "float32[99999999999999999999]"),
    _CliExit,
    r"exit 2: .*--arg 'float32\[99999999999999999999\]': 99999999999999999999 elements, more "
    r"than a JAX array can hold \(9223372036854775807, the int64 limit\); give the shape",
  ),
  "cli-compare-port-layer-without-bias": Case(
    _port_without_bias_cli,
    _CliExit,
    r"(?s)exit 1: .*the Linen param 'Dense_1/bias' has no Param in the port.*Why: the port's "
    r"layer 'Dense_1' has no 'bias' \(built with use_bias=False\?\).*Fix: build the port's "
    r"layer 'Dense_1' with use_bias=True",
    needs_tmp=True,
  ),
}


@pytest.mark.parametrize("case", [pytest.param(c, id=n) for n, c in MORE_CASES.items()])
def test_more_bad_inputs_raise_a_clear_error(case: Case, tmp_path):
  with pytest.raises(case.error, match=case.match):
    case.run(tmp_path) if case.needs_tmp else case.run()


def test_the_catalog_holds_at_least_60_cases():
  assert len(CASES) + len(MORE_CASES) >= 60
  assert not set(CASES) & set(MORE_CASES)
