"""The diagonal-decay linear-attention engine.

One recurrence over a matrix state ``S`` of shape ``[K, V]`` per batch row and
head::

    S_t = exp(log_decay_t) * S_{t-1} + k_t v_t^T        o_t = scale * S_t^T q_t

``log_decay`` is absent (plain linear attention), a scalar per head and step
(``[B, T, H]``: RetNet, Mamba-2) or a vector over key channels
(``[B, T, H, K]``: GLA, HGRN2, RWKV-6). The decay multiplies the old state
before ``k_t v_t^T`` is added, and the output is read after the update.

Forms (all agree; the tests prove it):

* ``parallel``: the masked ``T x T`` form, quadratic, the readable reference.
* ``chunk``: chunkwise parallel. Inside a chunk, masked matmuls; between
  chunks, the state is carried by a ``lax.scan``. Linear in ``T``, the default.
* ``recurrent``: ``lax.scan`` over tokens through :func:`decay_linear_attention_step`.

Numerics: every decay factor is ``exp`` of a non-positive number. Cumulative
log decays are taken inside a chunk and differenced against a reference point
that lies between the two positions they connect, so strong decays
(``log_decay`` down to -20 per step) underflow to exact zeros instead of
overflowing. Per-channel decays split a chunk into sub-chunks: pairs in
different sub-chunks use the sub-chunk boundary as the reference (two
matmuls), pairs in the same sub-chunk use the exact pairwise difference.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from linear_attention.kernels import chunk_decay as kernel
from linear_attention.kernels import dispatch
from linear_attention.ops import common

Array = jax.Array

_SUBCHUNK = 16
# Chunks per block of the chunk form's outer scan (see _chunk).
_BLOCK_CHUNKS = 16


def _check_inputs(q, k, v, log_decay, form, chunk_size, initial_state, segment_ids):
  b, t, h, dk, dv = common.check_qkv(q, k, v)
  common.check_log_decay(log_decay, b, t, h, dk)
  common.check_sequence_args(form, chunk_size, segment_ids, b, t, initial_state, (b, h, dk, dv))
  return b, t, h, dk, dv


def decay_linear_attention(
    q: Array,
    k: Array,
    v: Array,
    log_decay: Array | None = None,
    *,
    scale: float | None = None,
    form: str = "chunk",
    chunk_size: int = 64,
    initial_state: Array | None = None,
    return_state: bool = False,
    segment_ids: Array | None = None,
    implementation: str | None = None,
):
  """Linear attention with a diagonal decay of the state.

  ``S_t = exp(log_decay_t) * S_{t-1} + k_t v_t^T``, ``o_t = scale * S_t^T q_t``.

  Args:
    q: ``[B, T, H, K]`` queries.
    k: ``[B, T, H, K]`` keys.
    v: ``[B, T, H, V]`` values.
    log_decay: None (no decay), ``[B, T, H]`` (scalar per head and step) or
      ``[B, T, H, K]`` (per key channel); values ``<= 0``, ``-inf`` included
      (a hard reset). The sign is checked only for concrete values: under
      ``jit``/``grad``/``vmap`` it is not (see
      :func:`~linear_attention.ops.common.check_log_decay`).
    scale: output scale; ``None`` means ``K ** -0.5``.
    form: ``"chunk"`` (default, linear in T), ``"recurrent"`` or ``"parallel"``.
    chunk_size: chunk length of the chunk form (any ``T`` works: padded inside).
    initial_state: optional ``[B, H, K, V]`` state before the first token.
    return_state: also return the final state.
    segment_ids: optional ``[B, T]`` ints packing several sequences per row; the
      state is reset to zero where the id changes. ``initial_state`` applies to
      the first segment of each row; the returned state is that of the last.
    implementation: ``None`` (the Pallas chunk kernel on a backend listed in
      ``kernels.dispatch.PALLAS_DEFAULT_BACKENDS`` -- none yet -- when it
      supports the arguments, XLA otherwise and always on CPU), ``"xla"``, or
      ``"pallas"`` (:mod:`linear_attention.kernels.chunk_decay`; on CPU it
      runs in interpret mode: exact but slow). The kernel implements
      ``form="chunk"`` with its own block sizes (``chunk_size`` is then
      unused); with ``segment_ids``, another form or a dtype other than
      float32/bfloat16/float16, ``"pallas"`` raises a ``ValueError``.

  Returns:
    ``o`` of shape ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)``
    with ``state`` ``[B, H, K, V]`` in float32.
  """
  _, t, _, dk, _ = _check_inputs(q, k, v, log_decay, form, chunk_size, initial_state, segment_ids)
  unsupported = kernel.unsupported_arguments(q, log_decay, segment_ids)
  if form != "chunk":
    unsupported["form"] = f"{form!r} (the kernel is the chunk form)"
  if dispatch.resolve_implementation(implementation, unsupported):
    return kernel.chunk_decay_attention(q, k, v, log_decay, scale=scale,
                                        initial_state=initial_state, return_state=return_state)
  o, state = _forward(q, k, v, log_decay, initial_state, segment_ids,
                      scale=common.resolve_scale(scale, dk), form=form,
                      chunk_size=min(chunk_size, t))
  return (o, state) if return_state else o


@functools.partial(jax.jit, static_argnames=("scale", "form", "chunk_size"))
def _forward(q, k, v, log_decay, initial_state, segment_ids, *, scale, form, chunk_size):
  """The checked entry point's body, compiled once per shape and static config."""
  acc = common.acc_dtype(q.dtype)
  # Work in [B, H, T, *]: heads become a batch axis of every matmul.
  qh, kh, vh = (jnp.swapaxes(x, 1, 2).astype(acc) for x in (q, k, v))
  qh = qh * scale
  g = None if log_decay is None else jnp.swapaxes(log_decay, 1, 2).astype(acc)
  g = common.floor_log_decay(g)  # -inf (a hard reset) would give inf - inf in the cumsums
  seg = None if segment_ids is None else common.segment_index(segment_ids)
  s0 = None if initial_state is None else initial_state.astype(acc)

  if form == "recurrent":
    o, state = _recurrent(qh, kh, vh, g, s0, seg)
  elif form == "parallel":
    o, state = _parallel(qh, kh, vh, g, s0, seg)
  else:
    o, state = _chunk(qh, kh, vh, g, s0, seg, chunk_size)
  return jnp.swapaxes(o, 1, 2).astype(q.dtype), state


