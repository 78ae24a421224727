"""The DPLR Pallas kernels (``kernels.chunk_dplr``) against the ops/ XLA twin and the
recurrence, in interpret mode on CPU.

Parametrised over the GPU (Triton, ``interpret=True``) and TPU (Mosaic,
``pltpu.InterpretParams()``) kernel paths. Shapes are tiny (interpret mode runs
every kernel op eagerly) but take a partial last chunk (T = 37, chunks of 16),
two value blocks on GPU, two heads, a non-zero initial state, per-channel and
per-head decays, ``R = 2`` sub-steps and packed segments.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from linear_attention import ops
from linear_attention.engines.dplr import pallas as cdp
from tests.helpers import BF16_ATOL, BF16_RTOL, assert_close, keys, rand
from tests.kernels.test_chunk_delta import PATHS, _assert_grads_close, _interpret, _vjps

B, T, H, K, V = 1, 37, 2, 16, 32
CHUNK = 16
NAMES = ("q", "k", "v", "a", "b", "log_decay", "initial_state")


@pytest.fixture(params=sorted(PATHS))
def path(request):
  p = dict(PATHS[request.param])
  return dict(p, interpret=_interpret(p["platform"]), chunk_size=CHUNK)


def make(r=None, decay="channel", dtype=jnp.float32, t=T, dk=K, dv=V, seed=0):
  """Delta-rule-like corrections (``a = -beta b``, unit ``b``, beta in (0, 1)) with an
  independent write key, decays in (-1, 0) per channel or per head, a unit-normal state."""
  kq, kk, kv, kb, kbeta, kg, ks = keys(seed, 7)
  lead = (B, t, H) + (() if r is None else (r,))
  q, v = rand(kq, (B, t, H, dk)), rand(kv, lead + (dv,))
  k = 0.5 * rand(kk, lead + (dk,))
  b = rand(kb, lead + (dk,))
  b = b / jnp.linalg.norm(b, axis=-1, keepdims=True)
  a = -jax.nn.sigmoid(rand(kbeta, lead))[..., None] * b
  g = {"channel": lambda: -jax.random.uniform(kg, (B, t, H, dk)),
       "head": lambda: -jax.random.uniform(kg, (B, t, H)), "none": lambda: None}[decay]()
  cast = lambda x: x.astype(dtype)
  return cast(q), cast(k), cast(v), cast(a), cast(b), g, rand(ks, (B, H, dk, dv))


def _kernel(path, **kw):
  return lambda *x: cdp.chunk_dplr_attention(*x[:6], initial_state=x[6], return_state=True,
                                             **path, **kw)


def _ops(form, **kw):
  return lambda *x: ops.dplr_attention(*x[:6], initial_state=x[6], return_state=True,
                                       form=form, chunk_size=CHUNK, **kw)


def _check_against(path, args, forms=("chunk", "recurrent"), tol=1e-4, **kw):
  for form in forms:
    out, ref, grads, ref_grads = _vjps(_kernel(path, **kw), _ops(form, **kw), args)
    assert_close(out[0], ref[0], tol, tol, f"o vs {form}")
    assert_close(out[1], ref[1], tol, tol, f"state vs {form}")
    _assert_grads_close(grads, ref_grads, tol, tol, NAMES)


class TestChunkDplrKernel:

  def test_per_channel_decay_matches_xla_and_recurrence(self, path):
    _check_against(path, make())

  def test_substeps_per_head_decay(self, path):
    # R = 2 sub-steps per token (DeltaProduct) with one decay per head: 74 sub-steps.
    _check_against(path, make(r=2, decay="head", seed=2), forms=("recurrent",))

  def test_segments_odd_sizes_and_hard_reset(self, path):
    # Three packed segments (a boundary inside a chunk and one on a chunk edge), K and V
    # not powers of two, and a log decay of -inf (exp = 0) mid-chunk on one channel.
    t, dk, dv = 37, 12, 20
    q, k, v, a, b, g, s0 = make(t=t, dk=dk, dv=dv, seed=1)
    g = g.at[:, 5, 0, 3].set(-jnp.inf)
    seg = jnp.asarray([[0] * 10 + [1] * 22 + [2] * 5], jnp.int32)
    _check_against(path, (q, k, v, a, b, g, s0), forms=("recurrent",), segment_ids=seg)

  def test_a_none_is_minus_k(self, path):
    # a = None (KDA's and DeltaProduct's a = -k: the chunk terms compute the scores once)
    # against the recurrence given a = -k, with segments and a per-channel decay.
    q, k, v, _, b, g, s0 = make(seed=3)
    seg = jnp.asarray([[0] * 20 + [1] * 17], jnp.int32)
    kernel = lambda q, k, v, b, g, s0: cdp.chunk_dplr_attention(
        q, k, v, None, b, g, initial_state=s0, return_state=True, segment_ids=seg, **path)
    ref = lambda q, k, v, b, g, s0: ops.dplr_attention(
        q, k, v, -k, b, g, initial_state=s0, return_state=True, segment_ids=seg,
        form="recurrent")
    out, expected, grads, ref_grads = _vjps(kernel, ref, (q, k, v, b, g, s0))
    assert_close(out[0], expected[0], 1e-4, 1e-4, "o")
    assert_close(out[1], expected[1], 1e-4, 1e-4, "state")
    _assert_grads_close(grads, ref_grads, 1e-4, 1e-4,
                        ("q", "k", "v", "b", "log_decay", "initial_state"))

  def test_bfloat16_inputs(self, path):
    # bf16 dot operands (the chunk terms rounded once; the float32 state and U where they
    # meet a dot) with float32 accumulation and state: outputs and gradients (relative to
    # their largest entry) within the shared bf16 tolerance of the float32 recurrence.
    args = make(dtype=jnp.bfloat16)
    f32 = lambda x: x.astype(jnp.float32)
    ref = lambda q, k, v, a, b, g, s0: ops.dplr_attention(
        f32(q), f32(k), f32(v), f32(a), f32(b), g, initial_state=s0, return_state=True,
        form="recurrent")
    out, expected, grads, ref_grads = _vjps(_kernel(path), ref, args)
    assert out[0].dtype == jnp.bfloat16 and out[1].dtype == jnp.float32
    assert_close(out[0], expected[0], BF16_RTOL, BF16_ATOL, "o")
    assert_close(out[1], expected[1], BF16_RTOL, BF16_ATOL, "state")
    _assert_grads_close(grads, ref_grads, BF16_RTOL, BF16_ATOL, NAMES)


def _variant_args(seed=4, t=21):
  kq, kk, kv, kb, kg, kw, ka, ks = keys(seed, 8)
  q, k, v = rand(kq, (B, t, H, K)), rand(kk, (B, t, H, K)), rand(kv, (B, t, H, V))
  k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
  beta = jax.nn.sigmoid(rand(kb, (B, t, H)))
  return q, k, v, beta, -jax.random.uniform(kg, (B, t, H, K)), rand(ks, (B, H, K, V)), (kw, ka)


def test_variants_dispatch_to_the_kernel():
  """``implementation="pallas"`` in kda, rwkv7 and gated_deltaproduct runs the kernel
  (interpreted on CPU) with the XLA chunk form's outputs, state and gradients."""
  q, k, v, beta, g, s0, (kw, ka) = _variant_args()
  kappa = k
  icl = jax.nn.sigmoid(rand(ka, (B, q.shape[1], H, K)))
  bonus = rand(kw, (H, K))
  k2 = jnp.stack([k, jnp.roll(k, 1, axis=1)], axis=3)  # [B, T, H, 2, K]
  calls = {
      "kda": lambda impl, q, v, s0, g: ops.kda(
          q, k, v, beta, g, initial_state=s0, return_state=True, chunk_size=16,
          form="chunk", implementation=impl),
      "rwkv7": lambda impl, q, v, s0, g: ops.rwkv7(
          q, k, v, g, kappa, icl, bonus, initial_state=s0, return_state=True, chunk_size=16,
          form="chunk", implementation=impl),
      "gated_deltaproduct": lambda impl, q, v, s0, g: ops.gated_deltaproduct(
          q, k2, jnp.stack([v, -v], axis=3), jnp.stack([beta, 1 - beta], axis=-1), g[..., 0],
          initial_state=s0, return_state=True, chunk_size=16, form="chunk",
          implementation=impl),
  }
  for name, fn in calls.items():
    out, ref, grads, ref_grads = _vjps(lambda *x: fn("pallas", *x), lambda *x: fn("xla", *x),
                                       (q, v, s0, g))
    assert_close(out[0], ref[0], 1e-4, 1e-4, f"{name} o")
    assert_close(out[1], ref[1], 1e-4, 1e-4, f"{name} state")
    _assert_grads_close(grads, ref_grads, 1e-4, 1e-4, ("q", "v", "initial_state", "log_decay"))


