"""The chunk-delta Pallas kernels against the ops/ XLA twin, in interpret mode on CPU.

Parametrised over the kernel paths: the GPU (Triton) kernels with
``interpret=True`` and the TPU (Mosaic) kernels with
``interpret=pltpu.InterpretParams()``; natively when that hardware is present.
Shapes are tiny (interpret mode runs every kernel op eagerly) but exercise a
partial last chunk (T = 40, chunks of 16), two value blocks on GPU, two
heads, a non-zero initial state, gates and packed segments.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from linear_attention import ops
from linear_attention.engines.delta import pallas as cdl
from tests.helpers import BF16_ATOL, BF16_RTOL, assert_close, keys, rand

B, T, H, K, V = 1, 40, 2, 16, 32
CHUNK = 16

PATHS = {
    "gpu": dict(platform="gpu", block_sizes=cdl.ChunkDeltaBlockSizes(block_v=16)),
    "tpu": dict(platform="tpu", block_sizes=cdl.ChunkDeltaBlockSizes(block_v=128)),
}
NAMES = ("q", "k", "v", "beta", "log_decay", "initial_state")


def _interpret(platform):
  if jax.default_backend() == platform:
    return False
  return pltpu.InterpretParams() if platform == "tpu" else True


@pytest.fixture(params=sorted(PATHS))
def path(request):
  p = dict(PATHS[request.param])
  return dict(p, interpret=_interpret(p["platform"]), chunk_size=CHUNK)


def make(gated=True, dtype=jnp.float32, t=T, dk=K, dv=V, seed=0):
  """Unit keys, beta in (0, 1), gates in (-1, 0), a unit-normal initial state."""
  kq, kk, kv, kb, kg, ks = keys(seed, 6)
  q, v = rand(kq, (B, t, H, dk)), rand(kv, (B, t, H, dv))
  k = rand(kk, (B, t, H, dk))
  k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
  beta = jax.nn.sigmoid(rand(kb, (B, t, H)))
  g = -jax.random.uniform(kg, (B, t, H)) if gated else None
  cast = lambda x: x.astype(dtype)
  return cast(q), cast(k), cast(v), beta, g, rand(ks, (B, H, dk, dv))


def _vjps(kernel, reference, args):
  """Outputs and input cotangents of both functions for one random cotangent."""
  out, vjp = jax.vjp(kernel, *args)
  ref, vjp_ref = jax.vjp(reference, *args)
  cts = lambda o: (rand(keys(7, 1)[0], o[0].shape, o[0].dtype),
                   rand(keys(8, 1)[0], o[1].shape, o[1].dtype))
  return out, ref, vjp(cts(out)), vjp_ref(cts(ref))


def _assert_grads_close(grads, ref_grads, rtol, atol, names=NAMES):
  """Each gradient within tolerance of its reference, relative to the reference's size."""
  for name, a, e in zip(names, grads, ref_grads):
    if e is None:
      assert a is None, name
      continue
    scale = float(np.max(np.abs(np.asarray(e, np.float32)))) + 1.0
    assert_close(a / scale, e / scale, rtol, atol, name)


