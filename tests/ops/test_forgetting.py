"""Forgetting Attention (FoX): the op's special cases, long sequences, the cache, the layer.

Forms against the dense reference, gradients, steps, packing, bfloat16, hard
resets and bad inputs run in ``test_conformance.py`` (spec ``forgetting_attention``).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from linear_attention import nn as lnn
from linear_attention import ops
from linear_attention.ops import softmax as sm
from tests.helpers import assert_close, assert_tree_close, keys, rand

B, T, H, D, V = 2, 37, 2, 8, 6
SEG = jnp.array([[0] * 10 + [1] * 20 + [2] * 7, [4] * 37])
ALGORITHMS = ("naive", "blockwise")


def inputs(t=T, seed=0, gate_mean=2.0):
  kq, kk, kv, kg = keys(seed, 4)
  log_f = jax.nn.log_sigmoid(gate_mean + rand(kg, (B, t, H)))
  return rand(kq, (B, t, H, D)), rand(kk, (B, t, H, D)), rand(kv, (B, t, H, V)), log_f


def fox(q, k, v, g, algorithm, **kw):
  return ops.forgetting_attention(q, k, v, g, algorithm=algorithm, block_size=16, **kw)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_gates_of_one_give_causal_softmax_attention(algorithm):
  q, k, v, _ = inputs()
  zero = jnp.zeros((B, T, H))
  want = ops.softmax_attention(q, k, v, causal=True, segment_ids=SEG)
  assert_close(fox(q, k, v, zero, algorithm, segment_ids=SEG), want, 1e-5, 1e-6)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_constant_gate_is_a_linear_distance_bias(algorithm):
  """log f = -c everywhere: the bias is -c (i - j), ALiBi's slope per head."""
  q, k, v, _ = inputs()
  slopes = jnp.asarray([0.1, 0.7])
  g = jnp.broadcast_to(-slopes, (B, T, H))
  i, j = jnp.arange(T)[:, None], jnp.arange(T)[None, :]
  logits = jnp.einsum("bqhd,bkhd->bhqk", q, k) * D**-0.5 - slopes[:, None, None] * (i - j)
  p = jax.nn.softmax(jnp.where(j <= i, logits, -jnp.inf), axis=-1)
  assert_close(fox(q, k, v, g, algorithm), jnp.einsum("bhqk,bkhv->bqhv", p, v), 1e-5, 1e-5)


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_strong_forget_gates_are_finite_and_local(algorithm):
  """Gates near 0 (log f = -60, or -inf) keep each query to itself: o_i = v_i, no NaN."""
  q, k, v, _ = inputs()
  for value in (-60.0, -1e4, -jnp.inf):
    g = jnp.full((B, T, H), value)
    o, grads = jax.value_and_grad(
        lambda q, k, v, g: jnp.sum(jnp.sin(fox(q, k, v, g, algorithm))), argnums=(0, 1, 2, 3))(
            q, k, v, g)
    assert bool(jnp.isfinite(o)), value
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in grads), value
    assert_close(fox(q, k, v, g, algorithm), v, 1e-6, 1e-6, f"log f = {value}")


def test_blockwise_matches_naive_on_a_long_sequence():
  """Several key blocks per query block (T = 300, blocks of 64), gradients of every input."""
  q, k, v, g = inputs(t=300, seed=1, gate_mean=4.0)
  seg = jnp.asarray(np.repeat([[0, 1, 2]], B, 0).repeat([120, 150, 30], axis=1))

  def run(algorithm):
    f = lambda q, k, v, g: ops.forgetting_attention(q, k, v, g, algorithm=algorithm,
                                                    block_size=64, segment_ids=seg)
    w = rand(keys(5, 1)[0], (B, 300, H, V))
    return jax.jit(jax.value_and_grad(lambda *a: jnp.sum(f(*a) * w), argnums=(0, 1, 2, 3)))(
        q, k, v, g)

  (l1, g1), (l2, g2) = run("naive"), run("blockwise")
  assert_close(l2, l1, 1e-5, 1e-4)
  assert_tree_close(g2, g1, 1e-4, 1e-4)


def test_default_algorithm_and_dtype():
  q, k, v, g = inputs()
  o = ops.forgetting_attention(q.astype(jnp.bfloat16), k.astype(jnp.bfloat16),
                               v.astype(jnp.bfloat16), g)
  assert o.dtype == jnp.bfloat16
  assert_close(o, fox(q, k, v, g, "naive"), 5e-2, 5e-2)


