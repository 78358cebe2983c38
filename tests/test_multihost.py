"""Two JAX processes on this machine run as one multi-host job (gloo CPU collectives).

Each process (tests/multihost_worker.py) owns 2 CPU devices; the mesh spans all 4. They
record batch-sharded global inputs in a jitted `nnx.fori_loop` with buffers that span both
processes, check the gathered records against plain Linen step by step, and round-trip an
orbax checkpoint written and read by both. Every wait is bounded; a hang fails with both
processes' output.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import jax
import pytest

from conftest import child_env

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "multihost_worker.py")
TIMEOUT = 300  # seconds for the whole job: start-up, compilation, loop, checkpoint

pytestmark = [
  pytest.mark.multihost,
  pytest.mark.slow,
  pytest.mark.skipif(
    jax.default_backend() != "cpu",
    reason=f"a 2-process gloo job on CPU devices; the suite runs on {jax.default_backend()!r}, "
    "whose chip admits one process (and a TPU VM's sandbox may refuse the gloo sockets)",
  ),
  pytest.mark.skipif(
    not hasattr(jax.config, "jax_cpu_collectives_implementation"),
    reason=f"jax {jax.__version__} has no CPU collectives option "
    "(jax_cpu_collectives_implementation='gloo'), so several JAX processes "
    "cannot share CPU arrays",
  ),
]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_two_processes_record_and_checkpoint_like_one_linen_run(tmp_path):
  env = child_env(drop=("XLA_FLAGS",))
  env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
  port = _free_port()
  procs = [
    subprocess.Popen(
      [sys.executable, WORKER, str(port), str(i), str(tmp_path / "ckpt")],
      env=env,
      stdout=subprocess.PIPE,
      stderr=subprocess.STDOUT,
      text=True,
    )
    for i in range(2)
  ]
  outputs = []
  try:
    for proc in procs:
      outputs.append(proc.communicate(timeout=TIMEOUT)[0])
  except subprocess.TimeoutExpired:
    for proc in procs:
      proc.kill()
    outputs = [proc.communicate()[0] for proc in procs]
    pytest.fail(
      f"the 2-process job did not finish within {TIMEOUT}s:\n"
      + "\n".join(f"--- process {i}\n{out[-3000:]}" for i, out in enumerate(outputs))
    )
  finally:
    for proc in procs:
      if proc.poll() is None:
        proc.kill()
  for i, (proc, out) in enumerate(zip(procs, outputs)):
    assert proc.returncode == 0 and f"MULTIHOST OK {i}" in out, (
      f"process {i} exited {proc.returncode}:\n{out[-5000:]}"
    )
  assert os.path.isdir(tmp_path / "ckpt")  # one checkpoint, written by both
