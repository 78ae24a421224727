"""What the GPU and TPU compile tests share: the version gate, the per-session
compile fixture and the case selection (see ``test_compile_gpu.py``)."""

from __future__ import annotations

import json
import os
import time

import jax
import pytest

from tests.kernels import aot

# The test modules that compile through compiled_fixture: their cases share one pool.
_MODULES: list[str] = []
_DETAIL: list[bool] = []
_RESULTS: dict[str, dict[str, dict]] = {}
SUMMARY: list[str] = []  # the compile timing summary, once compiled


def old_jax(what: str) -> str | None:
  """Why ``what`` cannot compile with this JAX (< 0.11), or None."""
  version = tuple(int(x) for x in jax.__version__.split(".")[:2])
  if version < (0, 11):
    return (f"deviceless {what} compilation needs jax >= 0.11 (Python 3.12; .ci/run's compile "
            f"stage), got jax {jax.__version__}")
  return None


def compiled_fixture(module_name: str, detail: bool, available: bool = True):
  """A session fixture ``compiled(target)``: the results of the cases of ``target``
  selected in this session, compiled once. The first call compiles the selected
  cases of every module that uses this fixture (GPU and TPU targets together:
  ``aot.run_targets``, one child a core), so no core idles between the modules.
  A module whose tests skip (``available`` False) adds no cases."""
  if available:
    _MODULES.append(module_name)
    _DETAIL.append(detail)

  @pytest.fixture(scope="session")
  def compiled(request):
    def get(target: str) -> dict[str, dict]:
      if not _RESULTS:
        wanted: dict[str, set[str]] = {}
        for item in request.session.items:
          params = getattr(getattr(item, "callspec", None), "params", {})
          if item.module.__name__ in _MODULES and "target" in params:
            wanted.setdefault(params["target"], set()).add(params["case"])
        t0 = time.monotonic()
        _RESULTS.update(aot.run_targets({t: sorted(c) for t, c in wanted.items()},
                                        timeout=1200, detail=any(_DETAIL)))
        wall = time.monotonic() - t0
        SUMMARY.append(timing_summary(_RESULTS, wall))  # printed by tests/kernels/conftest.py
        if (path := os.environ.get("LINEAR_ATTENTION_COMPILE_RESULTS")):
          with open(path, "w") as f:
            json.dump({"wall_seconds": wall, "targets": _RESULTS}, f, indent=1)
      return _RESULTS[target]

    return get

  return compiled


def timing_summary(results: dict[str, dict[str, dict]], wall: float, slowest: int = 8) -> str:
  """Per target: cases, summed wall and CPU seconds of their compiles (in the children,
  without the children's start); then the ``slowest`` cases by CPU time, so that a CI
  log shows where the stage's time goes (CPU time: the machine may be shared)."""
  secs = lambda x, key: x.get(key) or 0.0
  lines = [f"kernel compile: {wall:.0f} s wall for "
           f"{sum(len(r) for r in results.values())} cases (per target: wall s, CPU s)"]
  for target, r in results.items():
    lines.append(f"  {target:5s} {len(r):3d} cases {sum(secs(x, 'seconds') for x in r.values()):7.1f}"
                 f" {sum(secs(x, 'cpu_seconds') for x in r.values()):7.1f}")
  ranked = sorted(((secs(x, "cpu_seconds"), secs(x, "seconds"), t, c)
                   for t, r in results.items() for c, x in r.items()), reverse=True)[:slowest]
  lines += [f"  {c:6.1f} CPU s {w:6.1f} s  {t:5s} {n}" for c, w, t, n in ranked]
  return "\n".join(lines)


def cases(targets: tuple[str, ...]) -> list[tuple[str, str]]:
  """(target, case) for each of ``targets``: the cases CI compiles for it
  (``aot.ci_cases``; what is covered where, and why, is at ``aot.CI_GROUPS``).
  ``experiments/checks/compile_report.py`` compiles every case on every target."""
  return [(t, c) for t in targets for c in aot.ci_cases(t)]
