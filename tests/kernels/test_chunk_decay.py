"""The chunk-decay Pallas kernel against the ops/ XLA twin, in interpret mode on CPU.

One test class, parametrised over the kernel paths: the GPU (Triton) kernel
with ``interpret=True`` and the TPU (Mosaic) kernel with
``interpret=pltpu.InterpretParams()``; natively when that hardware is present.
Shapes are tiny (interpret mode runs every kernel op eagerly) but exercise a
partial last chunk, off-diagonal sub-chunks, two value blocks, several heads,
a non-zero initial state and strong decays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.experimental.pallas import tpu as pltpu

from linear_attention import ops
from linear_attention.engines.decay import pallas as cd
from linear_attention.engines import dispatch
from tests.helpers import BF16_ATOL, BF16_RTOL, assert_close, keys, rand

B, T, H, K, V = 1, 40, 2, 16, 32  # T: one full chunk of 32 and a partial one

PATHS = {
    # Sub-chunks of 16 in a chunk of 32: the off-diagonal sub-chunk path runs.
    "gpu": dict(platform="gpu", block_sizes=cd.ChunkDecayBlockSizes(chunk=32, sub_chunk=16, block_v=16)),
    # The GPU default's splits: dk and dv in two reverse sweeps, and the stored
    # states (and dq) every state_chunk steps, here 16 against sweeps of 32.
    "gpu_split": dict(platform="gpu", block_sizes=cd.ChunkDecayBlockSizes(
        chunk=32, sub_chunk=16, block_v=16, state_chunk=16, split_dkv=True)),
    "tpu": dict(platform="tpu", block_sizes=cd.ChunkDecayBlockSizes(
        chunk=16, sub_chunk=8, block_v=16, state_chunk=24)),
}


def _interpret(platform):
  if jax.default_backend() == platform:
    return False
  return pltpu.InterpretParams() if platform == "tpu" else True


def make(decay, strength=3.0, dtype=jnp.float32, seed=0):
  kq, kk, kv, kg, ks = keys(seed, 5)
  q, k, v = rand(kq, (B, T, H, K), dtype), rand(kk, (B, T, H, K), dtype), rand(kv, (B, T, H, V), dtype)
  shape = {"none": None, "scalar": (B, T, H), "vector": (B, T, H, K)}[decay]
  g = None if shape is None else -strength * jax.random.uniform(kg, shape)
  return q, k, v, g, rand(ks, (B, H, K, V))


@pytest.fixture(params=sorted(PATHS))
def path(request):
  p = dict(PATHS[request.param])
  return dict(p, interpret=_interpret(p["platform"]))


class TestChunkDecayKernel:

  @pytest.mark.parametrize("decay", ["none", "scalar", "vector"])
  def test_forward_and_vjp_match_xla(self, path, decay):
    q, k, v, g, s0 = make(decay)
    kernel = lambda q, k, v, g, s0: cd.chunk_decay_attention(
        q, k, v, g, initial_state=s0, return_state=True, **path)
    xla = lambda q, k, v, g, s0: ops.decay_linear_attention(
        q, k, v, g, initial_state=s0, return_state=True, form="chunk", chunk_size=16,
        implementation="xla")
    out, vjp = jax.vjp(kernel, q, k, v, g, s0)
    ref, vjp_ref = jax.vjp(xla, q, k, v, g, s0)
    assert_close(out[0], ref[0], 1e-4, 1e-4, "o")
    assert_close(out[1], ref[1], 1e-4, 1e-4, "state")
    cts = (rand(keys(7, 1)[0], out[0].shape), rand(keys(8, 1)[0], out[1].shape))
    for name, a, e in zip(("q", "k", "v", "log_decay", "initial_state"), vjp(cts), vjp_ref(cts)):
      if e is None:
        assert a is None
        continue
      scale = float(np.max(np.abs(np.asarray(e)))) + 1.0
      assert_close(a / scale, e / scale, 1e-4, 1e-4, name)

  def test_strong_vector_decay_stays_finite(self, path):
    # log decay down to -20 per step: exp(+large) would overflow to inf/NaN.
    q, k, v, g, s0 = make("vector", strength=20.0)
    out = cd.chunk_decay_attention(q, k, v, g, initial_state=s0, return_state=True, **path)
    ref = ops.decay_linear_attention(q, k, v, g, initial_state=s0, return_state=True,
                                     form="recurrent")
    assert_close(out[0], ref[0], 1e-4, 1e-4)
    grads = jax.grad(lambda g: jnp.sum(cd.chunk_decay_attention(q, k, v, g, **path) ** 2))(g)
    assert np.all(np.isfinite(np.asarray(grads)))

  def test_minus_infinity_is_a_hard_reset(self, path):
    # log decay -inf (exp = 0) wipes the state: finite, and equal to the recurrence.
    q, k, v, g, s0 = make("vector")
    g = g.at[:, 5].set(-jnp.inf).at[:, 33, 1].set(-jnp.inf)
    out = cd.chunk_decay_attention(q, k, v, g, initial_state=s0, return_state=True, **path)
    ref = ops.decay_linear_attention(q, k, v, g, initial_state=s0, return_state=True,
                                     form="recurrent")
    assert_close(out[0], ref[0], 1e-4, 1e-4, "o")
    assert_close(out[1], ref[1], 1e-4, 1e-4, "state")

  def test_bfloat16_inputs(self, path):
    # bfloat16 dot operands with float32 accumulation and state: within the
    # shared bf16 tolerance of the float32 reference.
    q, k, v, g, s0 = make("scalar", dtype=jnp.bfloat16)
    o, s = cd.chunk_decay_attention(q, k, v, g, initial_state=s0, return_state=True, **path)
    assert o.dtype == jnp.bfloat16 and s.dtype == jnp.float32
    f32 = lambda x: x.astype(jnp.float32)
    ref_o, ref_s = ops.decay_linear_attention(f32(q), f32(k), f32(v), g, initial_state=s0,
                                              return_state=True, form="recurrent")
    assert_close(o, ref_o, BF16_RTOL, BF16_ATOL)
    assert_close(s, ref_s, BF16_RTOL, BF16_ATOL)

  def test_bfloat16_gradients(self, path):
    # The log decay's gradient comes from dq and dk (q dq - k dk, cumulated over
    # the sequence), which carry bfloat16 dot rounding: every gradient within
    # 1% of its largest float32 reference value (measured: 0.30-0.49% on all three paths).
    q, k, v, g, s0 = make("vector", dtype=jnp.bfloat16)
    f32 = lambda x: x.astype(jnp.float32)
    out, vjp = jax.vjp(lambda q, k, v, g, s0: cd.chunk_decay_attention(
        q, k, v, g, initial_state=s0, return_state=True, **path), q, k, v, g, s0)
    ref, vjp_ref = jax.vjp(lambda q, k, v, g, s0: ops.decay_linear_attention(
        q, k, v, g, initial_state=s0, return_state=True, form="recurrent"),
        f32(q), f32(k), f32(v), g, s0)
    cts = (rand(keys(7, 1)[0], ref[0].shape), rand(keys(8, 1)[0], ref[1].shape))
    grads = vjp((cts[0].astype(jnp.bfloat16), cts[1]))
    for name, a, e in zip(("q", "k", "v", "log_decay", "initial_state"), grads, vjp_ref(cts)):
      err = float(jnp.max(jnp.abs(f32(a) - e)) / jnp.max(jnp.abs(e)))
      assert err < 1e-2, f"{name}: {err}"


def test_dispatch_and_unsupported_arguments():
  q, k, v, g, s0 = make("vector")
  seg = jnp.zeros((B, T), jnp.int32)
  # The ops through the kernel ("pallas" refusing segment_ids included):
  # tests/ops/test_conformance.py::test_kernel_matches_reference_and_xla.
  with pytest.raises(ValueError, match="form"):
    ops.decay_linear_attention(q, k, v, g, form="recurrent", implementation="pallas")
  with pytest.raises(ValueError, match="implementation"):
    ops.decay_linear_attention(q, k, v, g, implementation="triton")
  with pytest.raises(ValueError, match="block_sizes.chunk"):
    cd.chunk_decay_attention(q, k, v, g, platform="gpu", block_sizes=cd.ChunkDecayBlockSizes(chunk=24, sub_chunk=8))
  with pytest.raises(ValueError, match="sub_chunk"):
    cd.ChunkDecayBlockSizes(chunk=32, sub_chunk=12)
  # None with segment_ids falls back to XLA (on any backend) and works.
  o = ops.decay_linear_attention(q, k, v, g, segment_ids=seg, implementation=None)
  assert_close(o, ops.decay_linear_attention(q, k, v, g, form="recurrent"), 1e-4, 1e-4)


@pytest.mark.parametrize("backend", ["cpu", "gpu", "tpu"])
def test_default_is_xla_until_a_kernel_is_verified(monkeypatch, backend):
  """implementation=None never picks an unverified kernel, whatever the backend."""
  from linear_attention.ops import softmax as sm
  monkeypatch.setattr(jax, "default_backend", lambda: backend)
  assert dispatch.PALLAS_DEFAULT_BACKENDS == ()
  assert dispatch.resolve_implementation(None, {}) is False
  x = jnp.zeros((1, 4, 1, 8), jnp.float32)
  assert sm.resolve_implementation(None, x, x, x) == "xla"
  monkeypatch.setattr(dispatch, "PALLAS_DEFAULT_BACKENDS", ("gpu", "tpu"))
  expected = backend != "cpu"
  assert dispatch.resolve_implementation(None, {}) is expected
  assert sm.resolve_implementation(None, x, x, x) == ("pallas" if expected else "xla")


def test_platform_follows_the_compile_device():
  """A default device (e.g. a compile-only one) decides the platform and interpret mode."""
  assert dispatch.current_platform() is None  # this CPU host
  assert dispatch.default_interpret("gpu") is True
  with jax.default_device(jax.devices("cpu")[0]):
    assert dispatch.default_platform() == "gpu"
  with pytest.raises(ValueError, match="interpret must be None, a bool"):
    cd.chunk_decay_attention(*make("none")[:3], interpret="yes")
