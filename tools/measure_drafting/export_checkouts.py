"""Export the measured repositories' trees at their pinned commits: DEST/owner+name.

    python tools/measure_drafting/export_checkouts.py --mirror MIRROR --dest DEST [--cases SET]

SET is `holdout` (the default), `holdout_b`, `holdout_c`, `holdout_d`, `holdout_e`,
`holdout_f`, `holdout_g`, `holdout_h` or `tuning`.

MIRROR holds one bare git directory per repository, `MIRROR/owner+name/repo` (or
`MIRROR/owner+name` itself); each case's commit is exported with `git archive`.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cases import PINNED_SETS


def git_dir(mirror: str, checkout_dir: str) -> str:
  for candidate in (os.path.join(mirror, checkout_dir, "repo"), os.path.join(mirror, checkout_dir)):
    if os.path.isdir(candidate) and os.path.exists(os.path.join(candidate, "HEAD")):
      return candidate
  raise SystemExit(f"no git directory for {checkout_dir} under {mirror}")


def export(mirror: str, dest: str, repo_dir: str, commit: str) -> str:
  target = os.path.join(dest, repo_dir)
  if os.path.isdir(target):
    return target
  os.makedirs(target + ".part", exist_ok=True)
  archive = subprocess.run(
    # Python sources only: a mirror may lack the blobs of large data files.
    [
      "git",
      "--git-dir",
      git_dir(mirror, repo_dir),
      "archive",
      "--format=tar",
      commit,
      "--",
      ":(glob)**/*.py",
    ],
    check=True,
    capture_output=True,
  )
  subprocess.run(["tar", "-x", "-C", target + ".part"], input=archive.stdout, check=True)
  os.rename(target + ".part", target)
  return target


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument("--mirror", required=True)
  parser.add_argument("--dest", required=True)
  parser.add_argument(
    "--cases",
    default="holdout",
    choices=PINNED_SETS,
  )
  ns = parser.parse_args()
  case_set = importlib.import_module(ns.cases)
  pins: dict[str, str] = {}
  for name in case_set.names():
    case = case_set.case(name)
    if not case.repo:
      continue
    if pins.setdefault(case.checkout_dir, case.commit) != case.commit:
      raise SystemExit(f"{case.repo} is pinned at two commits; one tree per repository")
  for repo_dir, commit in sorted(pins.items()):
    print(export(ns.mirror, ns.dest, repo_dir, commit), commit)
  return 0


if __name__ == "__main__":
  sys.exit(main())