def decay_linear_attention_step(
    q: Array,
    k: Array,
    v: Array,
    state: Array,
    log_decay: Array | None = None,
    *,
    scale: float | None = None,
):
  """One token of the recurrence: decay, add ``k v^T``, read with ``q``.

  Args:
    q, k: ``[B, H, K]``; v: ``[B, H, V]``; state: ``[B, H, K, V]`` (float32).
    log_decay: None, ``[B, H]`` or ``[B, H, K]``, values ``<= 0`` (sign
      checked for concrete values only, as in :func:`decay_linear_attention`).
    scale: output scale; ``None`` means ``K ** -0.5``.

  The same dtype, shape and sign checks as the sequence op: ``q, k, v``
  floating with one dtype, ``state`` float32 (or float64).

  Returns:
    ``(o, new_state)``: ``o`` ``[B, H, V]`` in the dtype of ``q``, the new
    state ``[B, H, K, V]`` in the state's dtype.
  """
  b, h, dk, dv = common.check_step_qkv(q, k, v)
  common.check_step_state("state", state, (b, h, dk, dv), "[B, H, K, V]")
  common.check_log_decay(log_decay, b, h, dk)
  scale = common.resolve_scale(scale, dk)
  acc = state.dtype
  o, new_state = _step(q.astype(acc) * scale, k.astype(acc), v.astype(acc),
                       None if log_decay is None else log_decay.astype(acc), state)
  return o.astype(q.dtype), new_state


