"""Running a test module's ``case_*`` functions on 4 fake CPU devices, in one subprocess.

The main pytest process has one CPU device, so a module's multi-device checks go to a
subprocess started with ``XLA_FLAGS=--xla_force_host_platform_device_count=4``
(``JAX_PLATFORMS=cpu``): it runs every case and prints one JSON line of results, and the
module's one test asserts them (one test, not one per case, so that parallel test runners
start the subprocess once). ``--xla_backend_optimization_level=0`` cuts the CPU compile
time about threefold; the numerics checked are unchanged.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import traceback

import jax

from tests import helpers

DEVICES = 4


def cases(namespace: dict) -> dict:
  """The ``case_*`` functions of a module's globals, by name without the prefix."""
  return {name[len("case_"):]: fn for name, fn in sorted(namespace.items())
          if name.startswith("case_")}


def run_cases(all_cases: dict) -> None:
  """Subprocess entry point: runs every case, prints ``RESULTS {name: "ok" | traceback}``."""
  assert jax.device_count() == DEVICES, jax.devices()
  results = {}
  for name, fn in all_cases.items():
    try:
      start = time.perf_counter()
      fn()
      print(f"{name}: {time.perf_counter() - start:.1f}s", file=sys.stderr)
      results[name] = "ok"
    except Exception:  # noqa: BLE001 - reported to the parent test, case by case.
      results[name] = traceback.format_exc()
  print("RESULTS " + json.dumps(results))


def check_in_subprocess(module: str, all_cases: dict, timeout: int = 900) -> None:
  """Runs ``module._run_cases()`` on fake devices and fails with every failed case's traceback."""
  proc = subprocess.run([sys.executable, "-c", f"import {module} as t; t._run_cases()"],
                        cwd=helpers.ROOT, env=helpers.fake_device_env(DEVICES, fast_compile=True),
                        capture_output=True, text=True, timeout=timeout)
  lines = [l for l in proc.stdout.splitlines() if l.startswith("RESULTS ")]
  assert proc.returncode == 0 and lines, (
      f"subprocess failed (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
  results = json.loads(lines[-1][len("RESULTS "):])
  assert set(results) == set(all_cases), results.keys()
  failed = {name: msg for name, msg in results.items() if msg != "ok"}
  assert not failed, "\n\n".join(f"case {n}:\n{m}" for n, m in failed.items())
