"""What loopbridge reads of JAX's jaxprs survives JAX renaming it (jax 0.11 did).

jax 0.11.0 describes `scan`'s operands with FlatTree `ft_in`/`ft_out` instead of
`num_consts`/`num_carry` and made `jit`'s `inline` an enum; jax 0.11.1 hoists closed-over
constants into `jaxpr.invars`. Those jaxs cannot be installed here, so each change is simulated
on the jaxpr `lb.compile_step` reads: the real readers (`_compat.jaxpr_reading`) run on a
rewritten copy. The step must still run, its records must equal plain Linen applied step by step
(the independent reference), and the conservative fallback must really be taken: a parameter the
loop only carries is then donated (its old array deleted), which it is not without the change.
"""

from __future__ import annotations

import enum
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.extend import core as jex_core

import loopbridge as lb
from loopbridge import _compat
from loopbridge._compat import jaxpr_reading

from conftest import matmul_tolerance
from models import linen_feedback_steps, stack_reference
from models import recording_mlp as seed_model

RTOL, ATOL = matmul_tolerance(1e-5, 1e-6)


class _Inline(enum.Enum):  # jax 0.11's `jit` `inline` param is an enum, no longer a bool
  NEVER = 0


_UNKNOWN = jex_core.Primitive("loop_v2")  # a primitive a future jax might lower loops to
_LOOPS_AND_CALLS = ("while", "scan", "jit", "pjit", "closed_call")


def _scan_as_jax_0_11(eqn):
  if eqn.primitive.name != "scan":
    return eqn
  params = {k: v for k, v in eqn.params.items() if k not in ("num_consts", "num_carry")}
  return eqn.replace(params={**params, "ft_in": object(), "ft_out": object()})


def _while_counts_renamed(eqn):
  if eqn.primitive.name != "while":
    return eqn
  params = {k: v for k, v in eqn.params.items() if k not in ("body_nconsts", "cond_nconsts")}
  return eqn.replace(params={**params, "body_num_consts": eqn.params["body_nconsts"]})


def _counts_of_another_type(eqn):
  names = {"scan": ("num_consts", "num_carry"), "while": ("body_nconsts", "cond_nconsts")}
  if eqn.primitive.name not in names:
    return eqn
  # Only the counts this jax has (jax 0.11's scan has none of them).
  changed = {k: str(eqn.params[k]) for k in names[eqn.primitive.name] if k in eqn.params}
  return eqn.replace(params={**eqn.params, **changed})


def _inline_an_enum(eqn):
  if "inline" not in eqn.params:
    return eqn
  return eqn.replace(params={**eqn.params, "inline": _Inline.NEVER})


def _call_jaxpr_renamed(eqn):
  if eqn.primitive.name not in ("jit", "pjit"):
    return eqn
  params = {k: v for k, v in eqn.params.items() if k != "jaxpr"}
  return eqn.replace(params={**params, "fun_jaxpr": eqn.params["jaxpr"]})


def _unknown_primitive(eqn):
  return eqn.replace(primitive=_UNKNOWN) if eqn.primitive.name in _LOOPS_AND_CALLS else eqn


def _rewrite_value(value, change):
  if isinstance(value, jex_core.ClosedJaxpr):
    return value.replace(jaxpr=_rewrite(value.jaxpr, change))
  if isinstance(value, jex_core.Jaxpr):
    return _rewrite(value, change)
  if isinstance(value, tuple):
    return tuple(_rewrite_value(v, change) for v in value)
  return value


def _rewrite(jaxpr, change):
  """`jaxpr` with `change` applied to every equation, nested jaxprs first."""
  eqns = []
  for eqn in jaxpr.eqns:
    params = {k: _rewrite_value(v, change) for k, v in eqn.params.items()}
    eqns.append(change(eqn.replace(params=params)))
  return jaxpr.replace(eqns=eqns)


