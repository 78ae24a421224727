"""Sparse softmax attention: sliding window, Longformer and BigBird.

All three are exact softmax attention restricted to a pattern, and none of
them builds the ``T x T`` matrix: they visit only the key blocks the pattern
allows, through the shared machinery of ``engines/softmax/engine.py``.

Patterns (query position ``i``, key position ``j``, always within one segment):

* sliding window, causal: ``i - window < j <= i`` (``window`` keys including
  ``i`` itself); not causal: ``|i - j| < window`` (``2 * window - 1`` keys).
* Longformer: the sliding window, plus every pair where ``i`` or ``j`` is a
  global token (and ``j <= i`` if causal).
* BigBird: blocks of ``block_size`` tokens; query block ``a`` sees key block
  ``c`` when ``c`` is in its window (``|a - c| <= num_window_blocks // 2``), is
  one of its random blocks, or is global (``c < num_global_blocks``); global
  query blocks (``a < num_global_blocks``) see every block. See
  :func:`bigbird_pattern`.

Costs: sliding window ``O(T * window)`` time and memory, forward and backward
(blockwise online softmax over a band of key blocks, FlashAttention-2 style
backward). Longformer ``O(T * (window + max_globals))``. BigBird
``O(T * block_size * (w + r + g))`` (the selected key blocks are gathered per
query block and attended with one softmax; autodiff stores only those).

Context parallelism (``context=``, the sequence split over a mesh axis): the
sliding window only. Each device receives the ``window - 1`` keys, values and
segment ids before its slice from the previous device (and, not causal, those
after it from the next one), one ``ppermute`` each, and attends over its slice
with that halo around it: the same ``O(T * window)`` per device, nothing
gathered. The window must fit in one device's slice. Longformer's global
tokens and BigBird's random and global blocks reach across the whole sequence
and take no context.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from linear_attention import common
from linear_attention.ops import conv
from linear_attention.ops import softmax as sm
from linear_attention.engines.context import SeqContext, axis_index, check_context

Array = jax.Array

_MAX_DEFAULT_BLOCK = 128
_MIN_DEFAULT_BLOCK = 16


def _window_block(window: int, block_size: int | None) -> int:
  """Default block: about the window (so a band is 2-3 blocks), within [16, 128]."""
  if block_size is not None:
    common.check_positive_int("block_size", block_size)
    return block_size
  p = 1 << max(0, (window - 1).bit_length())
  return int(min(_MAX_DEFAULT_BLOCK, max(_MIN_DEFAULT_BLOCK, p)))


def window_visible(q_pos: Array, k_pos: Array, window: int, causal: bool) -> Array:
  """The sliding-window pattern: bool, the broadcast shape of ``q_pos - k_pos``."""
  d = q_pos - k_pos
  if causal:
    return (d >= 0) & (d < window)
  return jnp.abs(d) < window


# ---------------------------------------------------------------------------
# Sliding window.


def sliding_window_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    window: int,
    causal: bool = True,
    scale: float | None = None,
    segment_ids: Array | None = None,
    block_size: int | None = None,
    implementation: str | None = None,
    context: SeqContext | None = None,
) -> Array:
  """Softmax attention restricted to a sliding window of keys.

  Causal: query ``i`` sees keys ``i - window + 1 .. i`` (``window`` keys,
  itself included). Not causal: keys with ``|i - j| < window``. Both within
  the query's segment. Time and memory ``O(T * window)``, gradient included.

  Args:
    q: ``[B, T, H, K]``; k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    window: int >= 1, the window length defined above.
    causal: see above.
    scale: logit scale; ``None`` means ``K ** -0.5``.
    segment_ids: optional ``[B, T]`` ints (packed sequences).
    block_size: query/key block length; ``None`` picks the power of two at
      least ``window``, clipped to ``[16, 128]``. Each query block visits
      ``ceil((window - 1) / block_size) + 1`` key blocks (twice that minus one
      if not causal).
    implementation: ``"xla"`` (the blockwise path above), ``"pallas"`` (the
      FlashAttention-2 kernel, GPU or TPU only; it skips key blocks outside
      the band too; ``block_size`` does not apply) or ``None``: ``"pallas"``
      where it runs, else ``"xla"``.
    context: optional :class:`~linear_attention.ops.context.SeqContext`: the
      sequence split over its mesh axis, each device holding at least
      ``window - 1`` tokens; a halo from the neighbouring devices (module
      docstring).

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> o = ops.sliding_window_attention(q, k, v, window=8)  # a window as long as the sequence
    >>> o.shape
    (1, 8, 2, 4)
    >>> bool(jnp.allclose(o, ops.softmax_attention(q, k, v, causal=True), atol=1e-5))
    True
  """
  _, _, _, dk, _ = common.check_attention(q, k, v, segment_ids)
  common.check_positive_int("window", window)
  if implementation is not None:
    common.check_choice("implementation", implementation, ("xla", "pallas"))
  check_context(context)
  if context is not None and window > 1:
    return _context_window(q, k, v, segment_ids, context=context, window=window,
                           causal=causal, scale=scale, block_size=block_size,
                           implementation=implementation)
  block = _window_block(window, block_size)
  scale = common.resolve_scale(scale, dk)
  if sm.resolve_implementation(implementation, q, k, v) == "pallas":
    return sm.pallas_attention(q, k, v, causal=bool(causal), scale=scale,
                               segment_ids=segment_ids, window=window)
  o, _ = sm.self_attention_stats(q, k, v, segment_ids, scale=scale, block_size=block,
                                 causal=causal, window=window)
  return o.astype(q.dtype)


def _context_window(q, k, v, segment_ids, *, context, window, causal, scale, block_size,
                    implementation):
  """:func:`sliding_window_attention` over each device's slice with a halo around it."""
  context.check(q.shape[0], q.shape[1])
  h = window - 1

  def body(q, k, v, segment_ids=None):
    b, tl = q.shape[:2]
    conv.check_halo(f"a sliding window of {window}", h, context, tl)
    ids = jnp.zeros((b, tl), jnp.int32) if segment_ids is None else segment_ids
    idx = axis_index(context.axis_name)

    def side(nxt):  # the halo before (nxt False) or after the slice: [q, k, v, ids]
      edge = idx == (context.size - 1 if nxt else 0)
      # Past the sequence's ends: an id that differs from its neighbour's, so no
      # query sees those keys.
      fake = ((ids[:, -1:] if nxt else ids[:, :1]) == 0).astype(ids.dtype)
      far_ids = jnp.where(edge, fake, conv.halo(ids, h, context, from_next=nxt))
      # Halo queries only fill the band; their outputs are dropped.
      return [jnp.zeros_like(q[:, :h]), conv.halo(k, h, context, from_next=nxt),
              conv.halo(v, h, context, from_next=nxt), far_ids]

    pieces = [side(False), [q, k, v, ids]] + ([] if causal else [side(True)])
    ext = [jnp.concatenate(xs, axis=1) for xs in zip(*pieces)]
    o = sliding_window_attention(*ext[:3], window=window, causal=causal, scale=scale,
                                 segment_ids=ext[3], block_size=block_size,
                                 implementation=implementation)
    return o[:, h:h + tl]

  spec = context.seq_spec
  named = {"q": (q, spec), "k": (k, spec), "v": (v, spec), "segment_ids": (segment_ids, spec)}
  return context.shard(body, named, spec)


