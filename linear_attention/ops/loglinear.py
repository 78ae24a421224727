"""Log-linear attention (Guo et al. 2025, arXiv:2506.04761) over the diagonal-decay engine.

Linear attention keeps one state; log-linear attention keeps one per level of
a Fenwick tree over the positions, and the query mixes the levels with
data-dependent weights ``lambda_t^(l)``::

    o_t = scale * sum_{s <= t} lambda_t^(level(t, s)) * decay(s -> t) * (q_t . k_s) v_s
    level(t, s) = min(bit_length(p_t XOR p_s), L - 1)

with ``p`` the position in the sequence (segment). Level 0 is the token
itself; level ``l >= 1`` holds ``2^(l-1)`` tokens: the left half of the
``2^l``-aligned block whose right half contains ``p_t`` (empty when ``p_t`` is
in the left half). So a query sees ``popcount(p_t) + 1 <= log2(T) + 1``
buckets, and decoding keeps ``L`` states. Levels from ``L - 1`` up share the
top weight, so any length works with any ``L`` (the paper takes
``L = log2(T) + 1``, where nothing is shared). ``decay(s -> t)`` is the
engine's: ``exp(sum of log_decay over (s, t])``, a scalar per head
(log-linear Mamba-2) or a vector over key channels (log-linear GLA).

Forms (all agree; the tests prove it):

* ``parallel``: the masked ``T x T`` form with the level of every pair.
* ``chunk``: with ``chunk_size`` rounded down to a power of two ``C = 2^c``, a
  pair in one chunk has level ``bit_length(i XOR j)`` of its in-chunk offsets, a
  fixed ``C x C`` pattern: one dense masked score matrix per chunk weighted by
  ``lambda`` at that pattern. A pair in chunks ``n > m`` has level
  ``c + bit_length(n XOR m)``: each chunk level is one matmul of the queries
  against the states of aligned blocks of chunks, summed from the chunk states
  by a tree (no scan); ``O(T log(T / C))``. Packed segments and an initial
  state move positions off the chunk grid: those calls take the previous
  chunk form, one engine pass per level (level ``l``'s keys kept in left
  halves, queries in right halves, the state reset at every ``2^l``-aligned
  block, all levels stacked on the batch axis; when levels are shared, the
  top level is the plain engine output minus the levels below it), slower
  than the Fenwick form (``results/bench_loglinear_cpu.json``).
* ``recurrent``: token by token through :func:`loglinear_decay_step`'s update,
  with ``O(L)`` states: after a token at position ``p`` with ``r`` trailing
  one bits, levels ``0..r`` merge into level ``r + 1``.

Context parallelism (``context=``, a :class:`~linear_attention.ops.context.SeqContext`):
the levels are the engine's initial-state machinery run across devices. A state entering
a slice at position ``p0`` reaches the slice's tokens and its end exactly as an initial
state does (an old bucket at level ``l`` sits at level ``max(l, bit_length(p_t XOR p0))``
for the query at ``p_t``), and that is linear in the state. So each device

1. runs its slice from empty levels at its global position ``p0`` (the position in its
   first segment: ``i T / P``, plus the initial state's position, or counted from a
   segment start on an earlier device);
2. gathers every slice's final levels and the slice's map of an entering state (levels
   moved by ``p0`` and the end position, decayed by the slice's total log decay, cut by
   a segment start inside) and folds them
   (:func:`~linear_attention.engines.context.fold_affine`, ``P`` steps);
3. adds the entering state's read, one ``[T, K] x [L, K, V]`` product per head.

Without segments or an initial state and with ``T / P`` a power of two, a slice is a
``2^m``-aligned block, so its pairs have the levels they have at position 0: step 1 runs
the Fenwick chunk form and its final state (every token in one level) moves to the
level of the global end position. Otherwise step 1 takes the per-level chunk form, as
segments and initial states do on one device.

State layout: a tuple ``(S [B, H, L, K, V], position [B])``, float32. ``S[:,
:, l]`` is the bucket at level ``l`` relative to the next position (level 0
is empty between tokens unless ``L = 1``); ``position`` counts the tokens
seen in the current segment (a float32 integer, exact below ``2^24``). A
fresh state is all zeros; a segment start resets to one.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from linear_attention import common
from linear_attention.engines import context as context_lib
from linear_attention.engines.decay import engine as decay
from linear_attention.engines.context import SeqContext
from linear_attention.engines import chunks

Array = jax.Array


# --------------------------------------------------------------------- helpers


def _bit_length(x: Array) -> Array:
  """``bit_length`` of non-negative int32 values (``0 -> 0``)."""
  return 32 - lax.clz(x)


def _positions(b: int, t: int, segment_ids, pos0):
  """``(p [B, T] int32, first [B, T] bool, seg [B, T] int32)``: position in the segment
  (offset by ``pos0`` in the first one), in-first-segment flag, monotone segment index."""
  idx = jnp.arange(t, dtype=jnp.int32)[None]
  if segment_ids is None:
    starts = jnp.zeros((b, t), bool)
  else:
    starts = common.segment_starts(segment_ids)
  start_idx = lax.cummax(jnp.where(starts, idx, 0), axis=1)
  first = start_idx == 0
  p = idx - start_idx + jnp.where(first, pos0[:, None], 0)
  return p, first, jnp.cumsum(starts.astype(jnp.int32), axis=1)


def _gather_levels(lam: Array, levels: Array) -> Array:
  """``lam [B, T, H, L]`` at ``levels [B, T, N]`` (ints) -> ``[B, T, H, N]``."""
  idx = jnp.broadcast_to(levels[:, :, None, :], lam.shape[:3] + levels.shape[-1:])
  return jnp.take_along_axis(lam, idx, axis=-1)


def _expand(g: Array, like_ndim: int) -> Array:
  """A scalar decay ``[..., H]`` gets a key axis to meet ``[..., H, K]``; vectors pass."""
  return g[..., None] if g.ndim == like_ndim - 1 else g


def _initial_read(q, G, lam, s0, pos0, p, first):
  """The initial state's part of every output (first segment only).

  An old bucket at level ``l`` (relative to ``pos0``) sits at level
  ``max(l, bit_length(p_t XOR pos0))`` for the query at ``p_t``.
  """
  levels = lam.shape[-1]
  qd = q * jnp.exp(_expand(G, q.ndim)) * first[..., None, None]
  r = jnp.einsum("bthk,bhlkv->bthlv", qd, s0)
  lv = jnp.minimum(jnp.maximum(jnp.arange(levels)[None, None],
                               _bit_length(p ^ pos0[:, None])[..., None]), levels - 1)
  return jnp.einsum("bthl,bthlv->bthv", _gather_levels(lam, lv), r)


def _carry_initial(s0, pos0, p_end, total, carries):
  """The initial state's buckets moved to their levels at ``p_end`` and decayed by
  ``exp(total)`` (``[B, H]`` or ``[B, H, K]``); zero where the row's last segment
  is not its first (``carries [B]`` False)."""
  levels = s0.shape[2]
  lv = jnp.minimum(jnp.maximum(jnp.arange(levels)[None], _bit_length(p_end ^ pos0)[:, None]),
                   levels - 1)  # [B, L_old] -> new level
  move = jax.nn.one_hot(lv, levels, dtype=s0.dtype) * carries[:, None, None]
  a = jnp.exp(total)
  s0 = s0 * (a[:, :, None, None, None] if a.ndim == 2 else a[:, :, None, :, None])
  return jnp.einsum("bml,bhmkv->bhlkv", move, s0)


# ----------------------------------------------------------------------- forms


def _parallel(q, k, v, g, lam, s0, pos0, seg_info, *, has_initial):
  """Masked ``T x T`` form on ``[B, T, H, *]`` arrays (``q`` scaled)."""
  p, first, seg = seg_info
  t, levels = q.shape[1], lam.shape[-1]
  G = jnp.cumsum(g, axis=1)
  mask = jnp.tril(jnp.ones((t, t), bool))[None] & (seg[:, :, None] == seg[:, None, :])
  if g.ndim == 3:
    diff = jnp.where(mask[..., None], G[:, :, None] - G[:, None, :], -jnp.inf)  # [B,T,S,H]
    scores = jnp.einsum("bthk,bshk,btsh->bths", q, k, jnp.exp(diff))
  else:
    diff = jnp.where(mask[..., None, None], G[:, :, None] - G[:, None, :], -jnp.inf)
    scores = jnp.einsum("bthk,bshk,btshk->bths", q, k, jnp.exp(diff))
  lv = jnp.minimum(_bit_length(p[:, :, None] ^ p[:, None, :]), levels - 1)  # [B,T,S]
  scores = jnp.where(mask[:, :, None], scores * _gather_levels(lam, lv), 0.0)
  o = jnp.einsum("bths,bshv->bthv", scores, v)
  if has_initial:
    o = o + _initial_read(q, G, lam, s0, pos0, p, first)

  # Final state: every key of the last segment in its bucket at the next position.
  last = seg == seg[:, -1:]
  p_end = p[:, -1] + 1
  slot = jnp.minimum(_bit_length(p_end[:, None] ^ p), levels - 1)
  last_x = last.reshape(last.shape + (1,) * (G.ndim - 2))
  dec = jnp.exp(jnp.where(last_x, G[:, -1:] - G, -jnp.inf))
  kd = k * _expand(dec, k.ndim)
  state = jnp.einsum("btl,bthk,bthv->bhlkv", jax.nn.one_hot(slot, levels, dtype=q.dtype), kd, v)
  if has_initial:
    state = state + _carry_initial(s0, pos0, p_end, G[:, -1], first[:, -1])
  return o, (state, p_end)


def _plan(t: int, levels: int, has_initial: bool):
  """The masked levels the chunk form needs, and whether the top level is shared.

  Without an initial state positions stay below ``T``, so levels above
  ``bit_length(T)`` are empty: if those fit below ``L``, nothing is shared.
  """
  top = t.bit_length()
  if not has_initial and top <= levels - 1:
    return tuple(range(1, top + 1)), False
  return tuple(range(1, levels - 1)), True


def _chunk(q, k, v, g, lam, s0, pos0, seg_info, *, chunk_size, has_initial, implementation):
  """Each level an engine call (stacked on the batch axis); ``q`` scaled. The chunk form of
  packed segments and initial states, whose positions are off the chunk grid."""
  p, first, seg = seg_info
  b, t, h, dk = q.shape
  dv, levels = v.shape[-1], lam.shape[-1]
  masked, shared = _plan(t, levels, has_initial)
  seg_start = jnp.concatenate([jnp.zeros((b, 1), bool), seg[:, 1:] != seg[:, :-1]], axis=1)
  qs, ks, ids = [], [], []
  for lvl in masked:
    right = ((p >> (lvl - 1)) & 1).astype(q.dtype)[..., None, None]
    block_start = (p & ((1 << lvl) - 1)) == 0
    qs.append(q * right)
    ks.append(k * (1.0 - right))
    ids.append(jnp.cumsum((seg_start | block_start).astype(jnp.int32), axis=1))
  if shared:
    qs.append(q)
    ks.append(k)
    ids.append(seg)
  n = len(qs)
  cat = lambda xs: jnp.concatenate(xs, axis=0)
  tile = lambda x: jnp.concatenate([x] * n, axis=0)
  out, states = decay.decay_linear_attention(
      cat(qs), cat(ks), tile(v), tile(g), scale=1.0, form="chunk", chunk_size=chunk_size,
      return_state=True, segment_ids=cat(ids), implementation=implementation)
  out = out.reshape(n, b, t, h, dv)
  states = states.reshape(n, b, h, dk, dv)

  own = jnp.sum(q * k, axis=-1, keepdims=True) * v  # level 0: the token itself
  lam_at = lambda lvl: lam[..., lvl, None]
  o = lam_at(0) * own if levels > 1 else 0.0
  below = own
  for i, lvl in enumerate(masked):
    o = o + lam_at(lvl) * out[i]
    below = below + out[i]
  if shared:  # the shared top: everything minus the levels below it
    o = o + lam_at(levels - 1) * (out[-1] - (below if levels > 1 else 0.0))
  if has_initial:  # (static: skipped, not multiplied by zeros, without one)
    G = jnp.cumsum(g, axis=1)
    o = o + _initial_read(q, G, lam, s0, pos0, p, first)

  p_end = p[:, -1] + 1
  slots = [jnp.zeros((b, h, dk, dv), q.dtype)] * levels
  in_bucket = lambda lvl: ((p_end >> (lvl - 1)) & 1).astype(q.dtype)[:, None, None, None]
  for i, lvl in enumerate(masked):
    slots[lvl] = in_bucket(lvl) * states[i]
  if shared:
    slots[levels - 1] = states[-1] - sum((slots[lvl] for lvl in masked),
                                         jnp.zeros_like(states[-1]))
  state = jnp.stack(slots, axis=2)
  if has_initial:
    state = state + _carry_initial(s0, pos0, p_end, G[:, -1], first[:, -1])
  return o, (state, p_end)


def _fenwick_chunk_size(t: int, chunk_size: int) -> int:
  """The aligned chunk length: ``chunk_size`` rounded down to a power of two, and no
  longer than the power of two that holds ``T``."""
  c = min(chunk_size, 1 << max(t - 1, 0).bit_length())
  return 1 << (c.bit_length() - 1)


def _chunk_fenwick(q, k, v, g, lam, *, chunk):
  """The chunk form of an aligned sequence (positions ``0..T-1``); ``q`` scaled.

  With ``chunk = 2^c``, a pair in one chunk has level ``bit_length(i XOR j)`` of its in-chunk
  offsets (a fixed ``C x C`` pattern of levels ``0..c``): one masked score matrix per chunk,
  weighted by ``lambda_i`` at that pattern. A pair in chunks ``n > m`` has level
  ``c + bit_length(n XOR m)``: chunk level ``j`` of a query chunk with bit ``j - 1`` set is
  the aligned block of ``2^(j-1)`` chunks just before its own block, so each level is one
  matmul of the queries in right halves against the block states of left halves. Block
  states come from a tree over the chunk states (``O(N)`` in all); no scan.
  """
  b, t, h, dk = q.shape
  dv, levels = v.shape[-1], lam.shape[-1]
  c = chunk.bit_length() - 1
  vector = g.ndim == 4
  qc, kc, vc, gs, lc = (decay._chunks(jnp.swapaxes(x, 1, 2), chunk) for x in (q, k, v, g, lam))
  n = qc.shape[2]
  gc = jnp.cumsum(gs, axis=3)  # in-chunk cumulative log decay, [B, H, N, C(, K)]
  last = gc[:, :, :, -1]  # each chunk's log decay, [B, H, N(, K)]
  ex = lambda x: x if vector else x[..., None]  # a scalar decay meets a key axis

  # In-chunk pairs: scores times lambda_i at the level pattern (0 above the diagonal).
  i = np.arange(chunk)
  causal = i[:, None] >= i[None]
  pattern = np.minimum(_static_bit_length(i[:, None] ^ i[None]), levels - 1)
  if vector:
    scores = chunks.intra_scores_vector(qc, kc, gc)
  else:
    diff = jnp.where(causal, gc[..., :, None] - gc[..., None, :], -jnp.inf)
    scores = jnp.einsum("bhnik,bhnjk->bhnij", qc, kc) * jnp.exp(diff)
  # lambda_i at the pattern, one matmul against the pattern's one-hot (faster than masked sums).
  used = min(c, levels - 1) + 1
  one_hot = np.eye(used, dtype=np.float32)[pattern] * causal[..., None]  # [C, C, used]
  weights = jnp.einsum("bhnil,isl->bhnis", lc[..., :used], one_hot.astype(q.dtype))
  o = jnp.einsum("bhnij,bhnjv->bhniv", scores * weights, vc)

  # Chunk states decayed to their ends, and the queries decayed from their chunk's start.
  q_in = qc * jnp.exp(ex(gc))
  local = jnp.einsum("bhnjk,bhnjv->bhnkv", kc * jnp.exp(ex(last[:, :, :, None] - gc)), vc)

  def halves(x, width, axis=2):
    """Chunk axis -> ``[.., M, 2, width, ..]``: ``M`` pairs of ``width``-chunk blocks."""
    x = common.pad_axis(x, 2 * width, axis=axis)
    return x.reshape(x.shape[:axis] + (-1, 2, width) + x.shape[axis + 1:])

  # Chunk levels: blocks of 2^(j-1) chunks and their log decays, level j = 1, 2, ...
  n_end, rest = t >> c, t & (chunk - 1)  # the final state is read at position T
  reads = max(n - 1, 0).bit_length()
  blocks, block_decay, tree = local, last, []
  for j in range(1, max(reads, n_end.bit_length()) + 1):
    tree.append(blocks)
    width = 1 << (j - 1)
    if j <= reads:
      lam_j = lc[..., min(c + j, levels - 1), None]
      right = halves(q_in * lam_j, width)[:, :, :, 1]  # [B, H, M, w, C, K]
      d = halves(last, width)[:, :, :, 1]  # [B, H, M, w(, K)]: log decays of right halves
      # From the block's start to each chunk's start (an exclusive sum: no cancellation).
      d = jnp.cumsum(jnp.concatenate([jnp.zeros_like(d[:, :, :, :1]), d[:, :, :, :-1]], 3), 3)
      left = halves(blocks, 1)[:, :, :, 0, 0]  # [B, H, M, K, V]: the even blocks
      o_j = jnp.einsum("bhmwck,bhmkv->bhmwcv", right * jnp.exp(ex(d))[..., None, :], left)
      o_j = jnp.stack([jnp.zeros_like(o_j), o_j], axis=3)
      o = o + o_j.reshape(o_j.shape[:2] + (-1,) + o_j.shape[-2:])[:, :, :n]
    pair = halves(block_decay, 1)[:, :, :, :, 0]  # [B, H, M/2, 2(, K)]
    blocks = halves(blocks, 1)[:, :, :, :, 0]
    blocks = jnp.exp(ex(pair[:, :, :, 1]))[..., None] * blocks[:, :, :, 0] + blocks[:, :, :, 1]
    block_decay = pair[:, :, :, 0] + pair[:, :, :, 1]
  o = jnp.swapaxes(o.reshape(b, h, n * chunk, dv)[:, :, :t], 1, 2)

  # Final state at position T: the partial last chunk by in-chunk level, then chunk levels.
  state = jnp.zeros((b, h, levels, dk, dv), q.dtype)
  if rest:
    kd = kc[:, :, n_end, :rest] * jnp.exp(ex(last[:, :, n_end, None] - gc[:, :, n_end, :rest]))
    slot = np.minimum(_static_bit_length(rest ^ np.arange(rest)), levels - 1)
    state = state + jnp.einsum("bhik,bhiv,il->bhlkv", kd, vc[:, :, n_end, :rest],
                               np.eye(levels, dtype=np.float32)[slot])
  for j in range(1, n_end.bit_length() + 1):
    if (n_end >> (j - 1)) & 1:
      end = (n_end >> (j - 1)) << (j - 1)  # the block's end, in chunks
      a = jnp.exp(ex(jnp.sum(last[:, :, end:], axis=2)))[..., None]
      lvl = min(c + j, levels - 1)
      state = state.at[:, :, lvl].add(a * tree[j - 1][:, :, (n_end >> (j - 1)) - 1])
  return o, (state, jnp.full((b,), t, jnp.int32))


def _static_bit_length(x) -> np.ndarray:
  """``bit_length`` of a static (numpy) int array: the level patterns known at trace time."""
  x = np.asarray(x)
  return np.vectorize(int.bit_length, otypes=[np.int64])(x) if x.size else x


def _trailing_ones(x: Array) -> Array:
  """Number of trailing one bits of non-negative int32 ``x``."""
  y = x + 1
  return _bit_length(y & -y) - 1


def _update(s, pos, q, k, v, g, lam):
  """One token on ``[B, H, *]`` arrays (``q`` scaled, ``pos [B]`` int32): decay every
  level, add ``k v^T`` at level 0, read, then merge levels ``0..r`` into ``r + 1``."""
  levels = s.shape[2]
  a = jnp.exp(g)
  s = s * (a[:, :, None, None, None] if g.ndim == 2 else a[:, :, None, :, None])
  s = s.at[:, :, 0].add(k[..., :, None] * v[..., None, :])
  o = jnp.einsum("bhk,bhlkv,bhl->bhv", q, s, lam)
  r = _trailing_ones(pos)
  lv = jnp.arange(levels)[None]
  low = (lv <= r[:, None])[:, None, :, None, None]  # [B,1,L,1,1]
  merged = jnp.sum(jnp.where(low, s, 0.0), axis=2)
  into = (lv == jnp.minimum(r + 1, levels - 1)[:, None])[:, None, :, None, None]
  s = jnp.where(low, 0.0, s) + jnp.where(into, merged[:, :, None], 0.0)
  return o, s, pos + 1


def _recurrent(q, k, v, g, lam, s0, pos0, starts):
  move = lambda x: jnp.moveaxis(x, 1, 0)
  real = jnp.ones(starts.shape[1:], bool)  # False on remat_scan's padding: a no-op there

  def body(carry, x):
    s, pos = carry
    q_t, k_t, v_t, g_t, l_t, start, ok = x
    s = jnp.where(start[:, None, None, None, None], 0.0, s)
    pos = jnp.where(start, 0, pos)
    o_t, s_new, pos_new = _update(s, pos, q_t, k_t, v_t, g_t, l_t)
    return (jnp.where(ok, s_new, s), jnp.where(ok, pos_new, pos)), o_t

  (s, pos), o = common.remat_scan(body, (s0, pos0),
                                  (move(q), move(k), move(v), move(g), move(lam), starts.T, real))
  return jnp.moveaxis(o, 0, 1), (s, pos)


@functools.partial(jax.jit, static_argnames=("form", "chunk_size", "has_initial",
                                             "implementation"))
def _forward(q, k, v, g, lam, s0, pos0, segment_ids, *, form, chunk_size, has_initial,
             implementation):
  b, t = q.shape[:2]
  g = common.floor_log_decay(g)  # -inf would give inf - inf in the cumulative sums
  if form == "recurrent":
    starts = (jnp.zeros((b, t), bool) if segment_ids is None
              else common.segment_starts(segment_ids))
    return _recurrent(q, k, v, g, lam, s0, pos0, starts)
  seg_info = _positions(b, t, segment_ids, pos0)
  if form == "parallel":
    return _parallel(q, k, v, g, lam, s0, pos0, seg_info, has_initial=has_initial)
  if segment_ids is None and not has_initial:
    return _chunk_fenwick(q, k, v, g, lam, chunk=_fenwick_chunk_size(t, chunk_size))
  return _chunk(q, k, v, g, lam, s0, pos0, seg_info, chunk_size=min(chunk_size, t),
                has_initial=has_initial, implementation=implementation)


# ------------------------------------------------------------ sequence parallel


def _sharded(q, k, v, g, lam, s0, pos0, segment_ids, *, context, **static):
  """:func:`_forward` split over ``context`` (the module doc's "Context parallelism")."""
  seq, row = context.seq_spec, context.row_spec
  named = {"q": (q, seq), "k": (k, seq), "v": (v, seq), "g": (g, seq), "lam": (lam, seq),
           "s0": (s0, row), "pos0": (pos0, row), "segment_ids": (segment_ids, seq)}
  o, state, pos = context_lib.run_sharded(_local, context, named, (seq, row, row), **static)
  return o, (state, pos)


def _local(q, k, v, g, lam, s0, pos0, segment_ids=None, *, axis_name, form, chunk_size,
           has_initial, implementation):
  """Per device: this slice from an empty state at its global position, the fold of the
  slices' level-state maps, and the entering state's read (the module doc)."""
  b, t, levels = q.shape[0], q.shape[1], lam.shape[-1]
  idx = context_lib.axis_index(axis_name)
  g = common.floor_log_decay(g)
  zero = context_lib.varying_zero(q, segment_ids, dtype=q.dtype)
  offset = idx * t  # this slice's first global index

  # This slice's first token's position in its segment, from every slice's last start.
  cont = None
  start = jnp.full((b,), -1, jnp.int32)
  if segment_ids is not None:
    cont, _, _ = context_lib.device_segments(segment_ids, axis_name, q.dtype)
    inner = jnp.max(jnp.where(common.segment_starts(segment_ids), jnp.arange(t), -1), axis=1)
    inner = jnp.where(inner >= 0, inner + offset, -1)
    n = cont.shape[0]
    edges = jnp.where(cont, -1, (jnp.arange(n, dtype=jnp.int32) * t)[:, None])  # [n, B]
    last = jnp.maximum(lax.all_gather(inner, axis_name), edges)
    earlier = (jnp.arange(n) < idx)[:, None]
    start = jnp.maximum(jnp.max(jnp.where(earlier, last, -1), axis=0), edges[idx])
  here = jnp.where(start >= 0, offset - start, pos0 + offset).astype(jnp.int32)

  # 1. The slice from an empty state at position ``here`` (aligned: the Fenwick form, module doc).
  aligned = (form == "chunk" and segment_ids is None and not has_initial and t & (t - 1) == 0)
  empty = jnp.zeros_like(s0) + zero
  if aligned:
    o, (local, _) = _forward(q, k, v, g, lam, empty, jnp.zeros_like(here), None, form=form,
                             chunk_size=chunk_size, has_initial=False,
                             implementation=implementation)
    lvl = jnp.minimum(_bit_length(here ^ (here + t)), levels - 1)
    local = jnp.einsum("bl,bhkv->bhlkv", jax.nn.one_hot(lvl, levels, dtype=local.dtype),
                       jnp.sum(local, axis=2))
  else:
    o, (local, _) = _forward(q, k, v, g, lam, empty, here, segment_ids, form=form,
                             chunk_size=min(chunk_size, t), has_initial=True,
                             implementation=implementation)

  # 2. A slice maps the state entering it to its final one as the engine's initial state
  # (levels moved by position, decayed; cut by a segment start inside): fold those maps.
  p, first, _ = _positions(b, t, segment_ids, here)
  G = jnp.cumsum(g, axis=1)
  p_end = p[:, -1] + 1
  maps = tuple(lax.all_gather(x, axis_name) for x in (here, p_end, G[:, -1], first[:, -1]))
  s_in, s_end = context_lib.fold_affine(lambda m, s: _carry_initial(s, *m), maps,
                                        lax.all_gather(local, axis_name),
                                        s0 if has_initial else None, cont, axis_name)

  # 3. The entering state's part of the outputs, as an initial state's. Aligned, only the levels
  # above this slice's own are read (earlier slices sit there): O(log P), not O(L).
  if aligned:
    lo = min(t.bit_length(), levels - 1)
    qd = q * jnp.exp(_expand(G, q.ndim))
    r = jnp.einsum("bthk,bhlkv->bthlv", qd, s_in[:, :, lo:])
    o = o + jnp.einsum("bthl,bthlv->bthv", lam[..., lo:], r)
  else:
    o = o + _initial_read(q, G, lam, s_in, here, p, first)
  return (o, context_lib.replicate(s_end, axis_name),
          context_lib.replicate(maps[1][-1], axis_name))


# ------------------------------------------------------------------ the core op


def _check_state(name, state, b, h, levels, dk, dv, step):
  if not isinstance(state, (tuple, list)) or len(state) != 2:
    raise ValueError(f"{name} must be a tuple (S [B, H, L, K, V], position [B]), got "
                     f"{type(state).__name__}"
                     + (f" of length {len(state)}" if isinstance(state, (tuple, list)) else "")
                     + ".")
  common.check_state_parts(name, ((0, state[0], (b, h, levels, dk, dv), "S, [B, H, L, K, V]"),
                                  (1, state[1], (b,), "position, [B]")), step=step)
  pos = common.concrete(state[1])
  if pos is not None and not (pos.size == 0 or (pos.min() >= 0 and (pos == pos.round()).all())):
    raise ValueError(f"{name}[1] (position) must hold non-negative integers, got {pos}.")


def _check_levels(level_weights, b, t, h) -> int:
  common.check_float("level_weights", level_weights)
  common.check_shape("level_weights", level_weights, (b, t, h, None),
                     "[B, T, H, L], one weight per level")
  levels = level_weights.shape[-1]
  if levels < 1:
    raise ValueError(f"level_weights must have L >= 1 levels (its last axis), got {levels}.")
  return levels


def loglinear_decay_attention(q: Array, k: Array, v: Array, log_decay: Array | None,
                              level_weights: Array, *, scale: float | None = None,
                              form: str = "chunk", chunk_size: int = 64,
                              initial_state: tuple[Array, Array] | None = None,
                              return_state: bool = False, segment_ids: Array | None = None,
                              implementation: str | None = None,
                              context: SeqContext | None = None):
  """Log-linear attention with a diagonal decay (see the module doc).

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    log_decay: ``[B, T, H]`` (per head) or ``[B, T, H, K]`` (per key channel),
      ``<= 0`` (``-inf`` allowed; the sign is checked for concrete values), or
      ``None`` (no decay: log-linear linear attention).
    level_weights: ``[B, T, H, L]`` weights ``lambda_t^(l)``, ``L >= 1``.
    scale: ``None`` means ``K ** -0.5``.
    form: ``"chunk"`` (default), ``"parallel"`` or ``"recurrent"``.
    chunk_size: chunk length of the chunk form (rounded down to a power of two
      without ``segment_ids`` and ``initial_state``; see the module doc).
    initial_state: optional ``(S [B, H, L, K, V], position [B])`` (the module
      doc's layout); the sequence continues at ``position``.
    return_state: also return the final state.
    segment_ids: optional ``[B, T]`` ints; each segment starts at position 0
      with empty levels (``initial_state`` reaches the first segment only).
    implementation: ``None`` or ``"xla"``; ``"pallas"`` raises: the chunk
      form resets the engine's state at every level's block boundaries, which
      the chunk kernel does not take.
    context: None, or a :class:`~linear_attention.ops.context.SeqContext`: the
      sequence split over a mesh axis (see "Context parallelism" in the module
      doc); the same result up to rounding.

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, (S, position))``
    for the last segment, float32.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> lw = jax.nn.softmax(jax.random.normal(jax.random.key(2), (1, 8, 2, 4)), -1)  # L = 4 levels
    >>> log_a = jax.nn.log_sigmoid(jax.random.normal(jax.random.key(1), (1, 8, 2)))  # per head
    >>> o = ops.loglinear_decay_attention(q, k, v, log_a, lw)
    >>> o.shape
    (1, 8, 2, 4)
    >>> bool(jnp.allclose(o, ops.loglinear_decay_attention(q, k, v, log_a, lw, form="recurrent"),
    ...                   atol=1e-5))
    True
  """
  b, t, h, dk, dv = common.check_qkv(q, k, v)
  common.check_log_decay(log_decay, b, t, h, dk)
  levels = _check_levels(level_weights, b, t, h)
  common.check_sequence_args(form, chunk_size, segment_ids, b, t)
  common.check_choice("implementation", implementation, (None, "xla", "pallas"))
  if implementation == "pallas":
    raise ValueError("implementation='pallas' is not available for log-linear attention: its "
                     "chunk form resets the engine's state at every level's block boundaries, "
                     "which the chunk kernel does not take; use None or 'xla'.")
  if initial_state is not None:
    _check_state("initial_state", initial_state, b, h, levels, dk, dv, step=False)
  acc = common.acc_dtype(q.dtype)
  if log_decay is None:
    log_decay = jnp.zeros((b, t, h), acc)
  if initial_state is None:
    s0, pos0 = jnp.zeros((b, h, levels, dk, dv), acc), jnp.zeros((b,), jnp.int32)
  else:
    s0, pos0 = initial_state[0].astype(acc), jnp.round(initial_state[1]).astype(jnp.int32)
  scale = common.resolve_scale(scale, dk)
  context_lib.check_context(context)
  run = _forward
  if context is not None:
    context.check(b, t)
    run = functools.partial(_sharded, context=context)
  o, (state, pos) = run(
      q.astype(acc) * scale, k.astype(acc), v.astype(acc), log_decay.astype(acc),
      level_weights.astype(acc), s0, pos0, segment_ids, form=form, chunk_size=chunk_size,
      has_initial=initial_state is not None, implementation=implementation)
  o = o.astype(q.dtype)
  return (o, (state, pos.astype(jnp.float32))) if return_state else o


def loglinear_decay_step(state: tuple[Array, Array], q: Array, k: Array, v: Array,
                         log_decay: Array | None, level_weights: Array, *,
                         scale: float | None = None):
  """One decoding step of :func:`loglinear_decay_attention`.

  Args:
    state: ``(S [B, H, L, K, V], position [B])`` float32;
    q, k: ``[B, H, K]``; v: ``[B, H, V]``; log_decay: ``[B, H]`` or
      ``[B, H, K]`` (``<= 0``) or ``None``;
    level_weights: ``[B, H, L]``; scale: ``None`` means ``K ** -0.5``.

  Returns:
    ``(o, new_state)``: ``o`` ``[B, H, V]`` in the dtype of ``q``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> lw = jax.nn.softmax(jax.random.normal(jax.random.key(2), (1, 8, 2, 4)), -1)  # L = 4 levels
    >>> log_a = jax.nn.log_sigmoid(jax.random.normal(jax.random.key(1), (1, 8, 2)))
    >>> _, state = ops.loglinear_decay_attention(q[:, :7], k[:, :7], v[:, :7], log_a[:, :7],
    ...                                          lw[:, :7], return_state=True)
    >>> o, state = ops.loglinear_decay_step(state, q[:, 7], k[:, 7], v[:, 7], log_a[:, 7], lw[:, 7])
    >>> o.shape, state[0].shape  # levels [B, H, L, K, V]
    ((1, 2, 4), (1, 2, 4, 4, 4))
    >>> bool(jnp.allclose(o, ops.loglinear_decay_attention(q, k, v, log_a, lw)[:, 7], atol=1e-5))
    True
  """
  common.check_step_state_first(state, "(S [B, H, L, K, V], position [B])", 5, 1)
  b, h, dk, dv = common.check_step_qkv(q, k, v)
  common.check_log_decay(log_decay, b, h, dk)
  if log_decay is None:
    log_decay = jnp.zeros((b, h), jnp.float32)
  common.check_float("level_weights", level_weights)
  common.check_shape("level_weights", level_weights, (b, h, None), "[B, H, L]")
  levels = level_weights.shape[-1]
  _check_state("state", state, b, h, levels, dk, dv, step=True)
  acc = state[0].dtype
  scale = common.resolve_scale(scale, dk)
  g = common.floor_log_decay(log_decay.astype(acc))
  o, s, pos = _update(state[0], jnp.round(state[1]).astype(jnp.int32), q.astype(acc) * scale,
                      k.astype(acc), v.astype(acc), g, level_weights.astype(acc))
  return o.astype(q.dtype), (s, pos.astype(state[1].dtype))


def init_loglinear_state(batch: int, heads: int, levels: int, key_dim: int, value_dim: int):
  """A fresh state ``(S [B, H, L, K, V], position [B])``: float32 zeros.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> S, position = ops.init_loglinear_state(1, 2, 4, 3, 5)
    >>> S.shape, position.shape  # [B, H, L, K, V], [B]
    ((1, 2, 4, 3, 5), (1,))
  """
  for name, x in (("batch", batch), ("heads", heads), ("levels", levels),
                  ("key_dim", key_dim), ("value_dim", value_dim)):
    common.check_positive_int(name, x)
  return (jnp.zeros((batch, heads, levels, key_dim, value_dim), jnp.float32),
          jnp.zeros((batch,), jnp.float32))
