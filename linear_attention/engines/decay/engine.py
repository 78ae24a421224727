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

from linear_attention.engines.decay import pallas as kernel
from linear_attention.engines import dispatch
from linear_attention import common
from linear_attention.engines import context as context_lib
from linear_attention.engines.context import SeqContext
from linear_attention.engines import chunks

Array = jax.Array

# Chunks per block of the chunk form's outer scan (see _chunk).
_BLOCK_CHUNKS = chunks.block_chunks("decay")


# ``form="auto"``: ``(values form, gradient form)`` per backend; none listed, so the chunk form
# everywhere (the form the decay kernel implements and the training default).
DEFAULT_FORMS: dict[str, tuple[str, str]] = {}


def _check_inputs(q, k, v, log_decay, form, chunk_size, initial_state, segment_ids):
  b, t, h, dk, dv = common.check_qkv(q, k, v)
  common.check_log_decay(log_decay, b, t, h, dk)
  common.check_sequence_args(form, chunk_size, segment_ids, b, t, initial_state, (b, h, dk, dv),
                             auto=True)
  return b, t, h, dk, dv


def decay_linear_attention(
    q: Array,
    k: Array,
    v: Array,
    log_decay: Array | None = None,
    *,
    scale: float | None = None,
    form: str = "auto",
    chunk_size: int | None = None,
    initial_state: Array | None = None,
    return_state: bool = False,
    segment_ids: Array | None = None,
    implementation: str | None = None,
    context: SeqContext | None = None,
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
      :func:`~linear_attention.common.check_log_decay`).
    scale: output scale; ``None`` means ``K ** -0.5``.
    form: ``"auto"`` (default: :data:`DEFAULT_FORMS`, the chunk form on every backend),
      ``"chunk"`` (linear in T), ``"recurrent"`` or ``"parallel"``.
    chunk_size: chunk length of the chunk form (any ``T`` works: padded inside); None: the
      backend's default (:func:`~linear_attention.engines.dispatch.resolve_chunk_size`, 64).
    initial_state: optional ``[B, H, K, V]`` state before the first token.
    return_state: also return the final state.
    segment_ids: optional ``[B, T]`` ints packing several sequences per row; the
      state is reset to zero where the id changes. ``initial_state`` applies to
      the first segment of each row; the returned state is that of the last.
    implementation: ``None`` (the Pallas chunk kernel on a backend listed in
      ``engines.dispatch.PALLAS_DEFAULT_BACKENDS`` -- none yet -- when it
      supports the arguments, XLA otherwise and always on CPU), ``"xla"``, or
      ``"pallas"`` (:mod:`linear_attention.engines.decay.pallas`; on CPU it
      runs in interpret mode: exact but slow). The kernel implements
      ``form="chunk"`` with its own block sizes (``chunk_size`` is then
      unused); with ``segment_ids``, another form or a dtype other than
      float32/bfloat16/float16, ``"pallas"`` raises a ``ValueError``.
    context: None, or a :class:`~linear_attention.ops.context.SeqContext` to
      run with the sequence split over a mesh axis (see
      :func:`_sequence_parallel`); the same result up to rounding.

  Returns:
    ``o`` of shape ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)``
    with ``state`` ``[B, H, K, V]`` in float32.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.PRNGKey(0), (3, 1, 10, 2, 4))
    >>> log_decay = jnp.full((1, 10, 2), -0.1)  # one decay per head and step
    >>> o, state = ops.decay_linear_attention(q, k, v, log_decay, return_state=True)
    >>> o.shape, state.shape
    ((1, 10, 2, 4), (1, 2, 4, 4))
  """
  context_lib.check_context(context)
  chunk_size = dispatch.resolve_chunk_size(chunk_size, "decay")
  b, t, _, dk, _ = _check_inputs(q, k, v, log_decay, form, chunk_size, initial_state, segment_ids)
  form, _ = common.resolve_auto_form(form, DEFAULT_FORMS)  # one form both ways: no pairing
  if context is not None:
    context.check(b, t)
    context_lib.refuse_pallas(implementation)
    return _sequence_parallel(q, k, v, log_decay, initial_state, segment_ids, context=context,
                              scale=common.resolve_scale(scale, dk), form=form,
                              chunk_size=chunk_size, return_state=return_state,
                              implementation=implementation)
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
  seg = None if segment_ids is None else common.segment_index(segment_ids)
  s0 = None if initial_state is None else initial_state.astype(acc)
  if form == "chunk":
    # zeros_like of the inputs (not jnp.zeros): inside shard_map it varies as they do.
    s0 = jnp.zeros_like(q[:, 0, :, :, None] * v[:, 0, :, None, :], acc) if s0 is None else s0
    return _chunk(q, k, v, log_decay, s0, seg, scale, chunk_size)
  # Work in [B, H, T, *]: heads become a batch axis of every matmul.
  qh, kh, vh = (jnp.swapaxes(x, 1, 2).astype(acc) for x in (q, k, v))
  qh = qh * scale
  g = None if log_decay is None else jnp.swapaxes(log_decay, 1, 2).astype(acc)
  g = common.floor_log_decay(g)  # -inf (a hard reset) would give inf - inf in the cumsums
  if form == "recurrent":
    o, state = _recurrent(qh, kh, vh, g, s0, seg)
  else:
    o, state = _parallel(qh, kh, vh, g, s0, seg)
  return jnp.swapaxes(o, 1, 2).astype(q.dtype), state


def decay_linear_attention_step(
    state: Array,
    q: Array,
    k: Array,
    v: Array,
    log_decay: Array | None = None,
    *,
    scale: float | None = None,
):
  """One token of the recurrence: decay, add ``k v^T``, read with ``q``.

  Args:
    state: ``[B, H, K, V]`` (float32).
    q, k: ``[B, H, K]``; v: ``[B, H, V]``.
    log_decay: None, ``[B, H]`` or ``[B, H, K]``, values ``<= 0`` (sign
      checked for concrete values only, as in :func:`decay_linear_attention`).
    scale: output scale; ``None`` means ``K ** -0.5``.

  The same dtype, shape and sign checks as the sequence op: ``q, k, v``
  floating with one dtype, ``state`` float32 (or float64).

  Returns:
    ``(o, new_state)``: ``o`` ``[B, H, V]`` in the dtype of ``q``, the new
    state ``[B, H, K, V]`` in the state's dtype.

  Examples:
    >>> import jax.numpy as jnp
    >>> from linear_attention import ops
    >>> state = jnp.zeros((1, 2, 4, 4))
    >>> q = k = v = jnp.ones((1, 2, 4))
    >>> o, state = ops.decay_linear_attention_step(state, q, k, v, jnp.full((1, 2), -0.1))
    >>> o.shape
    (1, 2, 4)
  """
  common.check_step_state_first(state, "[B, H, K, V]", 4)
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


def _parallel(qh, kh, vh, g, s0, seg):
  """Masked ``T x T`` form; inputs ``[B, H, T, *]``."""
  t = qh.shape[2]
  seg3 = None if seg is None else seg[:, None]  # [B, 1, T]
  mask = chunks.pair_masks(seg3, seg3, t)[0]
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


def _chunk(q, k, v, g, s0, seg, scale, chunk_size):
  """Chunkwise-parallel form on ``[B, T, H, *]`` inputs; returns ``(o [B, T, H, V], state)``.

  The sequence goes through in blocks of ``_BLOCK_CHUNKS`` chunks, one block per
  ``lax.scan`` step with the state carried: the work per token stays the same at any length
  and each block's working set stays in cache. Each block is sliced from the inputs and
  transposed to ``[B, H, L, *]`` (heads as a batch axis of every matmul) inside the loop, and
  its output written back in place: at long ``T`` whole-array transposes and copies, not the
  matmuls, bounded the time on a CPU (about 5 GB/s out of cache here). The gradient is
  :func:`_chunk_bwd`.
  """
  o, state, _ = _chunk_vjp(q, k, v, g, s0, seg, scale, chunk_size)
  return o, state


def _blocks(t, chunk_size):
  """``(block, n_full, tail)``: tokens per block, full blocks, and the length of the last,
  shorter block (0: none)."""
  block = chunk_size * _BLOCK_CHUNKS
  return (block,) + divmod(t, block)


def _over_blocks(fn, carry, bufs, t, chunk_size, reverse=False):
  """Runs ``fn(carry, start, size) -> (carry, ys, extra)`` over the blocks of ``[0, t)``.

  Each ``ys[i]`` (``[B, size, ...]``) is written into ``bufs[i]`` at ``start`` along axis 1;
  the ``extra`` of every block are stacked in block order. ``reverse`` runs from the last
  block. Returns ``(carry, bufs, extras)``.
  """
  block, n_full, tail = _blocks(t, chunk_size)
  if n_full + bool(tail) == 1:  # one block: its outputs are the buffers
    carry, ys, extra = fn(carry, 0, t)
    return carry, ys, jax.tree_util.tree_map(lambda x: x[None], extra)

  def put(bufs, ys, start):
    return tuple(lax.dynamic_update_slice_in_dim(b, y, start, axis=1) for b, y in zip(bufs, ys))

  def step(state, i):
    carry, bufs = state
    carry, ys, extra = fn(carry, i * block, block)
    return (carry, put(bufs, ys, i * block)), extra

  def full(carry, bufs):
    (carry, bufs), extras = lax.scan(step, (carry, bufs), jnp.arange(n_full), reverse=reverse)
    return carry, bufs, [extras]

  def last(carry, bufs):
    carry, ys, extra = fn(carry, n_full * block, tail)
    return carry, put(bufs, ys, n_full * block), [jax.tree_util.tree_map(lambda x: x[None], extra)]

  parts = ([last] if tail else []) + ([full] if n_full else [])
  extras = []
  for part in (parts if reverse else parts[::-1]):
    carry, bufs, ex = part(carry, bufs)
    extras = ex + extras if reverse else extras + ex
  extras = jax.tree_util.tree_map(lambda *x: jnp.concatenate(x), *extras)
  return carry, bufs, extras


def _slice(x, start, size):
  """Tokens ``[start, start + size)`` of ``[B, T, ...]`` (None stays None)."""
  return None if x is None else lax.dynamic_slice_in_dim(x, start, size, axis=1)


def _block_segments(seg, start, size):
  """One block's segment indices ``[B, size]`` and that of the token before it ``[B]``."""
  if seg is None:
    return None
  before = lax.dynamic_index_in_dim(seg, jnp.maximum(start - 1, 0), axis=1, keepdims=False)
  return _slice(seg, start, size), before