class SlidingWindowCache(NamedTuple):
  """Rolling key/value cache of the last ``window`` tokens (a pytree).

  Attributes:
    keys: ``[B, W, H, K]``; slot ``t % W`` holds token ``t``.
    values: ``[B, W, H, V]``.
    length: int32 scalar, tokens written so far (the same for every row).
  """

  keys: Array
  values: Array
  length: Array


def init_sliding_window_cache(batch: int, heads: int, window: int, key_dim: int,
                              value_dim: int, dtype=jnp.float32) -> SlidingWindowCache:
  """An empty :class:`SlidingWindowCache` (``keys [B, W, H, K]``, ``values [B, W, H, V]``).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> cache = ops.init_sliding_window_cache(1, 2, window=3, key_dim=4, value_dim=4)
    >>> cache.keys.shape, cache.values.shape  # [B, W, H, K], [B, W, H, V]
    ((1, 3, 2, 4), (1, 3, 2, 4))
  """
  for name, x in (("batch", batch), ("heads", heads), ("window", window),
                  ("key_dim", key_dim), ("value_dim", value_dim)):
    common.check_positive_int(name, x)
  return SlidingWindowCache(jnp.zeros((batch, window, heads, key_dim), dtype),
                            jnp.zeros((batch, window, heads, value_dim), dtype),
                            jnp.zeros((), jnp.int32))


