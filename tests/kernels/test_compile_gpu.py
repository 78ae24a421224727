"""Every Pallas kernel compiles for GPU targets, with no register spills, on a host with no GPU.

Deviceless ahead-of-time compilation (``tests.kernels.aot``): each
case (chunk decay, flash attention, linear scan; forward and backward in one
program; bfloat16 and float32; every decay and attention mode; initial and
final state; the ``experiments/checks/gpu_check.py`` shapes and a small odd one) is
compiled for an H200 (sm_90, 232448 B of shared memory per block) and an A100
(sm_80, 166912 B) through Triton and ``ptxas``. A case fails when the compiler
refuses it (e.g. ``RESOURCE_EXHAUSTED: Shared memory size limit exceeded``) or
when ``ptxas -v`` reports spilled registers in one of its Pallas kernels beyond
the measured exceptions of :data:`ACCEPTED_SPILLS`. Which cases run on which
target, and why the others were cut, is at ``aot.CI_GROUPS``: on H200 bf16 and
float32 at the ``gpu_check`` shapes and bf16 at the odd one, on A100 bf16 at the
``gpu_check`` shapes; on both, flash attention with grouped KV heads at the head sizes
of the families ``linear_attention.hub`` loads (64 to 256, MLA's 192/128; bf16, and
float32 at the largest) and the delta and DPLR kernels at K 128, V 256.

Runs in ``.ci/run``'s compile stage (Python 3.12, jax 0.11.2 with
``jax-cuda13-plugin``); elsewhere it skips, saying what is missing.
"""

from __future__ import annotations

import importlib.util
import shutil

import jax
import pytest

from tests.kernels import aot
from tests.kernels import aot_fixtures

TARGETS = ("h200", "a100")
DETAIL = True  # shared memory, registers and spills per kernel
# Measured exceptions: {(Pallas kernel name prefix, input dtype): spilled bytes
# (stores + loads) allowed, the most measured on H200 (all cases) and A100
# (gpu_check shapes) rounded up to 512 B}, so that more spilling fails too.
# Everything else must not spill (bf16 flash attention and the scan do not).
# * chunk_decay_fwd, float32 only: 16 B on H200 without a decay (255 registers;
#   block_v 16 for float32, 8 warps, 2 stages; 1320 B at block_v 32). The
#   backward spills nothing since its dk/dv sweep is two kernels, bwd_dk and
#   bwd_dv (one kernel for both, chunk 16: 24 B in bf16 on A100 with per-channel
#   decays, up to 6392 B in float32 on H200; 8 other tilings failed for it).
# * chunk_delta fwd, states and bwd, float32 only (3-pass TF32 dots of float32
#   [64, 128] tiles, one pipeline stage): 704 / 40 / 1180 B on H200 at the
#   gpu_check shape (Triton's exact float32 dot spilled 49540 / 20228 / 6216 B);
#   bf16 spills nothing on H200 or A100.
# * chunk_dplr (chunk_delta's kernels with the DPLR algebra: a per-channel decay
#   column and the direct writes Ke^T V), float32 only: 1000 / 232 / 2140 B
#   (fwd / states / bwd) on H200 at the gpu_check shape; the odd shape and bf16
#   (H200 and A100) spill nothing.
# * flash_attention dq and dk/dv, float32 only: float32 tiles of a head of 128 (and the
#   dk/dv kernel's smaller tiles at heads of 192 and 256, engines.dispatch.FLASH_TILES).
ACCEPTED_SPILLS: dict[tuple[str, str], int] = {
    ("chunk_decay_fwd", "f32"): 512,
    ("chunk_delta_bwd", "f32"): 1536,
    ("chunk_delta_fwd", "f32"): 1024,
    ("chunk_delta_states", "f32"): 512,
    ("chunk_dplr_bwd", "f32"): 2560,
    ("chunk_dplr_fwd", "f32"): 1024,
    ("chunk_dplr_states", "f32"): 512,
    ("flash_attention_dkv", "f32"): 35840,
    ("flash_attention_dq", "f32"): 512,
}


def _missing() -> str | None:
  """Why the GPU compile check cannot run here, or None."""
  if (why := aot_fixtures.old_jax("GPU")):
    return why
  if importlib.util.find_spec("jax_plugins.xla_cuda13") is None:
    return "jax-cuda13-plugin is not installed (pip install jax-cuda13-plugin==0.11.2)"
  if shutil.which("ptxas") is None:
    return "ptxas is not on PATH (CUDA toolkit, or the nvidia-cuda-nvcc wheel)"
  return None


pytestmark = pytest.mark.skipif(_missing() is not None, reason=str(_missing()))


compiled = aot_fixtures.compiled_fixture(__name__, DETAIL, _missing() is None)


@pytest.mark.parametrize("target,case", aot_fixtures.cases(TARGETS))
def test_compiles_without_spills(compiled, target, case):
  result = compiled(target)[case]
  assert result["ok"], f"{case} does not compile for {target}: {result['error']}"
  kernels = result["kernels"]
  prefix = aot.CASES[case].kernel
  assert any(k.startswith(prefix) for k in kernels), (
      f"no ptxas/thunk report for the {prefix} kernels of {case}: {sorted(kernels)}")
  dtype = case.split("/")[2]
  for name, stats in kernels.items():
    allowed = max([n for (p, d), n in ACCEPTED_SPILLS.items()
                   if d == dtype and name.startswith(p)], default=0)
    spilled = stats.get("spill_stores", 0) + stats.get("spill_loads", 0)
    assert spilled <= allowed, (
        f"{name} in {case} spills registers on {target}: {stats['registers']} registers, "
        f"{stats['spill_stores']} B stored, {stats['spill_loads']} B loaded")
    assert stats.get("shared_memory", 0) <= aot.GPU_SPECS[target]["smem_optin"]