def _step(q, k, v, g, state):
  """Unchecked step on ``[B, H, *]`` arrays; ``q`` already scaled."""
  if g is not None:
    decay = jnp.exp(g)
    state = state * (decay[..., None, None] if g.ndim == q.ndim - 1 else decay[..., None])
  state = state + k[..., :, None] * v[..., None, :]
  return jnp.einsum("bhk,bhkv->bhv", q, state), state


def _recurrent(qh, kh, vh, g, s0, seg):
  """Token-by-token ``lax.scan``; inputs ``[B, H, T, *]``."""
  t = qh.shape[2]
  state = common.zero_state(qh, vh) if s0 is None else s0
  starts = (jnp.zeros(qh.shape[:1] + (t,), bool) if seg is None
            else jnp.concatenate([jnp.zeros_like(seg[:, :1]), jnp.diff(seg, axis=1)], 1) > 0)
  move = lambda x: jnp.moveaxis(x, 2, 0)
  xs = (move(qh), move(kh), move(vh), None if g is None else move(g), starts.T)

  def body(s, x):
    q_t, k_t, v_t, g_t, start = x
    s = jnp.where(start[:, None, None, None], 0.0, s)
    o_t, s = _step(q_t, k_t, v_t, g_t, s)
    return s, o_t

  state, o = common.remat_scan(body, state, xs)
  return jnp.moveaxis(o, 0, 2), state


def _same_segment(seg_q, seg_k):
  """``[..., Tq, Tk]`` bool: query and key in one segment (``seg`` is monotone)."""
  return seg_q[..., :, None] == seg_k[..., None, :]


def _parallel(qh, kh, vh, g, s0, seg):
  """Masked ``T x T`` form; inputs ``[B, H, T, *]``."""
  t = qh.shape[2]
  causal = jnp.tril(jnp.ones((t, t), bool))
  mask = causal if seg is None else causal & _same_segment(seg, seg)[:, None]
  if g is None:
    scores = jnp.einsum("bhik,bhjk->bhij", qh, kh)
  else:
    gc = jnp.cumsum(g, axis=2)
    if g.ndim == 3:
      diff = gc[..., :, None] - gc[..., None, :]
      scores = jnp.einsum("bhik,bhjk->bhij", qh, kh) * jnp.exp(jnp.where(mask, diff, -jnp.inf))
    else:
      diff = gc[:, :, :, None, :] - gc[:, :, None, :, :]
      decay = jnp.exp(jnp.where(mask[..., None], diff, -jnp.inf))
      scores = jnp.einsum("bhik,bhjk,bhijk->bhij", qh, kh, decay)
  scores = jnp.where(mask, scores, 0.0)
  o = jnp.einsum("bhij,bhjv->bhiv", scores, vh)

  # The final state: every key decayed to the last position, same segment only.
  decay_to_end = 1.0 if g is None else jnp.exp(_expand(gc[:, :, -1:] - gc, kh))
  keep = 1.0 if seg is None else (seg == seg[:, -1:])[:, None, :, None]
  state = jnp.einsum("bhjk,bhjv->bhkv", kh * decay_to_end * keep, vh)
  if s0 is not None:
    first = 1.0 if seg is None else (seg == 0)[:, None, :, None]
    q_dec = qh if g is None else qh * jnp.exp(_expand(gc, qh))
    o = o + jnp.einsum("bhik,bhkv->bhiv", q_dec * first, s0)
    total = 1.0 if g is None else jnp.exp(_expand(gc[:, :, -1], s0[..., 0]))[..., None]
    carry = 1.0 if seg is None else (seg[:, -1] == 0)[:, None, None, None]
    state = state + s0 * total * carry
  return o, state


def _expand(g, like):
  """Broadcasts a scalar decay ``[..., T]`` against ``like [..., T, K]``; vectors pass."""
  return g[..., None] if g.ndim == like.ndim - 1 else g


def _subchunk_size(c: int) -> int:
  """The largest divisor of the chunk length that is at most ``_SUBCHUNK``."""
  return max(d for d in range(1, min(c, _SUBCHUNK) + 1) if c % d == 0)