def sliding_window_step(cache: SlidingWindowCache, q: Array, k: Array, v: Array, *,
                        window: int, scale: float | None = None):
  """One decoding step of causal sliding-window attention.

  Writes ``k, v`` into the cache (overwriting the token ``window`` steps back)
  and attends ``q`` over the cached tokens, itself included. Stepping through a
  sequence equals ``sliding_window_attention(..., causal=True)``.

  Args:
    cache: from :func:`init_sliding_window_cache` with ``W == window``.
    q, k: ``[B, H, K]``; v: ``[B, H, V]``.
    window: the window length.
    scale: logit scale; ``None`` means ``K ** -0.5``.

  Returns:
    ``(o, new_cache)`` with ``o`` ``[B, H, V]`` in the dtype of ``q``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> cache = ops.init_sliding_window_cache(1, 2, window=3, key_dim=4, value_dim=4)
    >>> for t in range(8):
    ...   o, cache = ops.sliding_window_step(cache, q[:, t], k[:, t], v[:, t], window=3)
    >>> o.shape
    (1, 2, 4)
    >>> bool(jnp.allclose(o, ops.sliding_window_attention(q, k, v, window=3)[:, 7], atol=1e-5))
    True
  """
  if not isinstance(cache, SlidingWindowCache):
    raise ValueError(
        "cache must be a SlidingWindowCache (from init_sliding_window_cache), got "
        f"{type(cache).__name__}.")
  b, h, dk, dv = common.check_step_qkv(q, k, v)
  common.check_positive_int("window", window)
  common.check_shape("cache.keys", cache.keys, (b, window, h, dk), "[B, window, H, K]")
  common.check_shape("cache.values", cache.values, (b, window, h, dv), "[B, window, H, V]")
  scale = common.resolve_scale(scale, dk)
  slot = cache.length % window
  keys = lax.dynamic_update_index_in_dim(cache.keys, k.astype(cache.keys.dtype), slot, 1)
  values = lax.dynamic_update_index_in_dim(cache.values, v.astype(cache.values.dtype), slot, 1)
  # Slots beyond the tokens written so far are still empty.
  filled = jnp.arange(window) < jnp.minimum(cache.length + 1, window)
  o, _ = sm.dense_attention_stats(q[:, None], keys, values, filled[None, None, :], scale)
  return o[:, 0].astype(q.dtype), SlidingWindowCache(keys, values, cache.length + 1)


# ---------------------------------------------------------------------------
# Longformer.