def _hoisted_constants(jaxpr):
  # Two closed-over constants moved in front of the arguments (jax 0.11.1): an input's position
  # no longer says which argument it is. A plain namespace: the readers take any jaxpr-like.
  return types.SimpleNamespace(
    invars=[*jaxpr.invars[:2], *jaxpr.invars], outvars=jaxpr.outvars, eqns=jaxpr.eqns
  )


def _jit_forwards_by_itself() -> bool:
  """jax 0.5 hands a jit's input-equal outputs back as the inputs at trace time (no jit read)."""
  jaxpr = jax.make_jaxpr(jax.jit(lambda z: z))(jnp.ones(2)).jaxpr
  return jaxpr.outvars[0] is jaxpr.invars[0]


_JIT_READ = set() if _jit_forwards_by_itself() else {"scan", "while"}


def _loops_the_reader_proves() -> set[str]:
  """The loops whose forwarding the reader proves on the installed jax, unchanged.

  The reader knows the operand counts jax 0.5 to 0.10 name (`scan`'s `num_consts`/`num_carry`,
  `while`'s `body_nconsts`/`cond_nconsts`); jax 0.11 describes `scan`'s operands otherwise, so
  there the real jaxpr already takes the fallback: a carried parameter is donated and stored
  back. Read from a real jaxpr of each loop, not from a version number.
  """
  jaxpr = jax.make_jaxpr(
    lambda a: (
      jax.lax.scan(lambda c, x: (c, x), a, jnp.arange(2.0))[0],
      jax.lax.while_loop(lambda c: c[1] < 2, lambda c: (c[0], c[1] + 1), (a, 0))[0],
    )
  )(jnp.ones(2)).jaxpr
  counts = {"scan": ("num_consts", "num_carry"), "while": ("body_nconsts", "cond_nconsts")}
  return {
    e.primitive.name
    for e in jaxpr.eqns
    if e.primitive.name in counts and all(k in e.params for k in counts[e.primitive.name])
  }


_PROVED = _loops_the_reader_proves()
_UNPROVED = {"scan", "while"} - _PROVED  # the fallback the installed jax itself takes

# change id -> (how the jaxpr changes, the loops whose forwarding it hides)
CHANGES = {
  "scan-ft_in-ft_out": (lambda j: _rewrite(j, _scan_as_jax_0_11), {"scan"}),
  "while-counts-renamed": (lambda j: _rewrite(j, _while_counts_renamed), {"while"}),
  "counts-of-another-type": (lambda j: _rewrite(j, _counts_of_another_type), {"scan", "while"}),
  "jit-jaxpr-renamed": (lambda j: _rewrite(j, _call_jaxpr_renamed), _JIT_READ),
  "unknown-primitive": (lambda j: _rewrite(j, _unknown_primitive), {"scan", "while"}),
  "constants-hoisted-into-invars": (_hoisted_constants, {"scan", "while"}),
  "jit-inline-an-enum": (lambda j: _rewrite(j, _inline_an_enum), set()),  # never read
}


def _simulate(monkeypatch, change):
  """Make `lb.compile_step` read `change(jaxpr)` instead of each jaxpr it traces."""
  forwarded, used = jaxpr_reading.forwarded_inputs, jaxpr_reading.used_inputs
  monkeypatch.setattr(_compat, "forwarded_inputs", lambda j, n=None: forwarded(change(j), n))
  monkeypatch.setattr(_compat, "used_inputs", lambda j, outs, n: used(change(j), outs, n))


@jax.jit
def _passed_on(state):
  # The state goes through a jit inside the loop body, as in a body that calls a jitted helper:
  # JAX then no longer sees by itself that the loop hands the parameters back unchanged, so
  # only loopbridge's reading of the jaxpr (through the loop and the jit) keeps them undonated.
  return state


def _body(graphdef):
  def body(c):
    m = nnx.merge(graphdef, c[0])
    y = m(c[1])  # before reading the state: flax 0.10's State is a snapshot
    return _passed_on(nnx.state(m)), y, c[2] + 1

  return body


