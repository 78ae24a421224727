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

import functools
import importlib.util

import jax
import pytest

from linear_attention.kernels import aot

TARGETS = ("v5e", "v6e")


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


@functools.lru_cache(maxsize=None)
def _results(target: str) -> dict[str, dict]:
  """All cases of ``target``, compiled once per test session."""
  return aot.run_target(target, timeout=1200, detail=False)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(aot.CASES))
def test_compiles(target, case):
  result = _results(target)[case]
  assert result["ok"], f"{case} does not compile for {target}: {result['error']}"
