"""Flash attention kernel vs ``ops.softmax_attention(algorithm="naive")``.

One test class, run once per interpret mode on CPU (the GPU path with
``interpret=True``, the TPU path with ``pltpu.InterpretParams()``) and natively
on a GPU or TPU when one is present. Tiny shapes: blocks of 16 over T = 37, so
every case has partial blocks, skipped blocks and several heads.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import pytest
from jax.experimental.pallas import tpu as pltpu

from linear_attention.engines import dispatch
from linear_attention.engines.softmax import pallas as fa
from linear_attention.ops import sliding_window_attention, softmax_attention
from tests.helpers import BF16_ATOL, BF16_RTOL, assert_close, keys, rand

B, T, H, D = 2, 37, 2, 16
SMALL = fa.FlashBlockSizes(16, 16, 16, 16, 16, 16)
# Segments of 10, 20 and 7 tokens (row 0) and 25, 12 (row 1); ids reused to
# check that a segment is a run of equal ids.
SEGMENTS = jnp.array([[0] * 10 + [1] * 20 + [0] * 7, [5] * 25 + [2] * 12], jnp.int32)

MODES = [
    pytest.param(dict(platform="gpu", interpret=True), id="gpu-interpret"),
    pytest.param(dict(platform="tpu", interpret=pltpu.InterpretParams()), id="tpu-interpret"),
]
if dispatch.current_platform() is not None:
  MODES.append(pytest.param(dict(platform=dispatch.current_platform(), interpret=False),
                            id="native"))


def _inputs(dtype=jnp.float32, heads_kv=H, dv=D):
  kq, kk, kv, kw = keys(0, 4)
  q = rand(kq, (B, T, H, D), dtype)
  k = rand(kk, (B, T, heads_kv, D), dtype)
  v = rand(kv, (B, T, heads_kv, dv), dtype)
  w = rand(kw, (B, T, H, dv))
  return q, k, v, w


def _reference(q, k, v, causal, segment_ids, window):
  g = q.shape[2] // k.shape[2]
  k, v = jnp.repeat(k, g, axis=2), jnp.repeat(v, g, axis=2)
  if window is None:
    return softmax_attention(q, k, v, causal=causal, segment_ids=segment_ids,
                             algorithm="naive")
  return sliding_window_attention(q, k, v, causal=causal, segment_ids=segment_ids,
                                  window=window, implementation="xla")


def _value_and_grads(fn, q, k, v, w):
  """Output and ``d/d(q, k, v)`` of ``sum(fn(q, k, v) * w)``, in one jit."""

  def loss(q, k, v):
    o = fn(q, k, v)
    return jnp.sum(o.astype(jnp.float32) * w), o

  return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)


@pytest.mark.parametrize("mode", MODES)
class TestFlashAttention:

  @pytest.mark.parametrize("causal,segmented,window,heads_kv", [
      (False, False, None, H),  # padding masked in the last key block
      (True, True, None, 1),  # GQA: one key head for two query heads
      (True, False, 5, H),  # band: skipped and partial blocks on both sides
      (False, True, 20, H),  # two-sided window with segments
  ])
  def test_forward_and_vjp_float32(self, mode, causal, segmented, window, heads_kv):
    q, k, v, w = _inputs(heads_kv=heads_kv)
    seg = SEGMENTS if segmented else None
    kernel = functools.partial(fa.flash_attention, causal=causal, segment_ids=seg, window=window,
                               block_sizes=SMALL, **mode)
    ref = functools.partial(_reference, causal=causal, segment_ids=seg, window=window)
    (_, o), g = _value_and_grads(kernel, q, k, v, w)
    (_, o_ref), g_ref = _value_and_grads(ref, q, k, v, w)
    assert_close(o, o_ref, 1e-5, 1e-5, "o")
    for name, a, e in zip("qkv", g, g_ref):
      assert_close(a, e, 1e-4, 1e-4, f"d{name}")

  def test_bfloat16(self, mode):
    # bf16 inputs, f32 statistics: p and ds are rounded to bf16 before the
    # matmuls (as FlashAttention does), so agreement is to bf16 resolution
    # (tests/helpers.py BF16 tolerances) against the float32 reference.
    q, k, v, w = _inputs()
    kernel = functools.partial(fa.flash_attention, causal=True, block_sizes=SMALL, **mode)
    qb, kb, vb = (x.astype(jnp.bfloat16) for x in (q, k, v))
    (_, o), g = _value_and_grads(kernel, qb, kb, vb, w)
    (_, o_ref), g_ref = _value_and_grads(
        functools.partial(_reference, causal=True, segment_ids=None, window=None), q, k, v, w)
    assert o.dtype == jnp.bfloat16
    assert_close(o, o_ref, BF16_RTOL, BF16_ATOL, "o")
    for name, a, e in zip("qkv", g, g_ref):
      assert a.dtype == jnp.bfloat16
      assert_close(a, e, 2 * BF16_RTOL, 2 * BF16_ATOL, f"d{name}")

  def test_lse_scale_and_value_dim(self, mode):
    # V != K (a head dim padded on GPU), an explicit scale and the lse output.
    q, k, v, _ = _inputs(dv=24)
    o, lse = fa.flash_attention(q, k, v, causal=True, scale=0.3, block_sizes=SMALL,
                                return_lse=True, **mode)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k) * 0.3
    s = jnp.where(jnp.tril(jnp.ones((T, T), bool)), s, -jnp.inf)
    assert_close(lse, jnp.swapaxes(jax.nn.logsumexp(s, axis=-1), 1, 2), 1e-5, 1e-5, "lse")
    assert_close(o, softmax_attention(q, k, v, causal=True, scale=0.3, algorithm="naive"),
                 1e-5, 1e-5, "o")


def test_lowers_for_gpu_and_tpu():
  """The real (non-interpret) kernels lower to Triton and to Mosaic on a CPU host."""
  q = jax.ShapeDtypeStruct((1, 300, 2, 64), jnp.bfloat16)
  seg = jax.ShapeDtypeStruct((1, 300), jnp.int32)
  for backend, platform in (("gpu", "cuda"), ("tpu", "tpu")):

    def f(q, k, v, s, backend=backend):
      fn = lambda q, k, v: fa.flash_attention(q, k, v, segment_ids=s, causal=True, scale=0.1,
                                              window=100, platform=backend, interpret=False)
      o, vjp = jax.vjp(fn, q, k, v)
      return o, vjp(o)

    checks = [jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")]
    exported = jax.export.export(jax.jit(f), platforms=[platform], disabled_checks=checks)(
        q, q, q, seg)
    text = exported.mlir_module()
    assert text.count("xla.gpu.triton(" if backend == "gpu" else "tpu_custom_call") == 3


def test_errors_name_the_argument():
  q, k, v, _ = _inputs()
  run = functools.partial(fa.flash_attention, interpret=True)
  with pytest.raises(ValueError, match="window must be an integer >= 1"):
    run(q, k, v, window=0)
  with pytest.raises(ValueError, match="k must have a number of heads dividing"):
    run(q, k[:, :, :1].repeat(3, axis=2), v)
  with pytest.raises(ValueError, match="q must be a floating-point array"):
    run(*(x.astype(jnp.int32) for x in (q, k, v)))
  with pytest.raises(ValueError, match="block_sizes.block_k must be a power of two >= 16"):
    run(q, k, v, block_sizes=fa.FlashBlockSizes(block_k=24))
  with pytest.raises(ValueError, match="block_sizes.block_k must be a power of two >= 128"):
    fa.flash_attention(q, k, v, platform="tpu", interpret=False,
                       block_sizes=fa.FlashBlockSizes(block_k=64))
  with pytest.raises(ValueError, match="platform must be one of"):
    run(q, k, v, platform="cpu")
  with pytest.raises(ValueError, match="segment_ids must have shape"):
    run(q, k, v, segment_ids=SEGMENTS[:, :5])
  with pytest.raises(ValueError, match="k must have shape"):
    run(q, k[:, :5], v)
  with pytest.raises(ValueError, match="algorithm applies to the XLA paths only"):
    softmax_attention(q, k, v, implementation="pallas", algorithm="naive")


def test_ops_dispatch_default_matches_xla():
  # implementation=None is the XLA path on CPU and the kernel on GPU/TPU: same numbers.
  q, k, v, _ = _inputs()
  ref = softmax_attention(q, k, v, causal=True, algorithm="naive")
  assert_close(softmax_attention(q, k, v, causal=True), ref, 1e-5, 1e-5)
  assert_close(softmax_attention(q, k, v, causal=True, implementation="xla"), ref, 1e-5, 1e-5)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("dk,dv,heads,heads_kv", [
    (192, 128, 2, 2),  # MLA: q/k head 192 (padded to 256 on GPU), value head 128
    (256, 256, 4, 2),  # Qwen3-Next / RecurrentGemma: head 256 with grouped KV heads
])
def test_large_heads_with_default_tiles(mode, dk, dv, heads, heads_kv):
  """The heads of the real models, with the tiles chosen for them (no block_sizes), match
  the XLA reference forward and gradient in float32 (odd T: partial blocks)."""
  t = 45
  kq, kk, kv, kw = keys(1, 4)
  q = rand(kq, (1, t, heads, dk))
  k = rand(kk, (1, t, heads_kv, dk))
  v = rand(kv, (1, t, heads_kv, dv))
  w = rand(kw, (1, t, heads, dv))
  kernel = functools.partial(fa.flash_attention, causal=True, **mode)
  ref = functools.partial(_reference, causal=True, segment_ids=None, window=None)
  (_, o), g = _value_and_grads(kernel, q, k, v, w)
  (_, o_ref), g_ref = _value_and_grads(ref, q, k, v, w)
  assert o.shape == (1, t, heads, dv)
  assert_close(o, o_ref, 1e-5, 1e-5, "o")
  for name, a, e in zip("qkv", g, g_ref):
    assert_close(a, e, 1e-4, 1e-4, f"d{name}")


def test_default_tiles_follow_the_head():
  """GPU tiles shrink for heads above 128 (Triton's shared memory), per dtype; padded heads
  (80 -> 128, 192 -> 256) take their padded size's tiles; TPU keeps 128 for every head."""
  gpu = lambda dtype, dk, dv=None: fa.FlashBlockSizes.default("gpu", dtype, dk, dv)
  bf16, f32 = jnp.bfloat16, jnp.float32
  assert gpu(bf16, 128) == gpu(bf16, 64) == gpu(bf16, 80) == gpu(bf16, None)
  assert gpu(bf16, 128) == fa.FlashBlockSizes(num_warps=8)
  assert gpu(bf16, 192, 128) == gpu(bf16, 256) == gpu(bf16, 64, 256)
  big = gpu(bf16, 256)
  assert (big.block_q, big.block_k, big.block_k_dkv, big.num_stages) == (64, 32, 32, 2)
  assert gpu(f32, 256).block_k_dkv == 16 and gpu(f32, 96) == gpu(f32, 128)
  assert gpu(f32, 128).block_q == 64 and gpu(f32, 128).block_k_dq == 32
  assert gpu(jnp.float16, 256) == big
  # Past the table: blocks halve per doubling, never below Triton's 16.
  assert gpu(bf16, 512).block_q == 32 and gpu(f32, 1024).block_q == 16
  for d in (64, 96, 192, 256, 512):
    tpu = fa.FlashBlockSizes.default("tpu", bf16, d)
    assert tpu == fa.FlashBlockSizes(128, 128, 128, 128, 128, 128)
    tpu.check("tpu")
    gpu(bf16, d).check("gpu")
    gpu(f32, d).check("gpu")
  with pytest.raises(ValueError, match="head_dim must be an integer >= 1"):
    fa.FlashBlockSizes.default("gpu", bf16, 0)
  with pytest.raises(ValueError, match="platform must be one of"):
    fa.FlashBlockSizes.default("cpu", bf16, 64)