def _resolve_max_globals(global_mask: Array, max_globals: int | None) -> int:
  if max_globals is not None:
    if isinstance(max_globals, bool) or not isinstance(max_globals, int) or max_globals < 0:
      raise ValueError(f"max_globals must be an integer >= 0, got {max_globals!r}.")
  if isinstance(global_mask, jax.core.Tracer):
    if max_globals is None:
      raise ValueError(
          "max_globals must be given when global_mask is traced (under jit/vmap/grad): "
          "the number of gathered global tokens has to be static."
      )
    return max_globals
  most = int(np.max(np.sum(np.asarray(global_mask), axis=1), initial=0))
  if max_globals is None:
    return most
  if most > max_globals:
    raise ValueError(
        f"global_mask has up to {most} global tokens in a row, more than max_globals={max_globals}."
    )
  return max_globals


def longformer_attention(
    q: Array,
    k: Array,
    v: Array,
    global_mask: Array,
    *,
    window: int,
    causal: bool = False,
    max_globals: int | None = None,
    scale: float | None = None,
    segment_ids: Array | None = None,
    block_size: int | None = None,
) -> Array:
  """Longformer attention: a sliding window plus global tokens.

  Query ``i`` sees key ``j`` (same segment; ``j <= i`` if causal) when ``j`` is
  in ``i``'s window (as in :func:`sliding_window_attention`), when ``j`` is a
  global token, or when ``i`` is a global token (a global query sees its whole
  segment). Cost ``O(T * (window + max_globals))``.

  How: the global tokens of each row are gathered into ``max_globals`` slots
  (unused slots masked). Ordinary rows combine the windowed blockwise attention
  with one dense softmax over the gathered global keys (pairs already in the
  window are left out there so nothing counts twice), merged through their
  log-sum-exps into one softmax. Global rows are gathered too and attend to
  every key blockwise; their results replace those rows.

  Args:
    q: ``[B, T, H, K]``; k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    global_mask: ``[B, T]`` bool, True at global tokens.
    window: int >= 1, the sliding-window length.
    causal: restrict every pair to ``j <= i``.
    max_globals: static number of global slots per row. ``None``: the largest
      row count of a concrete ``global_mask`` (required when it is traced).
      With a concrete mask, more globals than slots raises; under tracing it
      cannot be checked, and a row's globals beyond the first ``max_globals``
      act as ordinary tokens.
    scale: logit scale; ``None`` means ``K ** -0.5``.
    segment_ids: optional ``[B, T]`` ints (packed sequences).
    block_size: block length of the windowed part (default as in
      :func:`sliding_window_attention`).

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> global_mask = jnp.zeros((1, 8), bool).at[:, 0].set(True)  # token 0 is global
    >>> o = ops.longformer_attention(q, k, v, global_mask, window=3)
    >>> o.shape
    (1, 8, 2, 4)
    >>> bool(jnp.allclose(o[:, 0], ops.softmax_attention(q, k, v)[:, 0], atol=1e-5))  # sees all
    True
  """
  b, t, _, dk, _ = common.check_attention(q, k, v, segment_ids)
  common.check_positive_int("window", window)
  common.check_shape("global_mask", global_mask, (b, t), "[batch, seq]")
  if jnp.result_type(global_mask) != jnp.bool_:
    raise ValueError(f"global_mask must be bool, got dtype {jnp.result_type(global_mask)}.")
  n_glob = _resolve_max_globals(global_mask, max_globals)
  block = _window_block(window, block_size)
  scale = common.resolve_scale(scale, dk)
  return _longformer(q, k, v, global_mask, segment_ids, window=window, causal=bool(causal),
                     n_glob=n_glob, scale=float(scale), block=block)


