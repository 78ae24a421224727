"""Every Pallas kernel compiles for TPU v5e and v6e on a host with no TPU.

The cases of ``tests.kernels.aot`` (as in ``test_compile_gpu.py``)
compiled for compile-only TPU devices (``get_topology_desc("v5e:2x2")``,
``"v6e:2x2"``) with libtpu: Mosaic runs inside the compile, so a kernel that
Mosaic cannot lower or lay out fails here as it would on the chip. Mosaic
failures may abort the compiler process, so ``aot.run_target`` runs the cases
in a child process and restarts it after a crash (children run concurrently,
GPU targets' too: ``aot_fixtures.compiled_fixture``).

Cases (``aot.CI_GROUPS``, which says why): every kernel and mode at the "small"
shape (the ``gpu_check`` tiles, K = V = 128, on a smaller grid: the same Mosaic
kernels, cheaper to compile) in bfloat16 and float32 on v5e and in
bfloat16 on v6e, and in bfloat16 at the odd shape (padding, GQA) on v5e; flash
attention with grouped KV heads at the families' head sizes (64 to 256, MLA's 192/128)
in bfloat16 on both and float32 at the largest on v5e; the delta and DPLR kernels at
K 128, V 256 in bfloat16 on both.

Runs in ``.ci/run``'s compile stage (Python 3.12, jax 0.11.2, libtpu 0.0.48);
elsewhere it skips, saying what is missing.
"""

from __future__ import annotations

import importlib.util

import jax
import pytest

from tests.kernels import aot
from tests.kernels import aot_fixtures

TARGETS = ("v5e", "v6e")
DETAIL = False  # Mosaic accepts or refuses: nothing more to read


def _missing() -> str | None:
  """Why the TPU compile check cannot run here, or None."""
  if (why := aot_fixtures.old_jax("TPU")):
    return why
  if importlib.util.find_spec("libtpu") is None:
    return "libtpu is not installed (pip install 'libtpu==0.0.48.*')"
  return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


compiled = aot_fixtures.compiled_fixture(__name__, DETAIL, _missing() is None)


@pytest.mark.parametrize("target,case", aot_fixtures.cases(TARGETS))
def test_compiles(compiled, target, case):
  result = compiled(target)[case]
  assert result["ok"], f"{case} does not compile for {target}: {result['error']}"