class TestChunkDeltaKernel:

  @pytest.mark.parametrize("gated", [False, True], ids=["deltanet", "gated"])
  def test_forward_and_vjp_match_xla_and_recurrence(self, path, gated):
    args = make(gated)
    kernel = lambda *a: cdl.chunk_delta_attention(*a[:5], initial_state=a[5], return_state=True,
                                                  **path)
    for form in ("chunk", "recurrent"):  # the XLA twin, then the float32 reference
      xla = lambda *a: ops.delta_rule(*a[:5], initial_state=a[5], return_state=True, form=form,
                                      chunk_size=CHUNK)
      out, ref, grads, ref_grads = _vjps(kernel, xla, args)
      assert_close(out[0], ref[0], 1e-4, 1e-4, f"o vs {form}")
      assert_close(out[1], ref[1], 1e-4, 1e-4, f"state vs {form}")
      _assert_grads_close(grads, ref_grads, 1e-4, 1e-4)

  def test_segments_odd_sizes_and_hard_reset(self, path):
    # Three packed segments (one boundary inside a chunk, one on a chunk edge),
    # K and V not powers of two, T = 37, and a gate of -inf (exp = 0) mid-chunk.
    t, dk, dv = 37, 12, 20
    q, k, v, beta, g, s0 = make(True, t=t, dk=dk, dv=dv, seed=1)
    g = g.at[:, 5, 0].set(-jnp.inf)
    seg = jnp.asarray([[0] * 10 + [1] * 22 + [2] * 5], jnp.int32)
    kernel = lambda *a: cdl.chunk_delta_attention(*a[:5], initial_state=a[5], return_state=True,
                                                  segment_ids=seg, **path)
    ref = lambda *a: ops.delta_rule(*a[:5], initial_state=a[5], return_state=True,
                                    segment_ids=seg, form="recurrent")
    out, expected, grads, ref_grads = _vjps(kernel, ref, (q, k, v, beta, g, s0))
    assert_close(out[0], expected[0], 1e-4, 1e-4, "o")
    assert_close(out[1], expected[1], 1e-4, 1e-4, "state")
    _assert_grads_close(grads, ref_grads, 1e-4, 1e-4)

  def test_bfloat16_inputs(self, path):
    # bf16 dot operands (Qg, W, Ke, Am, U rounded once; the float32 state and D
    # where they meet a dot) with float32 accumulation and state: outputs within
    # the shared bf16 tolerance of the float32 recurrence; gradients (relative to
    # their largest entry) too.
    q, k, v, beta, g, s0 = make(True, dtype=jnp.bfloat16)
    kernel = lambda q, k, v, beta, g, s0: cdl.chunk_delta_attention(
        q, k, v, beta, g, initial_state=s0, return_state=True, **path)
    f32 = lambda x: x.astype(jnp.float32)
    ref = lambda q, k, v, beta, g, s0: ops.delta_rule(
        f32(q), f32(k), f32(v), beta, g, initial_state=s0, return_state=True, form="recurrent")
    out, expected, grads, ref_grads = _vjps(kernel, ref, (q, k, v, beta, g, s0))
    assert out[0].dtype == jnp.bfloat16 and out[1].dtype == jnp.float32
    assert_close(out[0], expected[0], BF16_RTOL, BF16_ATOL, "o")
    assert_close(out[1], expected[1], BF16_RTOL, BF16_ATOL, "state")
    _assert_grads_close(grads, ref_grads, BF16_RTOL, BF16_ATOL)


def test_bad_arguments():
  q, k, v, beta, g, _ = make(True)
  with pytest.raises(ValueError, match="chunk_size must be a power of two"):
    cdl.chunk_delta_attention(q, k, v, beta, g, chunk_size=24, platform="gpu")
  with pytest.raises(ValueError, match="chunk_size must be a multiple of 16"):
    cdl.chunk_delta_attention(q, k, v, beta, g, chunk_size=24, platform="tpu")
  with pytest.raises(ValueError, match="block_sizes must be a ChunkDeltaBlockSizes"):
    cdl.chunk_delta_attention(q, k, v, beta, g, block_sizes=object())
  with pytest.raises(ValueError, match="block_sizes.block_v"):
    cdl.ChunkDeltaBlockSizes(block_v=0)
  with pytest.raises(ValueError, match="beta"):
    cdl.chunk_delta_attention(q, k, v, beta[..., :1], g)
  assert cdl.unsupported_arguments(q, beta, g, chunk_size=64, platform="gpu") == {}
  assert "chunk_size" in cdl.unsupported_arguments(q, beta, g, chunk_size=48, platform="gpu")
  assert cdl.unsupported_arguments(q, beta, g, chunk_size=48, platform="tpu") == {}
  with pytest.raises(ValueError, match="q must be a floating-point"):
    cdl.chunk_delta_attention(q.astype(jnp.int32), k, v, beta, g)


def test_ops_dispatch_reaches_the_kernel():
  """``implementation="pallas"`` in the ops runs the kernel (interpreted on CPU) with the
  XLA op's answer; what the kernel cannot take falls back under ``None`` and raises under
  ``"pallas"``, naming the argument."""
  q, k, v, beta, g, s0 = make(True, t=21, seed=3)
  for fn, gate in ((ops.gated_deltanet, (g,)), (ops.deltanet, ())):
    got = fn(q, k, v, beta, *gate, initial_state=s0, return_state=True, chunk_size=16,
             implementation="pallas")
    want = fn(q, k, v, beta, *gate, initial_state=s0, return_state=True, chunk_size=16,
              implementation="xla")
    assert_close(got[0], want[0], 1e-4, 1e-4, fn.__name__)
    assert_close(got[1], want[1], 1e-4, 1e-4, fn.__name__)
  with pytest.raises(ValueError, match="form"):
    ops.delta_rule(q, k, v, beta, g, form="recurrent", implementation="pallas")
  with pytest.raises(ValueError, match="chunk_size"):
    ops.delta_rule(q, k, v, beta, g, chunk_size=24, implementation="pallas")
  # implementation=None on CPU stays XLA, whatever the chunk size.
  assert_close(ops.delta_rule(q, k, v, beta, g, chunk_size=24),
               ops.delta_rule(q, k, v, beta, g, chunk_size=24, implementation="xla"), 0, 0)
