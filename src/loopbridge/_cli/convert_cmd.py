"""`loopbridge convert`: an orbax Linen train-state checkpoint to an NNX one, and back.

On disk, a Linen train state is what a flax `TrainState` (with its extra collections) saves:
one dict holding every variable collection (`params`, `batch_stats`, ...) and, with an
optimizer, `opt_state` and `step`. An NNX checkpoint is what the NNX checkpoint guide saves:
`{'model': nnx.state(model)}`, plus `'optimizer': nnx.state(optimizer, OptState)` (its step
and optax state). Both models are imported as `loopbridge compare` imports them; the
conversion is `lb.checkpoint.linen_to_nnx` / `nnx_to_linen`.
"""

from __future__ import annotations

import argparse
import json
import os
import typing as tp

from .. import _compat
from .._checkpoint.leaf_rules import LeafRule
from .._checkpoint.leaf_rules import parse as parse_rule
from .._core.errors import CheckpointError, first_line
from . import call_specs, checkpoint_io, loading, options
from .errors import EXIT_STATUS_HELP, FAILURE, SUCCESS, USAGE_ERROR, CliError
from .output import progress

if tp.TYPE_CHECKING:
  import optax

  from .options import Subcommands


DESCRIPTION = (
  "Convert an orbax checkpoint of a Linen train state (every variable collection, and with "
  "--tx the optax state and step) into an orbax checkpoint of a hand-ported NNX model and "
  "its nnx.Optimizer (--to nnx, the default), or back (--to linen). Variables are paired by "
  "the two models' own calls (lb.checkpoint.linen_to_nnx), so the port may name its "
  "attributes as it likes; every pairing is checked by running both models on the sample call "
  "(--arg, --kwarg, --method). --map "
  "names what the pairing cannot place; --rule declares arrays the port stores otherwise "
  "(split, fused, reshaped, transposed, renamed), inverted for --to linen."
)
EPILOG = (
  "LINEN_TARGET and NNX_TARGET are package.module:attribute, as for `loopbridge compare`. "
  "The sample call (--arg, --kwarg, --method) is one forward call both models take, e.g. "
  "--kwarg train=False for a model with dropout; --kwarg values are Python literals or "
  "array specs. "
  "The Linen checkpoint is one dict: the collections ('params', 'batch_stats', ...) and, "
  "with --tx, 'opt_state' and 'step' (what a flax TrainState saves). The NNX checkpoint is "
  "{'model': nnx.state(model), 'optimizer': nnx.state(optimizer, OptState)}. " + EXIT_STATUS_HELP
)


def add_parser(commands: Subcommands) -> None:
  """Register `loopbridge convert` and its options."""
  p = commands.add_parser(
    "convert",
    help="convert an orbax Linen train-state checkpoint into an NNX one, or back",
    description=DESCRIPTION,
    epilog=EPILOG,
  )
  p.add_argument("linen", metavar="LINEN_TARGET", help="the Linen model: package.module:attribute")
  p.add_argument("nnx", metavar="NNX_TARGET", help="the NNX port: package.module:attribute")
  p.add_argument("source", metavar="SOURCE", help="the checkpoint directory to read")
  p.add_argument("dest", metavar="DEST", help="the checkpoint directory to write (must not exist)")
  p.add_argument(
    "--to",
    choices=("nnx", "linen"),
    default="nnx",
    help="nnx: SOURCE is a Linen checkpoint (default); linen: SOURCE is an NNX checkpoint",
  )
  options.add_call_options(p, "'float32[1,100]'")
  p.add_argument(
    "--tx",
    default=None,
    metavar="TARGET",
    help="the optax transformation (package.module:attribute naming one, or a function "
    "taking no arguments that returns one): converts the optimizer state and step too",
  )
  p.add_argument(
    "--map",
    action="append",
    default=None,
    metavar="LINEN_PATH=NNX_PATH",
    dest="mapping",
    help="pair a Linen module (or subtree) with an NNX one, e.g. 'Dense_0=proj', or a leaf, "
    "e.g. 'ln/scale=norm/alpha'; repeatable",
  )
  p.add_argument(
    "--rule",
    action="append",
    default=None,
    metavar="RULE",
    dest="rules",
    help="a leaf rule as its Python call (what a conversion error prints), e.g. "
    "\"split('mlp/wi', ['mlp/gate/kernel', 'mlp/up/kernel'], axis=0)\"; also rename, "
    "transpose, reshape, fuse; literals only, nothing is executed; repeatable",
  )
  options.add_precision_option(p)
  options.add_common_options(p, "print the report as one JSON document")
  p.set_defaults(run=run)


