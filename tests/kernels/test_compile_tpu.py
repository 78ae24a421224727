"""Every Pallas kernel compiles for TPU v5e and v6e on a host with no TPU.

The cases of ``linear_attention.kernels.aot`` (as in ``test_compile_gpu.py``)
compiled for compile-only TPU devices (``get_topology_desc("v5e:2x2")``,
``"v6e:2x2"``) with libtpu: Mosaic runs inside the compile, so a kernel that
Mosaic cannot lower or lay out fails here as it would on the chip. Mosaic
failures may abort the compiler process, so ``aot.run_target`` runs the cases
in a child process and restarts it after a crash; one libtpu process at a time.

Cases: every kernel in bfloat16 at both shapes on v5e; on v6e bfloat16 and
float32 at the ``gpu_check`` shapes. Float32 compiles on one TPU target only
(v6e), and not at the odd shape: Mosaic lays out float32 tiles with the plain
(8, 128) tiling, which the bfloat16 cases' packed (16, 128) tiling and the odd
shape's padding already exercise, and a TPU case costs about 17 CPU seconds at
the ``gpu_check`` shape (7 at the odd one) against 4-10 on GPU.

Runs in ``.ci/run``'s compile stage (Python 3.12, jax 0.11.2, libtpu 0.0.48);
elsewhere it skips, saying what is missing.
"""

from __future__ import annotations

import importlib.util

import jax
import pytest

from linear_attention.kernels import aot
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


@pytest.mark.parametrize("target,case", aot_fixtures.cases(
    TARGETS, first=lambda c: "/bf16/" in c, others=lambda c: c.endswith("/gpu_check")))
def test_compiles(compiled, target, case):
  result = compiled(target)[case]
  assert result["ok"], f"{case} does not compile for {target}: {result['error']}"