def _scan_run(model, x):
  """Three seed steps in `jax.lax.fori_loop` with static bounds, which JAX lowers to `scan`."""
  graphdef, state = nnx.split(model)
  body = _body(graphdef)
  state, y, _ = jax.lax.fori_loop(0, 3, lambda i, c: body(c), (state, x, 0))
  nnx.update(model, state)
  return y


def _while_run(model, x):
  """Three seed steps in `jax.lax.while_loop`."""
  graphdef, state = nnx.split(model)
  state, y, _ = jax.lax.while_loop(lambda c: c[2] < 3, _body(graphdef), (state, x, 0))
  nnx.update(model, state)
  return y


RUNS = {"scan": _scan_run, "while": _while_run}


def _kernel(model):
  return _compat.variable_value(model.ScanBlock_0["Dense_0"]["kernel"])


def _run_and_check(run_name):
  """Two compiled calls of three steps; records and outputs against plain Linen; the old kernel."""
  model, x = seed_model()
  module = _compat.linen_module_of(model)
  # A copy: under the fallback the step donates the parameters, deleting arrays read before.
  variables = jax.tree.map(jnp.copy, lb.linen_variables(model))
  kernel = _kernel(model)
  step = lb.compile_step(RUNS[run_name], model)
  y = step(step(x))
  inters = linen_feedback_steps(module, variables, x, 6)
  want_y = x
  for _ in range(6):
    want_y = module.apply(variables, want_y)
  np.testing.assert_allclose(y, want_y, rtol=RTOL, atol=ATOL)
  rec = lb.recorded(model)["intermediates"]
  np.testing.assert_allclose(rec["x"], stack_reference(inters, ["x"]), rtol=RTOL, atol=ATOL)
  np.testing.assert_allclose(
    rec["ScanBlock_0"]["carry"],
    stack_reference(inters, ["ScanBlock_0", "carry"]),
    rtol=RTOL,
    atol=ATOL,
  )
  np.testing.assert_array_equal(
    _kernel(model), variables["params"]["ScanBlock_0"]["Dense_0"]["kernel"]
  )
  return kernel.is_deleted()


@pytest.mark.parametrize("run_name", sorted(RUNS))
def test_without_a_change_a_carried_parameter_is_not_donated(run_name):
  # The baseline the fallback is measured against: the analysis proves the kernel forwarded
  # (where the installed jax's loop is one the reader proves through).
  assert _run_and_check(run_name) == (run_name in _UNPROVED)


@pytest.mark.parametrize("run_name", sorted(RUNS))
@pytest.mark.parametrize("change_id", sorted(CHANGES))
def test_compile_step_survives_a_renamed_jaxpr_and_records_like_linen(
  monkeypatch, change_id, run_name
):
  change, hides = CHANGES[change_id]
  _simulate(monkeypatch, change)
  donated = _run_and_check(run_name)
  # The fallback was taken exactly where the change hides the loop's forwarding: the kernel
  # then counts as written, so it is donated and stored back from the step's result.
  assert donated == (run_name in hides | _UNPROVED)


def _loop_jaxpr():
  """Outputs: `a` through a while, a scan and a jit in each body; two computed; `a` through a jit.

  The jits inside the bodies keep JAX from forwarding the loops' carries by itself.
  """
  ident = jax.jit(lambda z: z)

  def f(a0, b, n):
    a, b, _ = jax.lax.while_loop(
      lambda c: c[2] < n, lambda c: (ident(c[0]), c[1] + 1.0, c[2] + 1), (a0, b, 0)
    )
    (a, b), ys = jax.lax.scan(lambda c, x: ((ident(c[0]), c[1] * 2), x), (a, b), jnp.arange(2.0))
    return a, b, ys, ident(a0)

  return jax.make_jaxpr(f)(jnp.ones(2), jnp.ones(2), 3).jaxpr


def test_the_readers_prove_forwarding_through_while_scan_and_jit():
  # Can fail: without this, every "fallback taken" assertion here could pass vacuously.
  assert jaxpr_reading.forwarded_inputs(_loop_jaxpr(), 3) == _through_the_loops([0, None, None, 0])


