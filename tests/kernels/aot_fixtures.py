"""What the GPU and TPU compile tests share: the version gate, the per-session
compile fixture and the case selection (see ``test_compile_gpu.py``)."""

from __future__ import annotations

import jax
import pytest

from linear_attention.kernels import aot

# The test modules that compile through compiled_fixture: their cases share one pool.
_MODULES: list[str] = []
_DETAIL: list[bool] = []
_RESULTS: dict[str, dict[str, dict]] = {}


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
        _RESULTS.update(aot.run_targets({t: sorted(c) for t, c in wanted.items()},
                                        timeout=1200, detail=any(_DETAIL)))
      return _RESULTS[target]

    return get

  return compiled


def cases(targets: tuple[str, ...], first=lambda case: True,
          others=lambda case: case.endswith("/bf16/gpu_check")) -> list[tuple[str, str]]:
  """(target, case): the cases that ``first`` keeps on the first target, those that
  ``others`` keeps on the others. Default: every case on the first target; on the
  others the bf16 cases at the gpu_check shapes, the ones whose resources differ
  per target (the odd shape's padding and float32 do not), to keep CI's stage short.
  ``experiments/compile_report.py`` compiles every case on every target."""
  return [(t, c) for i, t in enumerate(targets) for c in sorted(aot.CASES)
          if (others, first)[i == 0](c)]