@functools.partial(jax.jit, static_argnames=("window", "causal", "n_glob", "scale", "block"))
def _longformer(q, k, v, global_mask, segment_ids, *, window, causal, n_glob, scale, block):
  b, t = q.shape[:2]
  o_win, lse_win = sm.self_attention_stats(q, k, v, segment_ids, scale=scale, block_size=block,
                                           causal=causal, window=window)
  if n_glob == 0:
    return o_win.astype(q.dtype)

  pos = sm.positions(b, t)
  seg = sm.segment_or_zeros(segment_ids, b, t)
  # Globals beyond the budget are ordinary tokens (only reachable under tracing).
  rank = jnp.cumsum(global_mask.astype(jnp.int32), axis=1)
  is_global = global_mask & (rank <= n_glob)
  # Positions of each row's global tokens in order; unused slots point at 0.
  slot_used = jnp.arange(n_glob) < jnp.sum(is_global, axis=1, keepdims=True)  # [B, G]
  g_pos = jax.vmap(lambda m: jnp.nonzero(m, size=n_glob, fill_value=0)[0])(is_global)
  g_pos = g_pos.astype(jnp.int32)
  take = lambda x: jnp.take_along_axis(x, g_pos.reshape(b, n_glob, *([1] * (x.ndim - 2))), axis=1)
  g_seg = take(seg)

  # Every query against the gathered global keys, minus pairs the window covers.
  visible = (slot_used[:, None, :] & (seg[:, :, None] == g_seg[:, None, :])
             & ~window_visible(pos[:, :, None], g_pos[:, None, :], window, causal))
  if causal:
    visible &= g_pos[:, None, :] <= pos[:, :, None]
  o_glob, lse_glob = sm.dense_attention_stats(q, take(k), take(v), visible, scale)
  o, _ = sm.merge_attention(o_win, lse_win, o_glob, lse_glob)

  # Global queries against every key (positions are not block-aligned).
  bq = min(block, n_glob)
  mask = sm.BlockMask(bq, min(block, t), causal=causal, aligned=False)
  q_seg = jnp.where(slot_used, g_seg, sm.PAD_QUERY_SEG)
  o_rows, _ = sm.flash_attention_stats(take(q), k, v, g_pos, pos, q_seg, seg, mask=mask,
                                       scale=scale)
  # Token t that is global is slot rank_t - 1 of its row.
  slot = jnp.clip(rank - 1, 0, n_glob - 1)
  o_rows = jnp.take_along_axis(o_rows, slot[:, :, None, None], axis=1)
  o = jnp.where(is_global[:, :, None, None], o_rows, o)
  return o.astype(q.dtype)


# ---------------------------------------------------------------------------
# BigBird.


class BigBirdPattern(NamedTuple):
  """A BigBird block pattern over ``N`` blocks (``S = w + r + g`` selections).

  Attributes:
    block_ids: ``[N, S]`` int32 key blocks each query block gathers: its window
      blocks, then its random blocks, then the global blocks.
    block_valid: ``[N, S]`` bool, False where a selection is unused (window
      blocks off the edge, already global or in the future when causal; random
      draws for which no candidate block was left).
    matrix: ``[N, N]`` bool, query block ``a`` sees key block ``c``. Rows of
      global blocks are full (lower-triangular when causal); those rows are
      computed as full attention, not from ``block_ids``.
  """

  block_ids: Array
  block_valid: Array
  matrix: Array


def _check_bigbird_counts(num_window_blocks, num_random_blocks, num_global_blocks):
  common.check_positive_int("num_window_blocks", num_window_blocks)
  if num_window_blocks % 2 == 0:
    raise ValueError(
        f"num_window_blocks must be odd (the window is centred on the query block), "
        f"got {num_window_blocks}."
    )
  for name, x in (("num_random_blocks", num_random_blocks),
                  ("num_global_blocks", num_global_blocks)):
    if isinstance(x, bool) or not isinstance(x, int) or x < 0:
      raise ValueError(f"{name} must be an integer >= 0, got {x!r}.")


