"""What the GPU and TPU compile tests share: the version gate, the per-session
compile fixture and the case selection (see ``test_compile_gpu.py``)."""

from __future__ import annotations

import jax
import pytest

from linear_attention.kernels import aot


def old_jax(what: str) -> str | None:
  """Why ``what`` cannot compile with this JAX (< 0.11), or None."""
  version = tuple(int(x) for x in jax.__version__.split(".")[:2])
  if version < (0, 11):
    return (f"deviceless {what} compilation needs jax >= 0.11 (Python 3.12; .ci/run's compile "
            f"stage), got jax {jax.__version__}")
  return None


def compiled_fixture(module_name: str, detail: bool):
  """A session fixture ``compiled(target)``: the results of the cases of ``target``
  that the tests of ``module_name`` selected in this session, compiled once, every
  target of the module at the same time (``aot.run_targets``: one child a core)."""

  @pytest.fixture(scope="session")
  def compiled(request):
    wanted: dict[str, set[str]] = {}
    for item in request.session.items:
      params = getattr(getattr(item, "callspec", None), "params", {})
      if item.module.__name__ == module_name and "target" in params:
        wanted.setdefault(params["target"], set()).add(params["case"])
    cache: dict[str, dict] = {}

    def get(target: str) -> dict[str, dict]:
      if not cache:
        cache.update(aot.run_targets({t: sorted(c) for t, c in wanted.items()}, timeout=1200,
                                     detail=detail))
      return cache[target]

    return get

  return compiled


def cases(targets: tuple[str, ...]) -> list[tuple[str, str]]:
  """(target, case): every case on the first target; on the others the bf16
  cases at the gpu_check shapes, the ones whose resources differ per target
  (the odd shape's padding and float32 do not), to keep CI's stage short.
  ``experiments/compile_report.py`` compiles every case on every target."""
  return [(t, c) for i, t in enumerate(targets) for c in sorted(aot.CASES)
          if i == 0 or c.endswith("/bf16/gpu_check")]