def _mapping(items: tp.Sequence[str] | None) -> dict[str, str]:
  mapping = {}
  for item in items or []:
    linen, sep, port = item.partition("=")
    if not sep or not linen.strip() or not port.strip():
      raise CliError(
        f"--map {item!r}: expected LINEN_PATH=NNX_PATH, e.g. 'Dense_0=proj'", USAGE_ERROR
      )
    mapping[linen.strip()] = port.strip()
  return mapping


def _rules(items: tp.Sequence[str] | None) -> list[LeafRule]:
  try:
    return [parse_rule(item) for item in items or []]
  except CheckpointError as e:
    raise CliError(f"--rule: {e}", USAGE_ERROR) from e


def _load_tx(target: str) -> optax.GradientTransformation:
  obj = loading.resolve(target, "--tx")
  if not (hasattr(obj, "init") and hasattr(obj, "update")) and callable(obj):
    try:
      obj = obj()
    except Exception as e:
      raise CliError(f"--tx {target!r}: calling it failed: {type(e).__name__}: {e}") from e
  if not (hasattr(obj, "init") and hasattr(obj, "update")):
    raise CliError(
      f"--tx {target!r} is a {type(obj).__name__}, not an optax transformation (e.g. "
      "`tx = optax.adam(1e-3)` in that module)"
    )
  return tp.cast("optax.GradientTransformation", obj)


def _abstract_variables(
  module: tp.Any,
  samples: tp.Sequence[object],
  method: str | None,
  kwargs: dict[str, tp.Any],
  described: str,
) -> dict[str, tp.Any]:
  """The shapes of the Linen variables the sample call creates: orbax's restore target.

  `described` is the sample call as given on the command line, for the error message.
  """
  import jax
  from flax import linen as nn

  key = jax.random.key(0)  # a dropout stream too, for a sample call in training mode
  try:
    return jax.eval_shape(
      lambda: nn.Module.init(
        module, {"params": key, "dropout": key}, *samples, method=method, **kwargs
      )
    )
  except Exception as e:
    raise CliError(
      f"LINEN_TARGET {type(module).__name__}: the sample call ({described}) failed "
      f"({type(e).__name__}: {first_line(e)}).{call_specs.missing_argument_hint(e)} Give the "
      "inputs of one forward call: --arg for each positional array, --kwarg NAME=VALUE for "
      "keyword inputs (e.g. train=False), --method for another method than __call__"
    ) from e


def _optimizer_state_filter() -> type:
  from flax.nnx.training.optimizer import OptState  # step and optax state, not the model

  return OptState


