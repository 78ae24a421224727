"""The diagonal-decay engine beyond the conformance suite: strong decays, long
sequences in blocks, continuation, memory, float64 gradients, shard_map."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from linear_attention import ops
from tests.helpers import assert_close, keys, rand
from tests.ops import conformance as cf

B, T, H, K, V = 2, 37, 3, 8, 5


@jax.jit
def reference(q, k, v, g=None, s0=None, seg=None):
  """The plain recurrence of the conformance suite, ``(o, final state)``."""
  return cf.ref_decay((q, k, v, g), s0, seg)


def make(decay, t=T, seed=0, strength=1.0, dtype=jnp.float32):
  kq, kk, kv, kg, ks = keys(seed, 5)
  q, k = rand(kq, (B, t, H, K), dtype), rand(kk, (B, t, H, K), dtype)
  v = rand(kv, (B, t, H, V), dtype)
  shape = {"none": None, "scalar": (B, t, H), "vector": (B, t, H, K)}[decay]
  g = None if shape is None else -strength * jax.random.uniform(kg, shape)
  s0 = rand(ks, (B, H, K, V))
  return q, k, v, g, s0


@pytest.mark.parametrize("decay", ["scalar", "vector"])
@pytest.mark.parametrize("chunk_size", [16, 128])
def test_strong_decay_stays_finite(decay, chunk_size):
  """log_decay down to -20 per step: chunk form matches the recurrence, grads finite."""
  q, k, v, g, s0 = make(decay, t=150, strength=20.0)
  want = ops.decay_linear_attention(q, k, v, g, form="recurrent", initial_state=s0)
  got = ops.decay_linear_attention(q, k, v, g, form="chunk", chunk_size=chunk_size,
                                   initial_state=s0)
  assert_close(got, want, 1e-4, 1e-4)
  grads = jax.grad(lambda g: jnp.sum(ops.decay_linear_attention(
      q, k, v, g, chunk_size=chunk_size, initial_state=s0) ** 2))(g)
  assert np.all(np.isfinite(np.asarray(grads)))


@pytest.mark.parametrize("decay", ["scalar", "vector"])
def test_continuation_from_final_state(decay):
  """First half, then the second half from its final state, equals one call."""
  q, k, v, g, s0 = make(decay, t=40)
  full, s_full = ops.decay_linear_attention(q, k, v, g, chunk_size=16, initial_state=s0,
                                            return_state=True)
  a, s_a = ops.decay_linear_attention(q[:, :19], k[:, :19], v[:, :19], g[:, :19], chunk_size=16,
                                      initial_state=s0, return_state=True)
  b, s_b = ops.decay_linear_attention(q[:, 19:], k[:, 19:], v[:, 19:], g[:, 19:], chunk_size=16,
                                      initial_state=s_a, return_state=True)
  assert_close(jnp.concatenate([a, b], axis=1), full)
  assert_close(s_b, s_full)


def test_check_grads_float64():
  """Finite differences in float64 on a tiny problem, chunk form with state."""
  with jax.enable_x64(True):
    kq, kk, kv, kg, ks = keys(3, 5)
    shape = (1, 5, 2, 3)
    q, k, v = (jax.random.normal(x, shape, jnp.float64) for x in (kq, kk, kv))
    g = -jax.random.uniform(kg, shape, jnp.float64)
    s0 = jax.random.normal(ks, (1, 2, 3, 3), jnp.float64)
    f = lambda q, k, v, g, s0: ops.decay_linear_attention(
        q, k, v, g, chunk_size=2, initial_state=s0, return_state=True)
    check_grads(f, (q, k, v, g, s0), order=1, modes=("rev",), atol=1e-5, rtol=1e-5)


def test_chunk_form_is_linear_in_memory():
  """No [T, T] intermediate appears in the chunk form, forward or backward."""
  t = 512
  q, k, v, g, _ = make("vector", t=t)
  jaxpr = jax.make_jaxpr(jax.grad(lambda q: jnp.sum(ops.decay_linear_attention(
      q, k, v, g, chunk_size=32))))(q)
  shapes = [tuple(var.aval.shape) for eqn in jaxpr.jaxpr.eqns for var in eqn.outvars]
  assert not any(sum(d >= t for d in s) >= 2 for s in shapes)


def test_bad_inputs():
  """The engine's own checks; the generic ones run in test_conformance.py."""
  q, k, v, g, s0 = make("scalar")
  f = ops.decay_linear_attention
  with pytest.raises(ValueError, match="k must have shape"):
    f(q, k[:, :5], v)
  with pytest.raises(ValueError, match="share one dtype"):
    f(q, k.astype(jnp.bfloat16), v)
  with pytest.raises(ValueError, match="log_decay must have shape"):
    f(q, k, v, g[:, :, :1])
  with pytest.raises(ValueError, match="chunk_size must be an integer >= 1, got 0"):
    f(q, k, v, g, chunk_size=0)
  with pytest.raises(ValueError, match=r"log_decay must have shape \[2, 3\] \(\[B, H\]\)"):
    ops.decay_linear_attention_step(s0, q[:, 0], k[:, 0], v[:, 0], g[:, 0, :1])


