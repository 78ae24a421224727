"""Helpers shared by the study scripts: run metadata, result files, slope fits.

Every study writes ``<out>/<name>.json`` (config, environment, results) and,
where the results are a flat table, ``<out>/<name>.csv``. The notebooks in
``notebooks/`` read only these files.
"""

from __future__ import annotations

import csv
import datetime
import json
import math
import os
import platform
import subprocess
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_RESULTS = os.path.join(REPO_ROOT, "results", "studies")


def environment(shared_machine: bool | None = None) -> dict:
  """What the numbers were measured on: versions, backend, cores, load, commit, time.

  Args:
    shared_machine: whether other jobs were using the CPU at the time (only
      the caller knows); ``None`` leaves it out.

  Returns:
    A JSON-ready dict.
  """
  import jax
  env = {
      "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "python": platform.python_version(),
      "jax": jax.__version__,
      "backend": jax.default_backend(),
      "devices": [str(d) for d in jax.devices()],
      "cpu_count": os.cpu_count(),
      "platform": platform.platform(),
  }
  try:
    env["load_average"] = list(os.getloadavg())
  except OSError:
    pass
  try:
    env["git_commit"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
        text=True, timeout=10).stdout.strip() or None
  except (OSError, subprocess.SubprocessError):
    env["git_commit"] = None
  if shared_machine is not None:
    env["shared_machine"] = shared_machine
  env["command"] = " ".join([os.path.basename(sys.argv[0])] + sys.argv[1:])
  return env


def write_json(path: str, obj: dict) -> None:
  """Writes ``obj`` as indented JSON, creating the folder; NaN/inf become null."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w") as f:
    json.dump(_finite(obj), f, indent=1)
    f.write("\n")


def write_csv(path: str, rows: list[dict], columns: list[str]) -> None:
  """Writes ``rows`` (dicts) with the given ``columns``; missing values are empty."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
    w.writeheader()
    for r in rows:
      w.writerow({c: r.get(c, "") for c in columns})


def _finite(obj):
  """JSON has no NaN: map non-finite floats to None, recursively."""
  if isinstance(obj, float):
    return obj if math.isfinite(obj) else None
  if isinstance(obj, dict):
    return {k: _finite(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_finite(v) for v in obj]
  return obj


def loglog_slope(xs, ys) -> float | None:
  """Least-squares slope of ``log y`` against ``log x``; None with under 2 distinct x.

  Args:
    xs, ys: equal-length sequences of positive numbers.
  """
  pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y and y > 0]
  if len({p[0] for p in pts}) < 2:
    return None
  mx = sum(p[0] for p in pts) / len(pts)
  my = sum(p[1] for p in pts) / len(pts)
  sxx = sum((p[0] - mx) ** 2 for p in pts)
  return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx
