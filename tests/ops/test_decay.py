"""The diagonal-decay engine: every form against a plain loop and each other."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from linear_attention import ops
from tests.helpers import BF16_ATOL, BF16_RTOL, assert_close, assert_tree_close, grads_of, keys, rand

B, T, H, K, V = 2, 37, 3, 8, 5
FORMS = ("parallel", "chunk", "recurrent")
SEG = jnp.array([[0] * 10 + [1] * 20 + [2] * 7, [4] * 37])


@functools.partial(jax.jit, static_argnames="scale")
def reference(q, k, v, g=None, s0=None, seg=None, scale=None):
  """The recurrence written plainly, token by token (a lax.scan over t)."""
  scale = q.shape[-1] ** -0.5 if scale is None else scale
  q, k, v = (x.astype(jnp.float32) for x in (q, k, v))
  b, t = q.shape[:2]
  s = jnp.zeros((b, q.shape[2], q.shape[3], v.shape[3])) if s0 is None else s0
  g = jnp.zeros((b, t, q.shape[2])) if g is None else g.astype(jnp.float32)
  seg = jnp.zeros((b, t), jnp.int32) if seg is None else seg
  new = jnp.concatenate([jnp.zeros((b, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)

  def step(s, x):
    q_t, k_t, v_t, g_t, new_t = x
    s = jnp.where(new_t[:, None, None, None], 0.0, s)
    a = jnp.exp(g_t)
    s = s * (a[..., None, None] if a.ndim == 2 else a[..., None])
    s = s + k_t[..., :, None] * v_t[..., None, :]
    return s, scale * jnp.einsum("bhk,bhkv->bhv", q_t, s)

  xs = tuple(jnp.swapaxes(x, 0, 1) for x in (q, k, v, g, new))
  s, o = jax.lax.scan(step, s, xs)
  return jnp.swapaxes(o, 0, 1), s


def make(decay, t=T, seed=0, strength=1.0, dtype=jnp.float32):
  kq, kk, kv, kg, ks = keys(seed, 5)
  q, k = rand(kq, (B, t, H, K), dtype), rand(kk, (B, t, H, K), dtype)
  v = rand(kv, (B, t, H, V), dtype)
  shape = {"none": None, "scalar": (B, t, H), "vector": (B, t, H, K)}[decay]
  g = None if shape is None else -strength * jax.random.uniform(kg, shape)
  s0 = rand(ks, (B, H, K, V))
  return q, k, v, g, s0


@pytest.mark.parametrize("decay", ["none", "scalar", "vector"])
@pytest.mark.parametrize("form", FORMS)
def test_forms_match_reference(decay, form):
  q, k, v, g, s0 = make(decay)
  want_o, want_s = reference(q, k, v, g, s0, SEG)
  o, s = ops.decay_linear_attention(q, k, v, g, form=form, chunk_size=16, initial_state=s0,
                                    return_state=True, segment_ids=SEG)
  assert o.shape == (B, T, H, V) and s.shape == (B, H, K, V) and s.dtype == jnp.float32
  assert_close(o, want_o, 1e-4, 1e-4)
  assert_close(s, want_s, 1e-4, 1e-4)


@pytest.mark.parametrize("decay", ["none", "scalar", "vector"])
def test_gradients_match_reference(decay):
  """Gradients of q, k, v, the decay and the initial state, for every form."""
  q, k, v, g, s0 = make(decay)
  args = (q, k, v, s0) if g is None else (q, k, v, s0, g)
  argnums = tuple(range(len(args)))

  def wrap(fn):
    def f(q, k, v, s0, g=None):
      return fn(q, k, v, g, s0)
    return f

  want = grads_of(wrap(lambda q, k, v, g, s0: reference(q, k, v, g, s0, SEG)), args, argnums)
  for form in FORMS:
    got = grads_of(wrap(lambda q, k, v, g, s0: ops.decay_linear_attention(
        q, k, v, g, form=form, chunk_size=16, initial_state=s0, return_state=True,
        segment_ids=SEG)), args, argnums)
    assert_tree_close(got, want, 1e-3, 1e-3)


@pytest.mark.parametrize("decay", ["scalar", "vector"])
@pytest.mark.parametrize("chunk_size", [16, 64, 128])
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


@pytest.mark.parametrize("t", [1, 2, 17])
def test_odd_lengths(t):
  q, k, v, g, s0 = make("vector", t=t)
  want_o, want_s = reference(q, k, v, g, s0)
  for form in FORMS:
    o, s = ops.decay_linear_attention(q, k, v, g, form=form, chunk_size=16, initial_state=s0,
                                      return_state=True)
    assert_close(o, want_o)
    assert_close(s, want_s)


@pytest.mark.parametrize("form", FORMS)
def test_packed_equals_separate_calls(form):
  q, k, v, g, _ = make("vector")
  seg = jnp.array([[0] * 10 + [1] * 27] * B)
  o = ops.decay_linear_attention(q, k, v, g, form=form, chunk_size=8, segment_ids=seg)
  for lo, hi in ((0, 10), (10, 37)):
    part = ops.decay_linear_attention(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], g[:, lo:hi],
                                      form=form, chunk_size=8)
    assert_close(o[:, lo:hi], part)


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


@pytest.mark.parametrize("decay", ["none", "scalar", "vector"])
def test_step_decoding_matches_recurrent(decay):
  q, k, v, g, s0 = make(decay, t=9)
  want_o, want_s = ops.decay_linear_attention(q, k, v, g, form="chunk", chunk_size=4,
                                              initial_state=s0, return_state=True)
  s, outs = s0, []
  for t in range(9):
    o_t, s = ops.decay_linear_attention_step(q[:, t], k[:, t], v[:, t], s,
                                             None if g is None else g[:, t])
    outs.append(o_t)
  assert_close(jnp.stack(outs, 1), want_o)
  assert_close(s, want_s)


@pytest.mark.parametrize("decay", ["scalar", "vector"])
def test_bfloat16_inputs(decay):
  """bf16 inputs, float32 state: outputs within BF16 tolerances of the float32 reference."""
  q, k, v, g, s0 = make(decay, dtype=jnp.bfloat16)
  want, _ = reference(q, k, v, g, s0, SEG)
  for form in FORMS:
    o, s = ops.decay_linear_attention(q, k, v, g, form=form, chunk_size=16, initial_state=s0,
                                      segment_ids=SEG, return_state=True)
    assert o.dtype == jnp.bfloat16 and s.dtype == jnp.float32
    assert_close(o, want, BF16_RTOL, BF16_ATOL)


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


def test_jit_vmap_grad():
  q, k, v, g, _ = make("scalar")
  f = jax.jit(lambda q, k, v, g: ops.decay_linear_attention(q, k, v, g, chunk_size=16))
  assert_close(f(q, k, v, g), ops.decay_linear_attention(q, k, v, g, chunk_size=16))
  # vmap over an extra leading axis equals a loop over it.
  stack = lambda x: jnp.stack([x, 2 * x])
  vm = jax.vmap(lambda q, k, v, g: ops.decay_linear_attention(q, k, v, g, chunk_size=16))(
      stack(q), stack(k), stack(v), stack(g) / 2)
  assert_close(vm[1], ops.decay_linear_attention(2 * q, 2 * k, 2 * v, g, chunk_size=16))
  grad = jax.jit(jax.grad(lambda q: jnp.sum(f(q, k, v, g))))(q)
  assert grad.shape == q.shape and np.all(np.isfinite(np.asarray(grad)))


def test_chunk_form_is_linear_in_memory():
  """No [T, T] intermediate appears in the chunk form, forward or backward."""
  t = 512
  q, k, v, g, _ = make("vector", t=t)
  jaxpr = jax.make_jaxpr(jax.grad(lambda q: jnp.sum(ops.decay_linear_attention(
      q, k, v, g, chunk_size=32))))(q)
  shapes = [tuple(var.aval.shape) for eqn in jaxpr.jaxpr.eqns for var in eqn.outvars]
  assert not any(sum(d >= t for d in s) >= 2 for s in shapes)


def test_bad_inputs():
  q, k, v, g, s0 = make("scalar")
  f = ops.decay_linear_attention
  with pytest.raises(ValueError, match="k must have shape"):
    f(q, k[:, :5], v)
  with pytest.raises(ValueError, match="q must have rank 4"):
    f(q[0], k, v)
  with pytest.raises(ValueError, match="share one dtype"):
    f(q, k.astype(jnp.bfloat16), v)
  with pytest.raises(ValueError, match="log_decay must have shape"):
    f(q, k, v, g[:, :, :1])
  with pytest.raises(ValueError, match="log_decay must be <= 0"):
    f(q, k, v, -g)
  with pytest.raises(ValueError, match=r"form must be one of \['parallel', 'chunk', 'recurrent'\]"):
    f(q, k, v, g, form="fast")
  with pytest.raises(ValueError, match="chunk_size must be an integer >= 1, got 0"):
    f(q, k, v, g, chunk_size=0)
  with pytest.raises(ValueError, match="segment_ids must have shape"):
    f(q, k, v, g, segment_ids=SEG[:, :5])
  with pytest.raises(ValueError, match="initial_state must have shape"):
    f(q, k, v, g, initial_state=s0[..., :2])
  with pytest.raises(ValueError, match="state must have shape"):
    ops.decay_linear_attention_step(q[:, 0], k[:, 0], v[:, 0], s0[:, :1])


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
