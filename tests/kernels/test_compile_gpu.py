"""Every Pallas kernel compiles for GPU targets, with no register spills, on a host with no GPU.

Deviceless ahead-of-time compilation (``linear_attention.kernels.aot``): each
case (chunk decay, flash attention, linear scan; forward and backward in one
program; bfloat16 and float32; every decay and attention mode; initial and
final state; the ``experiments/gpu_check.py`` shapes and a small odd one) is
compiled for an H200 (sm_90, 232448 B of shared memory per block) and an A100
(sm_80, 166912 B) through Triton and ``ptxas``. A case fails when the compiler
refuses it (e.g. ``RESOURCE_EXHAUSTED: Shared memory size limit exceeded``) or
when ``ptxas -v`` reports spilled registers in one of its Pallas kernels.

Runs in ``.ci/run``'s compile stage (Python 3.12, jax 0.11.2 with
``jax-cuda13-plugin``); elsewhere it skips, saying what is missing.
"""

from __future__ import annotations

import functools
import importlib.util
import shutil

import jax
import pytest

from linear_attention.kernels import aot

TARGETS = ("h200", "a100")
# Spills measured and accepted, {(target, kernel name prefix): max spill bytes}
# (none: every kernel compiles without spilling at its default block sizes).
ACCEPTED_SPILLS: dict[tuple[str, str], int] = {}


def _missing() -> str | None:
  """Why the GPU compile check cannot run here, or None."""
  version = tuple(int(x) for x in jax.__version__.split(".")[:2])
  if version < (0, 11):
    return (f"deviceless GPU compilation needs jax >= 0.11 with jax-cuda13-plugin (Python "
            f"3.12; .ci/run's compile stage), got jax {jax.__version__}")
  if importlib.util.find_spec("jax_plugins.xla_cuda13") is None:
    return "jax-cuda13-plugin is not installed (pip install jax-cuda13-plugin==0.11.2)"
  if shutil.which("ptxas") is None:
    return "ptxas is not on PATH (CUDA toolkit, or the nvidia-cuda-nvcc wheel)"
  return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


@functools.lru_cache(maxsize=None)
def _results(target: str) -> dict[str, dict]:
  """All cases of ``target``, compiled once per test session (one child process)."""
  return aot.run_target(target, timeout=1200)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", sorted(aot.CASES))
def test_compiles_without_spills(target, case):
  result = _results(target)[case]
  assert result["ok"], f"{case} does not compile for {target}: {result['error']}"
  kernels = result["kernels"]
  prefix = aot.CASES[case].kernel
  assert any(k.startswith(prefix) for k in kernels), (
      f"no ptxas/thunk report for the {prefix} kernels of {case}: {sorted(kernels)}")
  for name, stats in kernels.items():
    allowed = max([n for (t, p), n in ACCEPTED_SPILLS.items()
                   if t == target and name.startswith(p)], default=0)
    spilled = stats.get("spill_stores", 0) + stats.get("spill_loads", 0)
    assert spilled <= allowed, (
        f"{name} in {case} spills registers on {target}: {stats['registers']} registers, "
        f"{stats['spill_stores']} B stored, {stats['spill_loads']} B loaded")
    assert stats.get("shared_memory", 0) <= aot.GPU_SPECS[target]["smem_optin"]
