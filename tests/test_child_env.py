"""The environment tests give the Python processes they start (`conftest.child_env`)."""

from __future__ import annotations

import subprocess
import sys

from conftest import child_env

# What JAX prints on importing it on a stock TPU VM, whatever platform the process then uses.
_TPU_VM_WARNING = (
  "Transparent hugepages are not enabled. TPU runtime startup and shutdown time should be "
  "significantly improved on TPU v5e and newer."
)


def _run(script: str) -> subprocess.CompletedProcess[str]:
  return subprocess.run(
    [sys.executable, "-c", script], env=child_env(), capture_output=True, text=True, check=True
  )


def test_a_child_runs_on_the_cpu_and_keeps_other_warnings():
  script = (
    "import os, warnings\n"
    "print(os.environ['JAX_PLATFORMS'])\n"
    "warnings.warn('a warning of the code under test', UserWarning)\n"
  )
  done = _run(script)
  assert done.stdout == "cpu\n"
  assert "a warning of the code under test" in done.stderr


def test_a_child_does_not_print_the_tpu_vm_start_up_warning():
  """Tests that read a child's stderr (the CLI's one-line errors) would read JAX's TPU VM
  warning as the child's own output."""
  script = f"import warnings\nwarnings.warn({_TPU_VM_WARNING!r}, UserWarning)\n"
  assert _run(script).stderr == ""
