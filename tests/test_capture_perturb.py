"""`capture_intermediates` on lb.ToNNX, and `perturb` sites (Linen and NNX) inside recording loops.

References: plain Linen `apply(..., capture_intermediates=..., mutable=['intermediates'])` step by
step; for gradients, `jax.grad` of a Python loop of plain Linen applies (or plain NNX calls)
with respect to the perturbation values. Compiled loops vs eager steps: RTOL/ATOL below.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import loopbridge as lb
from loopbridge import _compat

from conftest import graph_kw
from models import MLP, linen_feedback_steps, stack_reference

RTOL, ATOL = 1e-5, 1e-6
val = _compat.variable_value  # Variable contents on every flax (0.12 deprecates `.value`)


def linen_variables(model: lb.ToNNX) -> dict:
  return lb.linen_variables(model)


class CapNet(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.relu(nn.Dense(4)(x))
    return nn.Dense(3)(h)


def run_fori(model, x, steps, graph=True):
  @nnx.jit
  def run(model, x):
    return nnx.fori_loop(0, steps, lambda i, c: (c[0], c[0](c[1])), (model, x), **graph_kw(graph))

  return run(model, x)


def test_capture_intermediates_true_records_every_call_output(graph):
  steps = 3
  x = jnp.linspace(-1, 1, 6).reshape(2, 3)
  model = lb.ToNNX(CapNet(), rngs=nnx.Rngs(0), capture_intermediates=True)
  lb.lazy_init(model, x, capacity=steps)
  model, _ = run_fori(model, x, steps, graph)
  inters = linen_feedback_steps(CapNet(), linen_variables(model), x, steps, True)
  rec = lb.recorded(model)["intermediates"]
  assert sorted(rec) == ["Dense_0", "Dense_1", "__call__"]
  for path in (("Dense_0", "__call__"), ("Dense_1", "__call__"), ("__call__",)):
    got = rec
    for key in path:
      got = got[key]
    np.testing.assert_allclose(got, stack_reference(inters, path), rtol=RTOL, atol=ATOL)


def test_capture_filter_inside_scan_with_user_sows():
  steps = 2
  x = jnp.linspace(-1, 1, 4).reshape(1, 4)

  def only_dense(module, method_name):
    return isinstance(module, nn.Dense)

  model = lb.ToNNX(MLP(depth=2, features=4), rngs=nnx.Rngs(0), capture_intermediates=only_dense)
  lb.lazy_init(model, x, capacity=steps)
  model, _ = run_fori(model, x, steps)
  inters = linen_feedback_steps(
    MLP(depth=2, features=4), linen_variables(model), x, steps, only_dense
  )
  rec = lb.recorded(model)["intermediates"]
  want = stack_reference(inters, ("ScanBlock_0", "Dense_0", "__call__"))
  assert want.shape == (steps, 2, 1, 4)  # stacked along the nn.scan axis, as Linen returns it
  np.testing.assert_allclose(rec["ScanBlock_0"]["Dense_0"]["__call__"], want, rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(
    rec["ScanBlock_0"]["carry"],
    stack_reference(inters, ("ScanBlock_0", "carry")),
    rtol=RTOL,
    atol=ATOL,
  )


def test_capture_true_records_the_scan_body_tuple_leaf_by_leaf(graph):
  # The MLP's scan Block returns (carry, None): Linen captures that tuple, stacked along the
  # nn.scan axis; the array leaf gets a buffer and reads back inside the same tuple.
  steps = 3
  x = jnp.linspace(-1, 1, 4).reshape(1, 4)
  model = lb.ToNNX(MLP(depth=2, features=4), rngs=nnx.Rngs(0), capture_intermediates=True)
  lb.lazy_init(model, x, capacity=steps)
  model, _ = run_fori(model, x, steps, graph)
  inters = linen_feedback_steps(MLP(depth=2, features=4), linen_variables(model), x, steps, True)
  got = lb.recorded(model)["intermediates"]["ScanBlock_0"]["__call__"]
  assert isinstance(got, tuple) and len(got) == 2 and got[1] is None
  want = jnp.stack([t["ScanBlock_0"]["__call__"][0][0] for t in inters])
  assert want.shape == got[0].shape == (steps, 2, 1, 4)
  np.testing.assert_allclose(got[0], want, rtol=RTOL, atol=ATOL)


def test_capture_of_non_array_leaves_is_a_clear_error():
  class Labelled(nn.Module):
    @nn.compact
    def __call__(self, x):
      return nn.Dense(2)(x), "a label"  # a string is a leaf no buffer can hold

  class Net(nn.Module):
    @nn.compact
    def __call__(self, x):
      return Labelled()(x)[0]

  model = lb.ToNNX(Net(), rngs=nnx.Rngs(0), capture_intermediates=True)
  with pytest.raises(lb.NotDeclaredError, match=r"non-array values.*one buffer per array leaf"):
    lb.lazy_init(model, jnp.ones((1, 4)), capacity=2)


# ------------------------------------------------------------------------------ Linen perturb
class Perturbed(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.Dense(3)(x)
    h = self.perturb("h", h)
    self.sow("intermediates", "h", h)
    return jnp.tanh(h)


def test_linen_perturb_gradient_through_recording_fori_loop():
  steps = 3
  x = jnp.linspace(-1, 1, 6).reshape(2, 3)
  model = lb.lazy_init(lb.ToNNX(Perturbed(), rngs=nnx.Rngs(0)), x, capacity=steps)
  np.testing.assert_array_equal(val(model.h), jnp.zeros((2, 3)))  # exists after init, zero
  perturbation = type(model.h)

  def loss(model, x):
    model, y = nnx.fori_loop(0, steps, lambda i, c: (c[0], c[0](c[1])), (model, x))
    return jnp.sum(y**2)

  grads = nnx.grad(loss, argnums=nnx.DiffState(0, perturbation))(model, x)

  variables = linen_variables(model)

  def ref_loss(pert, x):
    for _ in range(steps):
      x = Perturbed().apply({"params": variables["params"], "perturbations": pert}, x)
    return jnp.sum(x**2)

  want = jax.grad(ref_loss)(variables["perturbations"], x)
  np.testing.assert_allclose(val(grads["h"]), want["h"], rtol=RTOL, atol=ATOL)
  assert float(jnp.abs(want["h"]).sum()) > 0  # a real gradient, not a zero check
  # The loop under grad recorded its sows (the buffers are state the grad hands back).
  _, inter = Perturbed().apply(variables, x, mutable=["intermediates"])
  rec = lb.recorded(model)["intermediates"]["h"]
  assert rec.shape == (steps, 2, 3)
  np.testing.assert_allclose(rec[0], inter["intermediates"]["h"][0], rtol=RTOL, atol=ATOL)


# -------------------------------------------------------------------------------- NNX perturb
needs_nnx_perturb = pytest.mark.skipif(
  not hasattr(nnx.Module, "perturb"),
  reason=f"flax {'.'.join(map(str, _compat.FLAX_VERSION))} has no nnx.Module.perturb "
  "(flax 0.12.8 has it)",
)


class NativePerturbed(nnx.Module):
  def __init__(self, rngs):
    self.lin = nnx.Linear(3, 3, rngs=rngs)

  def __call__(self, x):
    h = self.perturb("h", self.lin(x))
    self.sow(nnx.Intermediate, "act", h)  # NNX keeps both as attributes: names must differ
    return jnp.tanh(h)


@needs_nnx_perturb
@pytest.mark.filterwarnings(
  # flax 0.12 deprecates `perturb`/`sow` outside `nnx.capture`; models ported from 0.10
  # still call them that way, which is the case under test (and the reference).
  "ignore:\\s*Using 'Module\\.(perturb|sow)\\(\\)' outside:DeprecationWarning"
)
def test_nnx_perturb_gradient_through_recording_fori_loop():
  steps = 3
  x = jnp.linspace(-1, 1, 6).reshape(2, 3)
  model = lb.preallocate(NativePerturbed(nnx.Rngs(0)), x, capacity=steps)
  np.testing.assert_array_equal(val(model.h), jnp.zeros((2, 3)))  # zero Perturbation exists

  def loss(model, x):
    model, y = nnx.fori_loop(0, steps, lambda i, c: (c[0], c[0](c[1])), (model, x))
    return jnp.sum(y**2)

  grads = nnx.grad(loss, argnums=nnx.DiffState(0, nnx.Perturbation))(model, x)

  ref = NativePerturbed(nnx.Rngs(0))
  ref(x)  # flax creates the zero perturbation on the first call
  del ref.act  # keep only parameters and the perturbation
  graphdef, pert, rest = nnx.split(ref, nnx.Perturbation, ...)

  def ref_loss(pert, x):
    m = nnx.merge(graphdef, pert, rest)
    for _ in range(steps):
      x = m(x)
    return jnp.sum(x**2)

  want = jax.grad(ref_loss)(pert, x)
  np.testing.assert_allclose(val(grads["h"]), val(want["h"]), rtol=RTOL, atol=ATOL)
  assert float(jnp.abs(val(want["h"])).sum()) > 0
  assert lb.recorded(model)["intermediates"]["act"].shape == (steps, 2, 3)