def _intra_scores_vector(q, k, gc):
  """Causal in-chunk scores ``sum_k q_ik k_jk exp(G_ik - G_jk)`` for ``j <= i``.

  Args: ``q, k, gc``: ``[..., C, K]`` with ``gc`` the in-chunk cumulative log
  decay. Returns ``[..., C, C]`` (zero above the diagonal).
  """
  c, dk = q.shape[-2:]
  s = _subchunk_size(c)
  n = c // s
  lead = q.shape[:-2]
  qs, ks, gs = (x.reshape(lead + (n, s, dk)) for x in (q, k, gc))

  # Pairs in different sub-chunks I > J factor through the sub-chunk edges:
  # exp(G_i - G_j) = exp(G_i - R_I) exp(R_I - E_J) exp(E_J - G_j), where R_I
  # is the log decay just before sub-chunk I and E_J that at the end of J.
  # All three exponents are <= 0 because R_I comes at or after E_J.
  ends = gs[..., -1, :]  # [..., n, K]
  ref = jnp.concatenate([jnp.zeros_like(ends[..., :1, :]), ends[..., :-1, :]], axis=-2)
  q_off = qs * jnp.exp(gs - ref[..., :, None, :])
  k_off = ks * jnp.exp(ends[..., :, None, :] - gs)
  below = jnp.tril(jnp.ones((n, n), bool), -1)
  bridge = jnp.exp(jnp.where(below[:, :, None], ref[..., :, None, :] - ends[..., None, :, :],
                             -jnp.inf))  # [..., I, J, K]
  q_bridged = q_off[..., :, None, :, :] * bridge[..., :, :, None, :]  # [..., I, J, i, K]
  off = jnp.einsum("...IJik,...Jjk->...IiJj", q_bridged, k_off).reshape(lead + (c, c))

  # Pairs inside one sub-chunk: exact pairwise differences, masked before exp.
  tri = jnp.tril(jnp.ones((s, s), bool))
  diff = jnp.where(tri[:, :, None], gs[..., :, None, :] - gs[..., None, :, :], -jnp.inf)
  diag = jnp.einsum("...nijk,...njk->...nij", qs[..., :, None, :] * jnp.exp(diff), ks)
  eye = jnp.eye(n, dtype=diag.dtype)
  diag = (diag[..., :, :, None, :] * eye[:, None, :, None]).reshape(lead + (c, c))
  return off + diag


def _chunk(qh, kh, vh, g, s0, seg, chunk_size, block_chunks=_BLOCK_CHUNKS):
  """Chunkwise-parallel form; inputs ``[B, H, T, *]``.

  Long sequences go through in blocks of ``block_chunks`` chunks, one block
  per ``lax.scan`` step with the state carried: the work per token stays the
  same at any length and each block's working set stays in cache.
  """
  t, c = qh.shape[2], chunk_size
  block = c * block_chunks
  if t <= block:
    return _chunk_block(qh, kh, vh, g, s0, seg, c, None)
  pad = lambda x: common.pad_axis(x, block, axis=2)
  n = pad(qh).shape[2] // block
  split = lambda x: None if x is None else jnp.moveaxis(
      pad(x).reshape(x.shape[:2] + (n, block) + x.shape[3:]), 2, 0)
  segb = None
  if seg is not None:
    segp = common.pad_segment_ids(seg, block).reshape(seg.shape[0], n, block)
    prev = jnp.concatenate([segp[:, :1, 0], segp[:, :-1, -1]], axis=1)  # [B, n]
    segb = (jnp.moveaxis(segp, 1, 0), prev.T)

  def body(state, x):
    q_b, k_b, v_b, g_b, seg_b = x
    o_b, state = _chunk_block(q_b, k_b, v_b, g_b, state, None if seg_b is None else seg_b[0], c,
                              None if seg_b is None else seg_b[1])
    return state, o_b

  init = common.zero_state(qh, vh) if s0 is None else s0
  state, o = lax.scan(body, init, (split(qh), split(kh), split(vh), split(g), segb))
  o = jnp.moveaxis(o, 0, 2)
  return o.reshape(o.shape[:2] + (n * block,) + o.shape[4:])[:, :, :t], state


