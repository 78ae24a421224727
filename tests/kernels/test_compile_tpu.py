"""Every Pallas kernel compiles for TPU v5e and v6e on a host with no TPU.

The cases of ``linear_attention.kernels.aot`` (as in ``test_compile_gpu.py``)
compiled for compile-only TPU devices (``get_topology_desc("v5e:2x2")``,
``"v6e:2x2"``) with libtpu: Mosaic runs inside the compile, so a kernel that
Mosaic cannot lower or lay out fails here as it would on the chip. Mosaic
failures may abort the compiler process, so ``aot.run_target`` runs the cases
in a child process and restarts it after a crash; one libtpu process at a time.

Runs in ``.ci/run``'s compile stage (Python 3.12, jax 0.11.2, libtpu 0.0.48);
elsewhere it skips, saying what is missing.
"""

from __future__ import annotations

import importlib.util

import jax
import pytest

from linear_attention.kernels import aot

TARGETS = ("v5e", "v6e")
DETAIL = False  # Mosaic accepts or refuses: nothing more to read


def _missing() -> str | None:
  """Why the TPU compile check cannot run here, or None."""
  version = tuple(int(x) for x in jax.__version__.split(".")[:2])
  if version < (0, 11):
    return (f"deviceless TPU compilation needs jax >= 0.11 with libtpu (Python 3.12; "
            f".ci/run's compile stage), got jax {jax.__version__}")
  if importlib.util.find_spec("libtpu") is None:
    return "libtpu is not installed (pip install 'libtpu==0.0.48.*')"
  return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


@pytest.fixture(scope="session")
def compiled(request):
  """``compiled(target)``: the results of the cases of ``target`` selected in this
  session, compiled together once (one child process per target)."""
  wanted: dict[str, set[str]] = {}
  for item in request.session.items:
    params = getattr(getattr(item, "callspec", None), "params", {})
    if item.module.__name__ == __name__ and "target" in params:
      wanted.setdefault(params["target"], set()).add(params["case"])
  cache: dict[str, dict] = {}

  def get(target: str) -> dict[str, dict]:
    if target not in cache:
      cache[target] = aot.run_target(target, sorted(wanted.get(target, ())), timeout=1200,
                                     detail=DETAIL)
    return cache[target]

  return get


def _cases():
  """(target, case): every case on the first target; on the others the bf16
  cases at the gpu_check shapes, the ones whose resources differ per target
  (the odd shape's padding and float32 do not), to keep CI's stage short.
  ``experiments/compile_report.py`` compiles every case on every target."""
  return [(t, c) for i, t in enumerate(TARGETS) for c in sorted(aot.CASES)
          if i == 0 or c.endswith("/bf16/gpu_check")]


@pytest.mark.parametrize("target,case", _cases())
def test_compiles(compiled, target, case):
  result = compiled(target)[case]
  assert result["ok"], f"{case} does not compile for {target}: {result['error']}"
