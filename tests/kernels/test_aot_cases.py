"""CI's compile selection (``aot.ci_cases``) keeps every kernel and mode on every target.

No compile here (that is ``test_compile_{gpu,tpu}.py``, in CI's compile stage): this
checks the case lists, so that a cut in ``aot.CI_GROUPS`` cannot drop a kernel or a
mode from a target unnoticed (issue 27: every kernel compiled for H200, A100, v5e, v6e).
"""

import pytest

from tests.kernels import aot


def _kernel_mode(name: str) -> str:
  """``"chunk_decay/vector"`` from ``"chunk_decay/vector/bf16/small"``; the scan's
  direction is not a mode (reverse is at the odd shape only)."""
  kernel, mode = name.split("/")[:2]
  return kernel if kernel == "linear_scan" else f"{kernel}/{mode}"


@pytest.mark.parametrize("target", ["h200", "a100", "v5e", "v6e"])
def test_every_kernel_and_mode_on_every_target(target):
  every = {_kernel_mode(n) for n in aot.CASES if n.split("/")[3] in aot.SHAPES}
  assert len(every) == 10, sorted(every)
  chosen = aot.ci_cases(target)
  assert {_kernel_mode(n) for n in chosen if n.split("/")[3] in aot.SHAPES} == every
  # bf16 everywhere, and at a shape with the gpu_check tiles (K = V = 128).
  tiles = [n for n in chosen if "/bf16/" in n and n.split("/")[3] in aot.SHAPES
           and aot.shape_of(n)["k"] == 128]
  assert {_kernel_mode(n) for n in tiles} == every


@pytest.mark.parametrize("target", ["h200", "a100", "v5e", "v6e"])
def test_flash_at_every_family_head_size_on_every_target(target):
  """Issue 37: flash attention with grouped KV heads at heads 64-256 (and MLA's 192/128),
  bf16, on H200, A100, v5e and v6e; float32 at the largest heads on H200, A100 and v5e."""
  chosen = set(aot.ci_cases(target))
  heads = {(aot.shape_of(n)["k"], aot.shape_of(n)["v"]) for n in chosen
           if n.startswith("flash_attention/causal_gqa/bf16/")}
  assert heads == {(64, 64), (80, 80), (96, 96), (128, 128), (192, 128), (256, 256)}
  for n in chosen:
    if n.startswith("flash_attention/causal_gqa/"):
      s = aot.shape_of(n)
      assert s["h"] > s["hkv"] or s["k"] != s["v"], n  # GQA, or MLA's own value head
  if target != "v6e":
    assert {"flash_attention/causal_gqa/f32/d192v128",
            "flash_attention/causal_gqa/f32/d256"} <= chosen


def test_shape_of():
  assert aot.shape_of("flash_attention/causal_gqa/bf16/d256")["k"] == 256
  assert aot.shape_of("chunk_delta/gated/bf16/k128v256")["v"] == 256
  with pytest.raises(ValueError, match="case_name must end in a shape"):
    aot.shape_of("flash_attention/causal/bf16/huge")

def test_gpu_bf16_at_the_gpu_check_shapes():
  """Spills are judged at the shapes users run (tests/kernels/test_compile_gpu.py)."""
  every = {n for n in aot.CASES if n.endswith("/bf16/gpu_check")}
  assert len(every) == 10
  for target in ("h200", "a100"):
    assert every <= set(aot.ci_cases(target)), target

def test_small_shape_has_the_gpu_check_tiles():
  small, big = aot.SHAPES["small"], aot.SHAPES["gpu_check"]
  assert (small["k"], small["v"]) == (big["k"], big["v"])
  assert small["t"] % 256 == 0 and small["t"] // 2 >= 512  # every block; the same window
  assert small["scan_d"][-1] % 128 == 0


def test_unknown_target():
  with pytest.raises(ValueError, match="b200"):
    aot.ci_cases("b200")
  with pytest.raises(ValueError, match="target must be one of"):
    aot.ci_cases("h100")


@pytest.mark.parametrize("target", ["h200", "a100", "v5e"])
def test_mixers_at_the_family_state_shapes_on_every_target(target):
  """The delta and DPLR kernels at K 128, V 256 (aot.MIXER_SHAPES), bf16, on both GPUs, and
  with grouped value heads on H200 and v5e (v6e compiles the same Mosaic kernel bodies at
  the small shape only)."""
  chosen = set(aot.ci_cases(target))
  for shape in aot.MIXER_SHAPES:
    grouped = "hk" in aot.MIXER_SHAPES[shape]
    if (grouped and target not in ("h200", "v5e")) or (not grouped and target == "v5e"):
      assert f"chunk_dplr/channel/bf16/{shape}" not in chosen
      continue  # grouped value heads: one GPU and one TPU target; v5e: only grouped
    assert {f"chunk_delta/gated/bf16/{shape}", f"chunk_dplr/channel/bf16/{shape}"} <= chosen
    if "hk" in aot.MIXER_SHAPES[shape]:
      assert f"chunk_delta/deltanet/bf16/{shape}" in chosen