def test_bad_arguments():
  q, k, v, a, b, g, _ = make(t=20)
  with pytest.raises(ValueError, match="chunk_size must be a power of two"):
    cdp.chunk_dplr_attention(q, k, v, a, b, g, chunk_size=24, platform="gpu")
  with pytest.raises(ValueError, match="chunk_size must be a multiple of 16"):
    cdp.chunk_dplr_attention(q, k, v, a, b, g, chunk_size=24, platform="tpu")
  with pytest.raises(ValueError, match="block_sizes must be a ChunkDeltaBlockSizes"):
    cdp.chunk_dplr_attention(q, k, v, a, b, g, block_sizes=object())
  with pytest.raises(ValueError, match=r"b must have shape .*\[1, 20, 2, 16\]"):
    cdp.chunk_dplr_attention(q, k, v, a, b[..., :8], g)
  with pytest.raises(ValueError, match="a must have shape"):
    cdp.chunk_dplr_attention(q, k, v, a[..., 0], b, g)
  with pytest.raises(ValueError, match="log_decay"):
    cdp.chunk_dplr_attention(q, k, v, a, b, g[..., :3])
  with pytest.raises(ValueError, match="initial_state"):
    cdp.chunk_dplr_attention(q, k, v, a, b, g, initial_state=jnp.zeros((1, 2, 16, 16)))
  with pytest.raises(ValueError, match="q must be a floating-point"):
    cdp.chunk_dplr_attention(q.astype(jnp.int32), k, v, a, b, g)
  assert cdp.unsupported_arguments(q, v, chunk_size=64, platform="gpu") == {}
  assert "chunk_size" in cdp.unsupported_arguments(q, v, chunk_size=48, platform="gpu")
  # Through the ops: another form or an untileable chunk raises under "pallas" ...
  with pytest.raises(ValueError, match="form"):
    ops.dplr_attention(q, k, v, a, b, g, form="recurrent", implementation="pallas")
  with pytest.raises(ValueError, match="chunk_size"):
    ops.kda(q, k, v, jnp.ones(q.shape[:3]) / 2, g, chunk_size=24, implementation="pallas")
  with pytest.raises(ValueError, match="implementation"):
    ops.rwkv7(q, k, v, g, b, -a, implementation="triton")
  # ... and None on CPU stays XLA.
  assert_close(ops.dplr_attention(q, k, v, a, b, g, form="chunk", chunk_size=24),
               ops.dplr_attention(q, k, v, a, b, g, form="chunk", chunk_size=24,
                                  implementation="xla"), 0, 0)