@pytest.mark.parametrize("decay", ["none", "vector"])
def test_long_sequence_runs_in_blocks(decay):
  """T beyond one block of the chunk form's outer scan (16 chunks), with segments
  whose boundaries fall inside and at the edges of blocks."""
  t = 300
  q, k, v, g, s0 = make(decay, t=t, strength=0.3)
  seg = jnp.array([[0] * 128 + [1] * 100 + [2] * 72, [3] * 300])
  want_o, want_s = reference(q, k, v, g, s0, seg)
  o, s = ops.decay_linear_attention(q, k, v, g, chunk_size=8, initial_state=s0,
                                    segment_ids=seg, return_state=True)
  assert_close(o, want_o, 1e-4, 1e-4)
  assert_close(s, want_s, 1e-4, 1e-4)


def test_inside_shard_map_without_initial_state():
  """The zero state carried by the scans varies like the inputs inside shard_map."""
  from jax.sharding import NamedSharding, PartitionSpec as P
  mesh = jax.make_mesh((1,), ("x",))
  put = lambda x: jax.device_put(x, NamedSharding(mesh, P("x")))
  kq, kg = keys(11, 2)
  q, g, beta = rand(kq, (2, 8, 2, 4)), -jax.random.uniform(kg, (2, 8, 2)), jnp.full((2, 8, 2), 0.5)
  cases = [lambda q, g: ops.decay_linear_attention(q, q, q, g, chunk_size=4),
           lambda q, g: ops.decay_linear_attention(q, q, q, g, form="recurrent"),
           lambda q, b: ops.deltanet(q, q, q, b, chunk_size=4)]
  for fn, second in zip(cases, (g, g, beta)):
    sharded = jax.jit(jax.shard_map(fn, mesh=mesh, in_specs=(P("x"), P("x")), out_specs=P("x")))
    assert_close(sharded(put(q), put(second)), fn(q, second))


def test_traced_log_decay_sign_is_checked_with_checkify():
  """Under jit the sign cannot be read: common.log_decay_checks makes it a checkify check."""
  from jax.experimental import checkify
  from linear_attention import common
  q, k, v, g, _ = make("scalar", t=8)

  @jax.jit
  def run(g):
    common.log_decay_checks(g)
    return ops.decay_linear_attention(q, k, v, g, chunk_size=4)

  checked = jax.jit(checkify.checkify(run))
  err, _ = checked(g)
  err.throw()  # a valid gate passes
  err, _ = checked(-g)
  with pytest.raises(checkify.JaxRuntimeError, match="log_decay must be <= 0"):
    err.throw()