def run(args: argparse.Namespace) -> int:
  """Run `loopbridge convert`; returns the exit status."""
  import jax
  import jax.numpy as jnp
  from flax import nnx

  import loopbridge as lb

  sample = call_specs.read_call(args)
  # linen_to_nnx takes the call's keywords as one dict, so no keyword name is reserved.
  sample_kwargs = sample.kwargs(args.seed)
  mapping = _mapping(args.mapping)
  rules = _rules(args.rules)
  with progress("importing the models"):
    module = loading.load_linen_target(args.linen, command="convert", what="LINEN_TARGET")
    port = loading.load_nnx_target(args.nnx, args.seed)
    tx = None if args.tx is None else _load_tx(args.tx)
  method = sample.method
  sample.check_method(module, "LINEN_TARGET ")
  sample.check_method(port, "NNX_TARGET ")
  call: dict[str, tp.Any] = dict(method=method, sample_kwargs=sample_kwargs)
  samples = sample.args(args.seed)
  optimizer: nnx.Optimizer | None = None if tx is None else nnx.Optimizer(port, tx, wrt=nnx.Param)
  opt_filter = _optimizer_state_filter()
  try:
    if args.to == "nnx":
      abstract = _abstract_variables(module, samples, method, sample_kwargs, sample.described())
      target: dict[str, object] = {k: v for k, v in abstract.items() if k != "intermediates"}
      if tx is not None:
        target["opt_state"] = jax.eval_shape(tx.init, target["params"])
        target["step"] = jax.ShapeDtypeStruct((), jnp.int32)
      # Placed on this process's first device: older orbax warns about targets without one.
      device = _compat.single_device_sharding(jax.devices()[0])
      target = jax.tree.map(
        lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device), target
      )
      # Saved as the model's init makes it (metadata boxes with their 'value' level) or
      # after nn.unbox (what many training loops save): linen_to_nnx takes either.
      state = checkpoint_io.restore(
        args.source, target, "Linen", layouts=[checkpoint_io.unboxed(target)]
      )
      variables = {k: v for k, v in state.items() if k not in ("opt_state", "step")}
      with progress("converting"):
        report = lb.checkpoint.linen_to_nnx(
          module,
          variables,
          port,
          *samples,
          opt_state=state.get("opt_state"),
          optimizer=optimizer,
          mapping=mapping,
          rules=rules,
          step=None if tx is None else int(tp.cast(jax.Array, state["step"])),
          precision=args.precision,
          **call,
        )
      out: dict[str, object] = {"model": nnx.state(port)}
      if optimizer is not None:
        out["optimizer"] = nnx.state(optimizer, opt_filter)
      checkpoint_io.save(args.dest, out, "NNX")
      doc = report.to_dict()
      text = str(report)
    else:
      target = {"model": nnx.state(port)}
      if optimizer is not None:
        target["optimizer"] = nnx.state(optimizer, opt_filter)
      state = checkpoint_io.restore(args.source, target, "NNX")
      nnx.update(port, tp.cast(nnx.State, state["model"]))
      if optimizer is not None:
        nnx.update(optimizer, tp.cast(nnx.State, state["optimizer"]))
      with progress("converting"):
        if optimizer is None:
          out = dict(
            lb.checkpoint.nnx_to_linen(
              port,
              module,
              *samples,
              mapping=mapping,
              rules=rules,
              precision=args.precision,
              **call,
            )
          )
        else:
          variables, opt_state = lb.checkpoint.nnx_to_linen(
            port,
            module,
            *samples,
            optimizer=optimizer,
            mapping=mapping,
            rules=rules,
            precision=args.precision,
            **call,
          )
          step = _compat.variable_value(optimizer.step)
          out = {**variables, "opt_state": opt_state, "step": jnp.asarray(step, jnp.int32)}
      checkpoint_io.save(args.dest, out, "Linen")
      collections = sorted(k for k in out if k not in ("opt_state", "step"))
      doc = {"direction": "nnx_to_linen", "collections": collections, "optimizer": tx is not None}
      text = f"nnx_to_linen: wrote {', '.join(collections)}" + (
        " with the optax state and step" if tx is not None else ""
      )
  except lb.checkpoint.CheckpointError as e:  # the conversion refused: the check failed
    raise CliError(str(e), FAILURE) from e
  doc["dest"] = os.path.abspath(args.dest)
  print(json.dumps(doc, indent=2) if args.json else f"{text}\nwrote {doc['dest']}")
  return SUCCESS