def _prepare(q, k, v, g, scale):
  """A block in ``[B, L, H, *]`` -> ``[B, H, L, *]`` in the accumulation dtype, ``q`` scaled,
  ``g`` floored (``-inf``, a hard reset, would give ``inf - inf`` in the cumsums)."""
  acc = common.acc_dtype(q.dtype)
  heads_first = lambda x: None if x is None else jnp.swapaxes(x, 1, 2).astype(acc)
  qh, kh, vh, gh = (heads_first(x) for x in (q, k, v, g))
  return qh * scale, kh, vh, common.floor_log_decay(gh)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7))
def _chunk_vjp(q, k, v, g, s0, seg, scale, chunk_size):
  """The blocked chunk form: ``(o, final state, state entering each block)``."""
  def block(state, start, size):
    xs = (_slice(x, start, size) for x in (q, k, v, g))
    parts = _chunk_local(*_prepare(*xs, scale), _block_segments(seg, start, size), chunk_size)
    o_b, new_state, _ = _chunk_carry(parts, state)
    return new_state, (jnp.swapaxes(o_b[:, :, :size], 1, 2).astype(q.dtype),), state

  o = jnp.zeros_like(v, q.dtype)
  state, (o,), entering = _over_blocks(block, s0, (o,), q.shape[1], chunk_size)
  return o, state, entering