def bigbird_pattern(num_blocks: int, *, key: Array, num_window_blocks: int = 3,
                    num_random_blocks: int = 2, num_global_blocks: int = 2,
                    causal: bool = False) -> BigBirdPattern:
  """The BigBird block pattern: window, random and global blocks.

  Query block ``a >= g`` sees: window blocks ``a - w//2 .. a + w//2``; the
  global blocks ``0 .. g-1``; ``r`` distinct random blocks drawn from ``key``
  among the rest (not global, outside the window, and before ``a - w//2`` when
  causal). The same ``key`` gives the same pattern. Query blocks ``a < g`` see
  everything (up to themselves when causal).

  Args:
    num_blocks: ``N``, the number of blocks.
    key: a PRNG key.
    num_window_blocks: ``w``, odd.
    num_random_blocks: ``r``.
    num_global_blocks: ``g``.
    causal: drop future blocks.

  Returns:
    A :class:`BigBirdPattern`.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> p = ops.bigbird_pattern(6, key=jax.random.key(0), num_window_blocks=3,
    ...                        num_random_blocks=1, num_global_blocks=1)
    >>> p.block_ids.shape, p.matrix.shape  # [N, w + r + g], [N, N]
    ((6, 5), (6, 6))
    >>> bool(p.matrix[0].all() and p.matrix[:, 0].all())  # block 0 is global
    True
  """
  common.check_positive_int("num_blocks", num_blocks)
  _check_bigbird_counts(num_window_blocks, num_random_blocks, num_global_blocks)
  n, half, g, r = num_blocks, num_window_blocks // 2, num_global_blocks, num_random_blocks
  a = jnp.arange(n)[:, None]
  c = jnp.arange(n)[None, :]

  win_ids = a + jnp.arange(-half, half + 1)[None, :]
  win_ok = (win_ids >= g) & (win_ids < n)
  if causal:
    win_ok &= win_ids <= a
  ids, ok = [jnp.clip(win_ids, 0, n - 1)], [win_ok]

  if r > 0:
    candidate = (c >= g) & (jnp.abs(c - a) > half)
    if causal:
      candidate &= c < a
    # r distinct draws without replacement: the r largest uniform scores.
    scores = jnp.where(candidate, jax.random.uniform(key, (n, n)), -1.0)
    top, rand_ids = lax.top_k(scores, min(r, n))
    ids.append(rand_ids)
    ok.append(top >= 0)

  if g > 0:
    ids.append(jnp.broadcast_to(jnp.arange(g), (n, g)))
    ok.append(jnp.ones((n, g), bool))

  block_ids = jnp.concatenate(ids, axis=1).astype(jnp.int32)
  block_valid = jnp.concatenate(ok, axis=1)
  hits = (block_ids[:, :, None] == c[None]) & block_valid[:, :, None]
  matrix = jnp.any(hits, axis=1) | (a < g)
  if causal:
    matrix &= c <= a
  return BigBirdPattern(block_ids, block_valid, matrix)


