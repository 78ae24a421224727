"""Sliding-window, Longformer and BigBird attention against dense masked softmax.

Each reference is naive softmax attention with the dense ``T x T`` mask built
here from the method's own definition.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linear_attention.ops import sparse
from tests.helpers import assert_close, assert_tree_close, keys, rand

B, H, D, DV = 2, 2, 8, 6
T = 37  # odd: not a multiple of any block or window used here


def qkv(seed, t=T, dtype=jnp.float32, b=B):
  kq, kk, kv = keys(seed, 3)
  return (rand(kq, (b, t, H, D), dtype), rand(kk, (b, t, H, D), dtype),
          rand(kv, (b, t, H, DV), dtype))


def masked_reference(q, k, v, allowed):
  """Dense float32 softmax attention; ``allowed`` ``[B, T, T]`` (query, key)."""
  s = jnp.einsum("bqhd,bkhd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32)) * D**-0.5
  p = jax.nn.softmax(jnp.where(allowed[:, None], s, -jnp.inf), axis=-1)
  return jnp.einsum("bhqk,bkhd->bqhd", p, v.astype(jnp.float32))


def segments(t=T, cut=13):
  """Row 0 packs two sequences (ids 4, 9), row 1 holds one."""
  return jnp.stack([jnp.where(jnp.arange(t) < cut, 4, 9), jnp.zeros(t, jnp.int32)])


def same_segment(seg):
  return seg[:, :, None] == seg[:, None, :]


def window_allowed(t, window, causal):
  i, j = np.arange(t)[:, None], np.arange(t)[None, :]
  return jnp.asarray((j <= i) & (i - j < window) if causal else np.abs(i - j) < window)


def out_and_grads(fn, args):
  """``fn(*args)`` and its gradients for a fixed random cotangent, from one forward pass."""
  out, vjp = jax.vjp(fn, *args)
  cot = jax.random.normal(jax.random.PRNGKey(0), out.shape, jnp.float32).astype(out.dtype)
  return out, vjp(cot)


def check_against(fn, allowed, args, rtol=1e-4, atol=1e-5):
  ref = lambda q, k, v: masked_reference(q, k, v, allowed)
  f32 = [x.astype(jnp.float32) for x in args]
  assert_tree_close(out_and_grads(fn, args), out_and_grads(ref, f32), rtol, atol)


# ---------------------------------------------------------------------------
# Sliding window.


# Causal window 5 with blocks of 8 (packed, steps, bfloat16, jit/vmap) runs in
# test_conformance.py, as do bidirectional Longformer and causal BigBird.
@pytest.mark.parametrize("causal, window, block", [(True, 20, None), (False, 6, 8),
                                                   (False, 1, None)])
def test_sliding_window_matches_dense(causal, window, block):
  q, k, v = qkv(0)
  seg = segments()
  allowed = window_allowed(T, window, causal)[None] & same_segment(seg)
  fn = lambda q, k, v: sparse.sliding_window_attention(
      q, k, v, window=window, causal=causal, segment_ids=seg, block_size=block)
  check_against(fn, allowed, (q, k, v))


def test_sliding_window_wide_equals_full_causal():
  """A window at least T long is plain causal attention."""
  q, k, v = qkv(1)
  allowed = window_allowed(T, T, True)[None]
  o = sparse.sliding_window_attention(q, k, v, window=64, block_size=8)
  assert_close(o, masked_reference(q, k, v, allowed), 1e-5, 1e-5)


def _shapes(jaxpr):
  for eqn in jaxpr.eqns:
    for var in eqn.outvars:
      yield tuple(getattr(var.aval, "shape", ()))
    for p in eqn.params.values():
      for x in (p if isinstance(p, (tuple, list)) else (p,)):
        sub = getattr(x, "jaxpr", x)
        if hasattr(sub, "eqns"):
          yield from _shapes(sub)


def test_sliding_window_gradient_is_banded():
  """No intermediate of the gradient has two axes of length >= T (T >> window)."""
  t = 512
  q, k, v = qkv(3, t, b=1)
  loss = lambda q, k, v: jnp.sum(sparse.sliding_window_attention(q, k, v, window=16) ** 2)
  shapes = list(_shapes(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, k, v).jaxpr))
  assert shapes and not [s for s in shapes if sum(d >= t for d in s) >= 2]


# ---------------------------------------------------------------------------
# Longformer.


def longformer_allowed(glob, window, causal, seg):
  t = glob.shape[1]
  allowed = window_allowed(t, window, causal)[None] | glob[:, :, None] | glob[:, None, :]
  if causal:
    allowed &= jnp.tril(jnp.ones((t, t), bool))
  return allowed & same_segment(seg)


def globals_mask():
  g = np.zeros((B, T), bool)
  g[0, [0, 5, 20, 36]] = True  # two per packed sequence of row 0
  g[1, [3, 30]] = True
  return jnp.asarray(g)


@pytest.mark.parametrize("causal", [True])
def test_longformer_matches_dense(causal):
  q, k, v = qkv(5)
  seg, glob = segments(), globals_mask()
  fn = lambda q, k, v: sparse.longformer_attention(q, k, v, glob, window=4, causal=causal,
                                                   segment_ids=seg, block_size=8)
  check_against(fn, longformer_allowed(glob, 4, causal, seg), (q, k, v))


def test_longformer_jit_budget_and_no_globals():
  q, k, v = qkv(6)
  glob = globals_mask()
  seg = jnp.zeros((B, T), jnp.int32)
  # Under jit max_globals is required; a larger budget than needed changes nothing.
  fn = jax.jit(lambda q, k, v, g: sparse.longformer_attention(q, k, v, g, window=4, max_globals=6,
                                                              block_size=8))
  allowed = longformer_allowed(glob, 4, False, seg)
  assert_close(fn(q, k, v, glob), masked_reference(q, k, v, allowed), 1e-5, 1e-5)
  # No global tokens: plain (symmetric) sliding window.
  none = jnp.zeros((B, T), bool)
  assert_close(sparse.longformer_attention(q, k, v, none, window=4, block_size=8),
               sparse.sliding_window_attention(q, k, v, window=4, causal=False, block_size=8),
               1e-6, 1e-6)
  with pytest.raises(ValueError, match="max_globals must be given"):
    jax.jit(lambda g: sparse.longformer_attention(q, k, v, g, window=4))(glob)
  with pytest.raises(ValueError, match="more than max_globals=2"):
    sparse.longformer_attention(q, k, v, glob, window=4, max_globals=2)


# ---------------------------------------------------------------------------
# BigBird.

BS = 4  # 37 tokens -> 10 blocks, the last one padded


def bigbird_allowed(pattern, t, bs, causal, seg):
  blk = jnp.arange(t) // bs
  allowed = pattern.matrix[blk[:, None], blk[None, :]][None]
  if causal:
    allowed &= jnp.tril(jnp.ones((t, t), bool))
  return allowed & same_segment(seg)


@pytest.mark.parametrize("causal", [False])
def test_bigbird_matches_dense(causal):
  q, k, v = qkv(7)
  seg = segments()
  key = jax.random.PRNGKey(3)
  n = -(-T // BS)
  pattern = sparse.bigbird_pattern(n, key=key, causal=causal)
  fn = lambda q, k, v: sparse.bigbird_attention(q, k, v, block_size=BS, key=key, causal=causal,
                                                segment_ids=seg)
  check_against(fn, bigbird_allowed(pattern, T, BS, causal, seg), (q, k, v))


def test_bigbird_pattern_properties():
  n, w, r, g = 12, 3, 2, 2
  p1 = sparse.bigbird_pattern(n, key=jax.random.PRNGKey(0), num_window_blocks=w,
                              num_random_blocks=r, num_global_blocks=g)
  p1b = sparse.bigbird_pattern(n, key=jax.random.PRNGKey(0), num_window_blocks=w,
                               num_random_blocks=r, num_global_blocks=g)
  p2 = sparse.bigbird_pattern(n, key=jax.random.PRNGKey(1), num_window_blocks=w,
                              num_random_blocks=r, num_global_blocks=g)
  m = np.asarray(p1.matrix)
  np.testing.assert_array_equal(m, np.asarray(p1b.matrix))  # same key, same pattern
  assert not np.array_equal(m, np.asarray(p2.matrix))  # another key, other random blocks
  a = np.arange(n)
  assert m[:g].all() and m[:, :g].all()  # globals see and are seen by all
  for i in range(g, n):
    assert m[i, max(0, i - w // 2):i + w // 2 + 1].all()  # the window
    assert m[i].sum() == min(n, len({*range(max(0, i - 1), min(n, i + 2)), *range(g)}) + r)
  # Random blocks are distinct, outside the window and not global.
  rand_ids = np.asarray(p1.block_ids)[g:, w:w + r]
  for i, row in zip(range(g, n), rand_ids):
    assert len(set(row)) == r and all(c >= g and abs(c - i) > w // 2 for c in row)
  causal = np.asarray(sparse.bigbird_pattern(n, key=jax.random.PRNGKey(0), causal=True).matrix)
  assert not np.triu(causal, 1).any() and causal[a, a].all()


# ---------------------------------------------------------------------------
# Errors.


def test_errors():
  q, k, v = qkv(9, t=16)
  with pytest.raises(ValueError, match="window must be an integer >= 1"):
    sparse.sliding_window_attention(q, k, v, window=0)
  with pytest.raises(ValueError, match="block_size must be an integer >= 1"):
    sparse.sliding_window_attention(q, k, v, window=3, block_size=0)
  with pytest.raises(ValueError, match="segment_ids must have shape"):
    sparse.sliding_window_attention(q, k, v, window=3, segment_ids=jnp.zeros((B, 3), jnp.int32))
  with pytest.raises(ValueError, match=r"global_mask must have shape \[2, 16\]"):
    sparse.longformer_attention(q, k, v, jnp.zeros((B, 15), bool), window=3)
  with pytest.raises(ValueError, match="global_mask must be bool"):
    sparse.longformer_attention(q, k, v, jnp.zeros((B, 16), jnp.int32), window=3)
  with pytest.raises(ValueError, match="window must be"):
    sparse.longformer_attention(q, k, v, jnp.zeros((B, 16), bool), window=-1)
  key = jax.random.PRNGKey(0)
  with pytest.raises(ValueError, match=r"block_size=4 cuts T=16 into 4 blocks.*at least .* = 7.*"
                                       r"block_size <= 2"):
    sparse.bigbird_attention(q, k, v, block_size=4, key=key)
  with pytest.raises(ValueError, match="num_window_blocks must be odd"):
    sparse.bigbird_attention(q, k, v, block_size=1, key=key, num_window_blocks=2)
  with pytest.raises(ValueError, match="num_random_blocks must be an integer >= 0"):
    sparse.bigbird_attention(q, k, v, block_size=1, key=key, num_random_blocks=-1)
  with pytest.raises(ValueError, match="key must be a PRNG key"):
    sparse.bigbird_attention(q, k, v, block_size=1, key=None)
  cache = sparse.init_sliding_window_cache(B, H, 4, D, DV)
  with pytest.raises(ValueError, match=r"cache.keys must have shape \[2, 5, 2, 8\]"):
    sparse.sliding_window_step(cache, q[:, 0], k[:, 0], v[:, 0], window=5)
  with pytest.raises(ValueError, match="q must have rank 3"):
    sparse.sliding_window_step(cache, q, k[:, 0], v[:, 0], window=4)
  with pytest.raises(ValueError, match="cache must be a SlidingWindowCache"):
    sparse.sliding_window_step(None, q[:, 0], k[:, 0], v[:, 0], window=4)