def _chunk_block(qh, kh, vh, g, s0, seg, chunk_size, seg_prev):
  """One block of the chunk form; ``seg_prev [B]`` is the segment index of the
  token before the block (None: the block starts a row)."""
  b, h, t, dk = qh.shape
  dv = vh.shape[-1]
  c = chunk_size
  pad = lambda x: common.pad_axis(x, c, axis=2)
  qh, kh, vh = pad(qh), pad(kh), pad(vh)
  n = qh.shape[2] // c
  split = lambda x: x.reshape(x.shape[:2] + (n, c) + x.shape[3:])
  qc, kc, vc = split(qh), split(kh), split(vh)  # [B, H, N, C, *]

  causal = jnp.tril(jnp.ones((c, c), bool))
  if seg is not None:
    segp = common.pad_segment_ids(seg, c).reshape(b, 1, n, c)
    first = segp[:, :, :1, 0] if seg_prev is None else seg_prev[:, None, None]
    prev_end = jnp.concatenate([first, segp[:, :, :-1, -1]], axis=2)  # [B,1,N]
    mask = causal & _same_segment(segp, segp)
    sees_state = (segp == prev_end[..., None])[..., None]  # [B,1,N,C,1]
    to_end = (segp == segp[..., -1:])[..., None]
    carries = (segp[..., -1] == prev_end)  # [B,1,N]
  else:
    mask, sees_state, to_end, carries = causal, 1.0, 1.0, None

  if g is None:
    scores = jnp.einsum("bhnik,bhnjk->bhnij", qc, kc)
    q_in, k_out, chunk_decay = qc, kc, None
  else:
    gc = jnp.cumsum(split(pad(g)), axis=3)  # in-chunk cumulative, [B,H,N,C(,K)]
    last = gc[:, :, :, -1]
    if g.ndim == 3:
      diff = jnp.where(mask, gc[..., :, None] - gc[..., None, :], -jnp.inf)
      scores = jnp.einsum("bhnik,bhnjk->bhnij", qc, kc) * jnp.exp(diff)
    else:
      scores = _intra_scores_vector(qc, kc, gc)
    q_in = qc * jnp.exp(_expand(gc, qc))
    k_out = kc * jnp.exp(_expand(last[:, :, :, None] - gc, kc))
    chunk_decay = jnp.exp(last)  # [B,H,N] or [B,H,N,K]
  scores = jnp.where(mask, scores, 0.0)
  o = jnp.einsum("bhnij,bhnjv->bhniv", scores, vc)

  # Each chunk's own contribution to the state at its end, then a scan that
  # passes the state across chunks (elementwise work only).
  local = jnp.einsum("bhnjk,bhnjv->bhnkv", k_out * to_end, vc)
  if chunk_decay is None:
    chunk_decay = jnp.ones((b, h, n), qc.dtype)
  if carries is not None:
    chunk_decay = chunk_decay * _expand(carries, chunk_decay).astype(qc.dtype)
  decay_kv = chunk_decay[..., None, None] if chunk_decay.ndim == 3 else chunk_decay[..., None]

  def body(state, x):
    a, loc = x
    return a * state + loc, state

  init = common.zero_state(qh, vh) if s0 is None else s0
  state, entering = lax.scan(
      body, init, (jnp.moveaxis(decay_kv, 2, 0), jnp.moveaxis(local, 2, 0)))
  entering = jnp.moveaxis(entering, 0, 2)  # [B,H,N,K,V]: the state before each chunk
  o = o + jnp.einsum("bhnik,bhnkv->bhniv", q_in * sees_state, entering)
  o = o.reshape(b, h, n * c, dv)[:, :, :t]
  return o, state