def bigbird_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    block_size: int,
    key: Array,
    num_window_blocks: int = 3,
    num_random_blocks: int = 2,
    num_global_blocks: int = 2,
    causal: bool = False,
    scale: float | None = None,
    segment_ids: Array | None = None,
) -> Array:
  """BigBird block-sparse attention (window + random + global blocks).

  The sequence is cut into ``N = ceil(T / block_size)`` blocks (padded inside)
  and query block ``a`` sees the key blocks of ``bigbird_pattern(N, ...)``,
  restricted to its segment (and to ``j <= i`` if causal). Ordinary query
  blocks gather their ``w + r + g`` key blocks and attend with one softmax,
  ``O(T * block_size * (w + r + g))``; the ``g`` global query blocks attend to
  every key blockwise, ``O(g * block_size * T)``.

  Args:
    q: ``[B, T, H, K]``; k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    block_size: tokens per block. The layout needs ``N >= g + w + r`` blocks,
      i.e. ``block_size <= T // (g + w + r)``.
    key: PRNG key of the random blocks (shared by the batch and heads).
    num_window_blocks: ``w``, odd.
    num_random_blocks: ``r``.
    num_global_blocks: ``g``: the first ``g`` blocks attend to and are
      attended by everything.
    causal: restrict to ``j <= i``.
    scale: logit scale; ``None`` means ``K ** -0.5``.
    segment_ids: optional ``[B, T]`` ints (packed sequences).

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 16, 2, 4))
    >>> o = ops.bigbird_attention(q, k, v, block_size=2, key=jax.random.key(1))
    >>> o.shape
    (1, 16, 2, 4)
    >>> full = ops.softmax_attention(q, k, v)
    >>> bool(jnp.allclose(o[:, :4], full[:, :4], atol=1e-5))  # the global blocks' rows
    True
  """
  b, t, h, dk, dv = common.check_attention(q, k, v, segment_ids)
  common.check_positive_int("block_size", block_size)
  _check_bigbird_counts(num_window_blocks, num_random_blocks, num_global_blocks)
  g = num_global_blocks
  need = g + num_window_blocks + num_random_blocks
  n = -(-t // block_size)
  if n < need:
    raise ValueError(
        f"block_size={block_size} cuts T={t} into {n} blocks, but the BigBird layout needs at "
        f"least num_global_blocks + num_window_blocks + num_random_blocks = {need}: use "
        f"block_size <= {max(1, t // need)} (T // {need}) or fewer blocks."
    )
  if key is None:
    raise ValueError("key must be a PRNG key (it draws the random blocks), got None.")
  scale = common.resolve_scale(scale, dk)
  return _bigbird(q, k, v, segment_ids, key, bs=block_size, w=num_window_blocks,
                  r=num_random_blocks, g=g, causal=bool(causal), scale=float(scale))


@functools.partial(jax.jit, static_argnames=("bs", "w", "r", "g", "causal", "scale"))
def _bigbird(q, k, v, segment_ids, key, *, bs, w, r, g, causal, scale):
  b, t, h, _ = q.shape
  dv = v.shape[-1]
  n = -(-t // bs)
  pattern = bigbird_pattern(n, key=key, num_window_blocks=w, num_random_blocks=r,
                            num_global_blocks=g, causal=causal)
  pos = sm.positions(b, n * bs)
  seg = common.pad_axis(sm.segment_or_zeros(segment_ids, b, t), bs)
  k_seg = jnp.where(pos < t, seg, sm.PAD_KEY_SEG)
  qp, kp, vp = (common.pad_axis(x, bs) for x in (q, k, v))

  # Ordinary query blocks: gather the selected key blocks, one softmax each.
  ids = pattern.block_ids[g:]  # [N-g, S]
  s = ids.shape[1]
  blocks = lambda x: x.reshape(b, n, bs, *x.shape[2:])
  gather = lambda x: blocks(x)[:, ids].reshape(b, n - g, s * bs, *x.shape[2:])
  q_rows = blocks(qp)[:, g:]
  q_pos = blocks(pos)[:, g:]
  q_seg = blocks(seg)[:, g:]
  k_pos, k_sg = gather(pos), gather(k_seg)
  visible = (jnp.repeat(pattern.block_valid[g:], bs, axis=1)[None, :, None, :]
             & (q_seg[..., :, None] == k_sg[..., None, :]))
  if causal:
    visible &= k_pos[..., None, :] <= q_pos[..., :, None]
  o_rows, _ = sm.dense_attention_stats(q_rows, gather(kp), gather(vp), visible, scale)
  o_rows = o_rows.reshape(b, (n - g) * bs, h, dv)

  if g > 0:
    # Global query blocks: full (causal) attention, block-aligned with the keys.
    gt = g * bs
    mask = sm.BlockMask(bs, bs, causal=causal)
    o_glob, _ = sm.flash_attention_stats(qp[:, :gt], kp, vp, pos[:, :gt], pos, seg[:, :gt],
                                         k_seg, mask=mask, scale=scale)
    o_rows = jnp.concatenate([o_glob, o_rows], axis=1)
  return o_rows[:, :t].astype(q.dtype)