# What `forwarded_inputs` proves of `_loop_jaxpr` once changed: output 0 needs the while, the
# scan and the jit read; output 3 the jit only.
READ_AFTER_CHANGE = {
  "scan-ft_in-ft_out": [None, None, None, 0],
  "while-counts-renamed": [None, None, None, 0],
  "counts-of-another-type": [None, None, None, 0],
  "jit-jaxpr-renamed": [None, None, None, None] if _JIT_READ else [0, None, None, 0],
  "unknown-primitive": [None, None, None, None if _JIT_READ else 0],
  "constants-hoisted-into-invars": [None, None, None, None],
  "jit-inline-an-enum": [0, None, None, 0],
}


def _through_the_loops(expected: list[int | None]) -> list[int | None]:
  # Output 0 goes through the while and the scan: unproved where the installed jax's loop is.
  return [None, *expected[1:]] if _UNPROVED else expected


@pytest.mark.parametrize("change_id", sorted(CHANGES))
def test_each_change_degrades_to_not_forwarded_and_never_raises(change_id):
  jaxpr = CHANGES[change_id][0](_loop_jaxpr())
  want = _through_the_loops(READ_AFTER_CHANGE[change_id])
  assert jaxpr_reading.forwarded_inputs(jaxpr, 3) == want
  used = jaxpr_reading.used_inputs(jaxpr, [True] * len(jaxpr.outvars), 3)
  assert used is None or used == [True, True, True]


@pytest.mark.parametrize(
  "garbage",
  [
    types.SimpleNamespace(invars=[1], outvars=[2], eqns=[object()]),
    types.SimpleNamespace(invars=[1], outvars=[2], eqns=[types.SimpleNamespace(params=None)]),
    types.SimpleNamespace(invars=None, outvars=[1, 2], eqns=[]),
    types.SimpleNamespace(),
    None,
  ],
  ids=["eqn-of-no-known-shape", "params-not-a-mapping", "no-invars", "empty", "none"],
)
def test_the_readers_answer_conservatively_for_what_they_cannot_read(garbage):
  got = jaxpr_reading.forwarded_inputs(garbage, 1)
  assert all(f is None for f in got)
  assert jaxpr_reading.used_inputs(garbage, [True] * len(got), 1) is None


@pytest.mark.parametrize("public", [True, False], ids=["jaxpr_as_fun", "without-it"])
def test_eval_jaxpr_runs_a_closed_jaxpr_with_its_constants(monkeypatch, public):
  if not public:
    monkeypatch.delattr(jex_core, "jaxpr_as_fun")
  const = np.arange(3.0)
  closed = jax.make_jaxpr(lambda x: x * const + 1.0)(jnp.ones(3))
  np.testing.assert_allclose(jaxpr_reading.eval_jaxpr(closed, jnp.ones(3))[0], const + 1.0)


# --- the other internals `_compat` reads, each with its fallback taken -----------------------
def test_batched_values_are_recognised_without_jaxs_private_class(monkeypatch):
  seen = {}

  def probe(x):
    seen["batched"] = _compat.is_batched(x)
    return x

  monkeypatch.setattr(_compat, "_BATCH_TRACER", None)
  jax.vmap(probe)(jnp.ones((2, 3)))
  assert seen["batched"] is True
  assert _compat.is_batched(jnp.ones(3)) is False


def test_lazy_init_flag_is_set_without_flaxs_private_helper(monkeypatch):
  from flax.nnx.bridge import wrappers

  model, _ = seed_model()
  monkeypatch.delattr(wrappers, "_set_initializing")
  _compat.set_initializing(model, True)
  assert _compat.is_initializing(model)
  _compat.set_initializing(model, False)
  assert not _compat.is_initializing(model)


def test_a_trace_state_without_its_trace_defers_to_flaxs_own_check():
  variable = nnx.Param(jnp.ones(2))
  object.__setattr__(variable, "_trace_state", types.SimpleNamespace())
  assert _compat.written_in_another_trace(variable, _compat.current_trace()) is False