def _chunk_fwd(q, k, v, g, s0, seg, scale, chunk_size):
  o, state, entering = _chunk_vjp(q, k, v, g, s0, seg, scale, chunk_size)
  return (o, state, entering), (q, k, v, g, seg, entering)


def _chunk_bwd(scale, chunk_size, res, cts):
  """The chunk form's gradient, block by block from the last.

  Differentiating the forward through its scans stores every chunk's carry and runs the
  scans' transposes step by step (the backward took 3.7x the forward at 4k). Here each
  block recomputes its chunks' states with one scan, runs the states' cotangents back with
  another (``dS_in = a dS_out + q_in^T dO``), and differentiates only the scan-free rest
  (:func:`_prepare`, :func:`_chunk_local` and the read ``q_in S_in``) with ``jax.vjp``.
  """
  q, k, v, g, seg, entering = res
  do, dstate, _ = cts  # the block states are an internal output: no cotangent flows to them
  block_len = _blocks(q.shape[1], chunk_size)[0]

  def block(ds, start, size):
    seg_b = _block_segments(seg, start, size)
    local = lambda q, k, v, g: _chunk_local(*_prepare(q, k, v, g, scale), seg_b, chunk_size)
    parts, vjp = jax.vjp(local, *(_slice(x, start, size) for x in (q, k, v, g)))
    _, q_in, loc, a = parts
    s_b = lax.dynamic_index_in_dim(entering, start // block_len, keepdims=False)
    _, s_in = _scan_chunks(a, loc, s_b)  # the states entering each chunk, recomputed
    do_c = _chunks(jnp.swapaxes(_slice(do, start, size), 1, 2).astype(q_in.dtype), chunk_size)
    dloc = jnp.einsum("bhnik,bhniv->bhnkv", q_in, do_c)
    ds_start, ds_out = _scan_chunks(a, dloc, ds, reverse=True)
    da = jnp.sum(s_in * ds_out, axis=(3, 4) if a.shape[3] == 1 else 4, keepdims=True)
    grads = vjp((do_c, jnp.einsum("bhniv,bhnkv->bhnik", do_c, s_in), ds_out, da))
    return ds_start, tuple(x for x in grads if x is not None), None

  bufs = tuple(jnp.zeros_like(x) for x in (q, k, v, g) if x is not None)
  ds0, grads, _ = _over_blocks(block, dstate, bufs, q.shape[1], chunk_size, reverse=True)
  dq, dk, dv, *dg = grads
  return dq, dk, dv, dg[0] if dg else None, ds0, None


_chunk_vjp.defvjp(_chunk_fwd, _chunk_bwd)


def _chunks(x, c):
  """``[B, H, T, *]`` -> ``[B, H, N, C, *]``, zero-padded."""
  x = common.pad_axis(x, c, axis=2)
  return x.reshape(x.shape[:2] + (x.shape[2] // c, c) + x.shape[3:])


def _scan_chunks(a, loc, init, reverse=False):
  """``S_n = a_n S_{n-1} + loc_n`` over the chunk axis 2; returns ``(last, S before each)``.

  Reversed, it is the cotangents' pass ``D_{n-1} = a_n D_n + loc_n``: ``(D before the
  first chunk, D at the end of each chunk)``.
  """
  def body(s, x):
    a_n, loc_n = x
    return a_n * s + loc_n, s
  move = lambda x: jnp.moveaxis(x, 2, 0)
  last, each = lax.scan(body, init, (move(a), move(loc)), reverse=reverse)
  return last, jnp.moveaxis(each, 0, 2)


def _chunk_local(qh, kh, vh, g, seg, c):
  """Everything of one block that does not need the state, chunk by chunk.

  Args: ``qh, kh, vh`` ``[B, H, L, *]``, ``g`` None / ``[B, H, L]`` / ``[B, H, L, K]``,
  ``seg`` None or ``(seg [B, L], seg_prev [B])`` (the index of the token before the block).
  Returns ``(o_intra [B,H,N,C,V], q_in [B,H,N,C,K], local [B,H,N,K,V], a)``: the in-chunk
  outputs, the queries that read the entering state, each chunk's own state at its end, and
  the factor ``a`` (``[B,H,N,1,1]`` or ``[B,H,N,K,1]``) by which a chunk decays the state it
  receives.
  """
  qc, kc, vc = _chunks(qh, c), _chunks(kh, c), _chunks(vh, c)
  if seg is not None:
    segp, sees_state, to_end, carries = chunks.chunk_segments(seg[0], c, seg[1])
  else:
    segp, sees_state, to_end, carries = None, 1.0, 1.0, None
  mask = chunks.pair_masks(segp, segp, c)[0]

  if g is None:
    scores = jnp.einsum("bhnik,bhnjk->bhnij", qc, kc)
    # ones_like of an input: inside shard_map it varies over the inputs' mesh axes, as the
    # cotangent the gradient gives it does.
    q_in, k_out, a = qc, kc, jnp.ones_like(qc[..., 0, 0])
  else:
    gc = jnp.cumsum(_chunks(g, c), axis=3)  # in-chunk cumulative, [B,H,N,C(,K)]
    last = gc[:, :, :, -1]
    if g.ndim == 3:
      diff = jnp.where(mask, gc[..., :, None] - gc[..., None, :], -jnp.inf)
      scores = jnp.einsum("bhnik,bhnjk->bhnij", qc, kc) * jnp.exp(diff)
    else:
      scores = chunks.intra_scores_vector(qc, kc, gc)
    q_in = qc * jnp.exp(_expand(gc, qc))
    k_out = kc * jnp.exp(_expand(last[:, :, :, None] - gc, kc))
    a = jnp.exp(last)  # [B,H,N] or [B,H,N,K]
  scores = jnp.where(mask, scores, 0.0)
  o_intra = jnp.einsum("bhnij,bhnjv->bhniv", scores, vc)
  local = jnp.einsum("bhnjk,bhnjv->bhnkv", k_out * to_end, vc)
  if carries is not None:
    a = a * _expand(carries, a).astype(a.dtype)
  a = a[..., None, None] if a.ndim == 3 else a[..., None]
  return o_intra, q_in * sees_state, local, a


def _chunk_carry(parts, s0):
  """Carries the state across one block's chunks: ``(o [B,H,L,V], final state, S_in)``
  with ``S_in [B,H,N,K,V]`` the state entering each chunk."""
  o_intra, q_in, local, a = parts
  state, s_in = _scan_chunks(a, local, s0)
  o = o_intra + jnp.einsum("bhnik,bhnkv->bhniv", q_in, s_in)
  return o.reshape(o.shape[:2] + (-1,) + o.shape[4:]), state, s_in


# ------------------------------------------------------------ sequence parallel


def _sequence_parallel(q, k, v, log_decay, initial_state, segment_ids, *, context, scale, form,
                       chunk_size, return_state, implementation):
  """The engine with the sequence split over ``context.axis_name``.

  Per device:

  1. run the engine (``form``) on its slice from a zero state, giving local outputs
     and the slice's final state ``S_j``, plus the slice's total log decay ``G_j``;
  2. ``all_gather`` the ``(G_j, S_j)`` pairs along the axis (one collective) and fold
     them into the state entering this device,
     ``S_in_i = sum_{j<i} exp(sum_{j<m<i} G_m) S_j + exp(sum_{m<i} G_m) S_0``. The
     exponents are sums of non-positive numbers (no differences of large cumulative
     sums), so strong decays underflow to zero, never overflow;
  3. correct the local outputs with one matmul,
     ``o_t += scale * (q_t * exp(G_{<=t})) S_in``, ``G_{<=t}`` the cumulative log decay
     inside the slice. No second pass over the sequence.

  The final state (``return_state``) is the same fold to the end of the last slice;
  each device adds its own term and one ``psum`` makes it identical on every device.
  The gather moves ``P`` states ``[B, H, K, V]`` to every device (``P`` the axis
  size): small next to the activations of a long slice. A slice that starts a new
  segment, or holds a boundary, stops the incoming state, as on one device.
  """
  named = {"q": (q, context.seq_spec), "k": (k, context.seq_spec),
           "v": (v, context.seq_spec), "log_decay": (log_decay, context.seq_spec),
           "initial_state": (initial_state, context.row_spec),
           "segment_ids": (segment_ids, context.seq_spec)}
  out = (context.seq_spec, context.row_spec) if return_state else context.seq_spec
  return context_lib.run_sharded(_local, context, named, out, scale=scale, form=form,
                                 chunk_size=chunk_size, return_state=return_state,
                                 implementation=implementation)


def _varying_zeros(k, v, g, segment_ids, acc) -> Array:
  """A zero ``[B, H, K, V]`` state that varies over the same mesh axes as the inputs.

  A constant zero state is invariant across the mesh, so the chunk scan's carry would
  change type under ``shard_map``'s ``check_vma``. ``zeros_like`` keeps its argument's
  varying axes, and the broadcast sum takes the union of those of every input the
  carry depends on.
  """
  z = (jnp.zeros_like(k[:, 0, :, :, None], acc) + jnp.zeros_like(v[:, 0, :, None, :], acc))
  if g is not None:
    z = z + jnp.zeros_like(_expand(g[:, 0], k[:, 0]), acc)[..., None]
  if segment_ids is not None:
    z = z + jnp.zeros_like(segment_ids[:, 0], acc)[:, None, None, None]
  return z


def _fold_weights(target, g_all, carry_all, n: int):
  """Weights of every source state into the boundary before slice ``target``.

  Sources: ``s = 0`` the initial state, ``s = j + 1`` the final state of slice
  ``j``. A source reaches the boundary through the slices ``s <= m < target``.

  Args:
    target: int (traced or not) in ``[0, n]``; ``n`` means the sequence end.
    g_all: ``[n, B, H, K|1]`` total log decay per slice, or None (no decay).
    carry_all: ``[n, B]`` bool, whether a slice passes its entering state on
      (False where it starts or contains a segment boundary), or None.

  Returns:
    ``[n + 1, B|1, H|1, K|1, 1]`` weights, broadcastable against the states.
  """
  s = jnp.arange(n + 1)[:, None]
  m = jnp.arange(n)[None, :]
  through = (s <= m) & (m < target)  # [n+1, n]
  w = (jnp.arange(n + 1) <= target).astype(jnp.float32)[:, None, None, None]
  if g_all is not None:
    # A masked sum, not a difference of prefix sums: exact and never positive.
    log_w = jnp.sum(jnp.where(through[:, :, None, None, None], g_all[None], 0.0), axis=1)
    w = w.astype(g_all.dtype) * jnp.exp(log_w)
  if carry_all is not None:
    blocked = jnp.any(through[:, :, None] & ~carry_all[None], axis=1)  # [n+1, B]
    w = w * (~blocked).astype(w.dtype)[:, :, None, None]
  return w[..., None]


def _local(q, k, v, log_decay=None, initial_state=None, segment_ids=None, *, axis_name, scale,
           form, chunk_size, return_state, implementation):
  """The per-device body of :func:`_sequence_parallel` on this device's slices."""
  idx = context_lib.axis_index(axis_name)
  acc = common.acc_dtype(q.dtype)
  # -inf (a hard reset) floored as in the engine: its sums must not meet inf - inf.
  g = None if log_decay is None else common.floor_log_decay(log_decay.astype(acc))
  s0 = None if initial_state is None else initial_state.astype(acc)

  # 1. The slice on its own, from a zero state (outputs kept in acc precision).
  o, local = decay_linear_attention(
      q.astype(acc), k.astype(acc), v.astype(acc), g, scale=scale, form=form,
      chunk_size=chunk_size, initial_state=_varying_zeros(k, v, g, segment_ids, acc),
      return_state=True, segment_ids=segment_ids, implementation=implementation)

  # 2. Gather every slice's (total decay, final state) and fold up to this slice.
  g_all = None
  if g is not None:
    g_tot = jnp.sum(g, axis=1)
    g_all = lax.all_gather(g_tot[..., None] if g.ndim == 3 else g_tot, axis_name)
  states = lax.all_gather(local, axis_name)  # [n, B, H, K, V]
  n = states.shape[0]
  carry_all = sees = None
  if segment_ids is not None:
    cont, single, sees = context_lib.device_segments(segment_ids, axis_name, acc)
    carry_all = cont & single
    sees = sees[:, :, None, None]
  w = _fold_weights(idx, g_all, carry_all, n)
  s_in = jnp.sum(w[1:] * states, axis=0)
  if s0 is not None:
    s_in = s_in + w[0] * s0

  # 3. The entering state's contribution: one [T, K] x [K, V] matmul per head.
  q_dec = q.astype(acc) * scale
  if g is not None:
    q_dec = q_dec * jnp.exp(_expand(jnp.cumsum(g, axis=1), q_dec))
  if sees is not None:
    q_dec = q_dec * sees
  o = (o + jnp.einsum("bthk,bhkv->bthv", q_dec, s_in)).astype(q.dtype)
  if not return_state:
    return o

  # The final state: this slice's term (plus the initial state's, once), summed.
  w_end = _fold_weights(n, g_all, carry_all, n)
  own = jnp.take(w_end, idx + 1, axis=0) * local
  if s0 is not None:
    own = own + jnp.where(idx == 0, w_end[0] * s0, 0.0)
  return o, lax.psum(own, axis_name)
