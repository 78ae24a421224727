"""Exact softmax attention: naive vs a plain reference, blockwise vs naive."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linear_attention.ops import softmax as sm
from linear_attention.ops.softmax import softmax_attention
from tests.helpers import assert_close, assert_tree_close, keys, rand

B, H, D, DV = 2, 2, 8, 6
BLOCK = 16
T = 37  # odd, not a multiple of BLOCK: most tests share it (and its compiled code)


def qkv(seed, t, dtype=jnp.float32, b=B):
  kq, kk, kv = keys(seed, 3)
  return (rand(kq, (b, t, H, D), dtype), rand(kk, (b, t, H, D), dtype),
          rand(kv, (b, t, H, DV), dtype))


def reference(q, k, v, causal=False, segment_ids=None, scale=None):
  """Plain float32 softmax attention with a dense mask."""
  t = q.shape[1]
  scale = D**-0.5 if scale is None else scale
  s = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32)) * scale
  mask = jnp.ones((q.shape[0], 1, t, t), bool)
  if causal:
    mask &= jnp.tril(jnp.ones((t, t), bool))
  if segment_ids is not None:
    mask &= (segment_ids[:, None, :, None] == segment_ids[:, None, None, :])
  p = jax.nn.softmax(jnp.where(mask, s, -jnp.inf), axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", p, v.astype(jnp.float32))


def two_segments(t, cut):
  return jnp.stack([jnp.where(jnp.arange(t) < cut, 3, 7), jnp.where(jnp.arange(t) < t - cut, 0, 1)])


def out_and_grads(fn, args):
  """``fn(*args)`` and the ``grads_of`` gradients from one forward pass (one compile)."""
  out, vjp = jax.vjp(fn, *args)
  ks = jax.random.split(jax.random.PRNGKey(0), len(jax.tree_util.tree_leaves(out)))
  cot = jax.tree_util.tree_unflatten(
      jax.tree_util.tree_structure(out),
      [jax.random.normal(kk, l.shape, jnp.float32).astype(l.dtype)
       for l, kk in zip(jax.tree_util.tree_leaves(out), ks)])
  return out, vjp(cot)


naive = functools.partial(softmax_attention, algorithm="naive")
blockwise = functools.partial(softmax_attention, algorithm="blockwise", block_size=BLOCK)


# Causal attention (both algorithms, packed, bfloat16, jit/vmap/grad) runs in
# test_conformance.py; bidirectional attention and the shared machinery here.
@pytest.mark.parametrize("causal", [False])
@pytest.mark.parametrize("segmented", [False, True])
def test_naive_matches_reference(causal, segmented):
  t = T
  q, k, v = qkv(0, t)
  seg = two_segments(t, 12) if segmented else None
  assert_close(naive(q, k, v, causal=causal, segment_ids=seg),
               reference(q, k, v, causal, seg), 1e-5, 1e-5)


def test_explicit_scale():
  q, k, v = qkv(1, T)
  assert_close(naive(q, k, v, scale=0.3), reference(q, k, v, scale=0.3), 1e-5, 1e-5)
  assert_close(blockwise(q, k, v, scale=0.3), reference(q, k, v, scale=0.3), 1e-5, 1e-5)


@pytest.mark.parametrize("causal", [False])
@pytest.mark.parametrize("t", [1, T])
def test_blockwise_matches_naive(causal, t):
  q, k, v = qkv(2, t)
  seg = two_segments(t, 12) if t > 1 else None
  fn = lambda impl: lambda q, k, v: impl(q, k, v, causal=causal, segment_ids=seg)
  assert_tree_close(out_and_grads(fn(blockwise), (q, k, v)), out_and_grads(fn(naive), (q, k, v)),
                    1e-4, 1e-5)


def test_block_multiple_of_length():
  """T an exact multiple of the block (no padding), and a block larger than T."""
  q, k, v = qkv(2, 32)
  for bs in (16,):
    assert_close(softmax_attention(q, k, v, causal=True, algorithm="blockwise", block_size=bs),
                 naive(q, k, v, causal=True), 1e-5, 1e-5)


@pytest.mark.parametrize("causal", [False])
def test_packed_equals_separate(causal):
  cut = 16
  q, k, v = qkv(3, T, b=1)
  seg = jnp.where(jnp.arange(T) < cut, 0, 1)[None]
  packed = lambda q, k, v: blockwise(q, k, v, causal=causal, segment_ids=seg)
  sep = lambda q, k, v: jnp.concatenate(
      [blockwise(q[:, :cut], k[:, :cut], v[:, :cut], causal=causal),
       blockwise(q[:, cut:], k[:, cut:], v[:, cut:], causal=causal)], axis=1)
  assert_tree_close(out_and_grads(packed, (q, k, v)), out_and_grads(sep, (q, k, v)), 1e-4, 1e-5)


def test_auto_picks_by_length():
  q, k, v = qkv(5, T)
  assert_close(softmax_attention(q, k, v, causal=True), naive(q, k, v, causal=True), 1e-6, 1e-6)


def test_lse_cotangent():
  """The log-sum-exp output of the shared machinery has a correct gradient."""
  t = T
  q, k, v = qkv(7, t)
  seg = two_segments(t, 12)
  pos = jnp.broadcast_to(jnp.arange(t), (B, t))
  mask = sm.BlockMask(BLOCK, BLOCK, causal=True, window=9)

  def blocked(q, k, v):
    o, lse = sm.flash_attention_stats(q, k, v, pos, pos, seg, seg, mask=mask, scale=0.5)
    return o, lse

  def dense(q, k, v):
    vis = mask.visible(pos, pos) & (seg[:, :, None] == seg[:, None, :])
    return sm.dense_attention_stats(q, k, v, vis, 0.5)

  assert_tree_close(out_and_grads(blocked, (q, k, v)), out_and_grads(dense, (q, k, v)), 1e-4, 1e-5)


def _all_shapes(jaxpr):
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      yield tuple(getattr(var.aval, "shape", ()))
    for sub in _params_jaxprs(eqn):
      yield from _all_shapes(sub)


def _params_jaxprs(eqn):
  for p in eqn.params.values():
    for x in (p if isinstance(p, (tuple, list)) else (p,)):
      if hasattr(x, "jaxpr") and hasattr(x.jaxpr, "eqns"):
        yield x.jaxpr
      elif hasattr(x, "eqns"):
        yield x


@pytest.mark.parametrize("causal", [False, True])
def test_blockwise_never_builds_txt(causal):
  t = 512
  q, k, v = qkv(8, t, b=1)
  loss = lambda q, k, v: jnp.sum(softmax_attention(
      q, k, v, causal=causal, algorithm="blockwise", block_size=32) ** 2)
  jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v).jaxpr
  shapes = list(_all_shapes(jaxpr))
  assert shapes, "no equations found"
  big = [s for s in shapes if sum(d >= t for d in s) >= 2]
  assert not big, f"T x T intermediates found: {big[:5]}"
  # The naive path does build one: the check can see it.
  naive_jaxpr = jax.make_jaxpr(jax.grad(
      lambda q, k, v: jnp.sum(naive(q, k, v, causal=causal) ** 2), argnums=(0, 1, 2)))(q, k, v)
  assert any(sum(d >= t for d in s) >= 2 for s in _all_shapes(naive_jaxpr.jaxpr))


@pytest.mark.parametrize("causal", [False, True])
def test_naive_large_logits_stay_finite(causal):
  """Logits near 1e12: the max subtraction and the exp must see one rounding of
  the logits (NaN before: the scale was folded differently into each)."""
  q, k, v = qkv(11, 16)
  o = naive(q * 1e6, k * 1e6, v, causal=causal)
  assert np.all(np.isfinite(np.asarray(o)))
  # Such logits make the softmax a one-hot argmax of each row.
  s = jnp.einsum("bqhd,bkhd->bhqk", q, k)
  if causal:
    s = jnp.where(jnp.tril(jnp.ones((16, 16), bool)), s, -jnp.inf)
  onehot = jax.nn.one_hot(jnp.argmax(s, -1), 16)
  assert_close(o, jnp.einsum("bhqk,bkhd->bqhd", onehot, v), 1e-5, 1e-5)


def test_no_nan_with_fully_padded_rows():
  """A padded tail (T not a block multiple) and masked rows give finite values."""
  q, k, v = qkv(9, T)
  o = blockwise(q * 100, k * 100, v, causal=True)
  assert np.all(np.isfinite(np.asarray(o)))
  assert_close(o, naive(q * 100, k * 100, v, causal=True), 1e-4, 1e-4)


def test_errors():
  q, k, v = qkv(10, 8)
  with pytest.raises(ValueError, match="k must have shape"):
    softmax_attention(q, k[:, :5], v)
  with pytest.raises(ValueError, match="v must have shape"):
    softmax_attention(q, k, v[:, :5])
  with pytest.raises(ValueError, match="dtype"):
    softmax_attention(q, k.astype(jnp.bfloat16), v)
  with pytest.raises(ValueError, match=r"implementation must be one of \[None, 'xla', 'pallas'\]"):
    softmax_attention(q, k, v, implementation="flash")
  with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
    softmax_attention(q, k, v, block_size=0)
  with pytest.raises(ValueError, match="segment_ids must be integers"):
    softmax_attention(q, k, v, segment_ids=jnp.zeros((B, 8), jnp.float32))