def test_decode_with_a_cache_equals_the_sequence():
  q, k, v, g = inputs(t=12)
  cache = ops.init_forgetting_cache(B, H, 16, D, V)
  step = jax.jit(ops.forgetting_attention_step)
  outs = []
  for t in range(12):
    o, cache = step(cache, q[:, t], k[:, t], v[:, t], g[:, t])
    outs.append(o)
  assert_close(jnp.stack(outs, 1), fox(q, k, v, g, "naive"), 1e-5, 1e-5)
  assert int(cache.length) == 12 and cache.log_forget.dtype == jnp.float32
  assert_close(cache.total, jnp.sum(g, axis=1), 1e-5, 1e-5)


def test_step_and_op_reject_bad_arguments():
  q, k, v, g = inputs(t=3)
  full = ops.init_forgetting_cache(B, H, 2, D, V)
  for t in range(2):
    _, full = ops.forgetting_attention_step(full, q[:, t], k[:, t], v[:, t], g[:, t])
  with pytest.raises(ValueError, match=r"cache is full: it holds max_len=2"):
    ops.forgetting_attention_step(full, q[:, 2], k[:, 2], v[:, 2], g[:, 2])
  with pytest.raises(ValueError, match=r"cache must be a ForgettingCache"):
    ops.forgetting_attention_step({"k": 0}, q[:, 0], k[:, 0], v[:, 0], g[:, 0])
  small = ops.init_forgetting_cache(B, H, 4, D + 1, V)
  with pytest.raises(ValueError, match=r"cache.keys must have shape"):
    ops.forgetting_attention_step(small, q[:, 0], k[:, 0], v[:, 0], g[:, 0])
  with pytest.raises(ValueError, match=r"log_fgate must have shape \[2, 3, 2\]"):
    ops.forgetting_attention(q, k, v, g[..., None])
  with pytest.raises(ValueError, match=r"log_fgate must be <= 0"):
    ops.forgetting_attention(q, k, v, -g)
  with pytest.raises(ValueError, match=r"no Pallas kernel.*got 'pallas'"):
    ops.forgetting_attention(q, k, v, g, implementation="pallas")
  with pytest.raises(ValueError, match=r"max_len must be an integer >= 1, got 0"):
    ops.init_forgetting_cache(B, H, 0, D, V)


def test_bias_hook_needs_both_vectors():
  q, k, v, g = inputs(t=8)
  pos = sm.positions(B, 8)
  seg = jnp.zeros((B, 8), jnp.int32)
  mask = sm.BlockMask(8, 8, causal=True)
  with pytest.raises(ValueError, match="q_bias and k_bias go together"):
    sm.flash_attention_stats(q, k, v, pos, pos, seg, seg, mask=mask, scale=0.3, q_bias=g)
  with pytest.raises(ValueError, match=r"k_bias must have shape \[2, 8, 2\]"):
    sm.flash_attention_stats(q, k, v, pos, pos, seg, seg, mask=mask, scale=0.3, q_bias=g,
                             k_bias=g[:, :4])


def test_layer_with_open_gates_is_softmax_attention():
  """fgate bias +40, weights 0: log f ~ -4e-18, so FoX is softmax attention without RoPE."""
  fox_layer = lnn.make_mixer("forgetting", 32, 2, rngs=nnx.Rngs(0))
  softmax = lnn.make_mixer("softmax", 32, 2, rngs=nnx.Rngs(0), use_rope=False)
  fox_layer.fgate_proj.kernel[...] = jnp.zeros_like(fox_layer.fgate_proj.kernel[...])
  fox_layer.fgate_proj.bias[...] = jnp.full((2,), 40.0)
  x = rand(keys(3, 1)[0], (2, 13, 32))
  assert_close(fox_layer(x), softmax(x), 1e-5, 1e-5)


def test_layer_cache_holds_the_cumulative_log_forget():
  layer = lnn.make_mixer("forgetting", 32, 2, rngs=nnx.Rngs(0))
  cache = layer.init_cache(2, 5, jnp.bfloat16)
  assert cache["log_forget"].shape == (2, 5, 2) and cache["log_forget"].dtype == jnp.float32
  assert cache["total"].shape == (2, 2) and cache["k"].dtype == jnp.bfloat16
  x = rand(keys(4, 1)[0], (2, 32))
  _, cache = layer.decode_step(x, cache)
  log_f = jax.nn.log_sigmoid(layer.fgate_proj(x))
  assert_close(cache["total"], log_f, 1e-6, 1e-6)
  assert_close(cache["log_forget"][:, 0], log_f, 1e-6, 1e-6)
  with pytest.raises(ValueError, match="algorithm must be one of"):
    lnn.make_mixer("forgetting", 32, 2, rngs=nnx.Rngs(0), algorithm="fast")
