"""The diagonal-plus-low-rank (DPLR) engine, a generalised delta rule.

One recurrence over a matrix state ``S`` of shape ``[K, V]`` per batch row and
head, with a per-channel decay ``D_t = diag(exp(log_decay_t))`` and a rank-one
correction ``a_t b_t^T``::

    S_t = (D_t + a_t b_t^T) S_{t-1} + k_t v_t^T        o_t = scale * S_t^T q_t

``b_t`` reads the old state (``b_t^T S_{t-1}``, a ``[V]`` row) and ``a_t``
writes what it read back, so ``S_t = D_t S_{t-1} + a_t (b_t^T S_{t-1}) + k_t v_t^T``.
The delta rule is ``a = -beta k``, ``b = k`` (times the scalar gate for
Gated DeltaNet, whose gate acts before the correction). Rank ``R``: each
token runs ``R`` such sub-steps, the decay in the first only and the query
read after the last (``a, b, k`` ``[B, T, H, R, K]``, ``v`` ``[B, T, H, R, V]``);
that is DeltaProduct's product of ``R`` Householder-like factors per token.

Its variants (RWKV-7, Kimi Delta Attention, Gated DeltaProduct) are thin maps onto it in
:mod:`linear_attention.ops.dplr`, calling :func:`dplr_attention`.

Forms (all agree; the tests prove it):

* ``recurrent``: ``lax.scan`` over tokens, the ``R`` sub-steps unrolled inside;
  the reference, and what :func:`dplr_attention_step` does for one token.
* ``parallel``: the explicit ``T' x T'`` form over the ``T' = T R`` sub-steps,
  with dense pairwise per-channel decays ``[T', T', K]`` and the inverse by
  forward substitution; quadratic, for short inputs.
* ``chunk``: WY / UT-transform chunks, linear in T.
* ``auto`` (default): a form for the values and one for the gradient, by backend
  (:data:`DEFAULT_FORMS`, :func:`resolve_form`): on CPU the recurrent form's values and the
  chunk form's gradient (each measured the faster there; Gated DeltaProduct's ``R > 1``
  sub-steps keep the recurrent form for both), the chunk form on GPU and TPU.

The chunk algebra. Inside a chunk with entering state ``S_0``, let ``G_i`` be
the in-chunk inclusive cumulative log decay at sub-step ``i`` (a ``[K]``
vector) and ``E_i = G_{i-1}`` the exclusive one. With the pseudo-values
``u_i^T = b_i^T S_{i-1}`` the update is ``S_i = D_i S_{i-1} + a_i u_i^T + k_i v_i^T``;
unrolling ``S_{i-1}`` gives the lower-triangular system

    (I - L_ba) U = L_bk V + (B e^E) S_0,   L_xy[i, j] = sum_c x_ic y_jc e^{E_ic - G_jc}, j < i,

so with the UT transform ``M = (I - L_ba)^{-1}`` (one per chunk),
``U = M L_bk V + (M B e^E) S_0`` and

    O   = (Q e^G) S_0 + A_qa U + A_qk V,   A_xy[i, j] = sum_c x_ic y_jc e^{G_ic - G_jc}, j <= i,
    S_C = e^{G_C} S_0 + (A e^{G_C - G})^T U + (K e^{G_C - G})^T V.

Everything but ``U = U_0 + W S_0`` and the state update is computed for all
chunks at once; the scan over chunks does two ``[C, K] x [K, V]`` matmuls.
The in-chunk scores ``A_xy`` are those of the diagonal-decay engine
(:func:`linear_attention.engines.chunks.intra_scores_by_diagonals`, sub-chunked so no
``[C, C, K]`` tensor is formed); ``L_xy`` reuses it with the rows moved one
step back (``e^{E_i - G_j} = e^{G_{i-1} - G_j}``), and all four come from one call
that shares the decay factors. Every decay factor is
``exp`` of a difference of cumulative log decays, later position first, so it
is ``<= 1``: log decays down to -20 per step (and ``-inf``, floored by
:func:`~linear_attention.common.floor_log_decay`) underflow to exact zeros
and never overflow. Segment starts are exact resets, masks as in
:mod:`linear_attention.engines.delta.engine`.

Stability is the caller's business: the engine applies any ``a, b``. For the
delta-rule maps (unit ``b``, ``a = -beta b``, ``0 <= beta <= 2``) the
correction ``I - beta b b^T`` is non-expansive; other choices may not be.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from linear_attention import common
from linear_attention.engines.dplr import pallas as kernel
from linear_attention.engines import dispatch
from linear_attention.engines import context as context_lib
from linear_attention.engines.context import SeqContext
from linear_attention.engines import chunks
from linear_attention.engines.dplr import terms as dplr_terms

Array = jax.Array


# ------------------------------------------------------------------ the engine

# ``form="auto"``: ``(values form, gradient form)`` per backend. On CPU the token scan computes
# the values faster and the chunk form differentiates faster (rank one), while with ``R > 1``
# sub-steps per token the scan is faster both ways; on GPU and TPU the chunk form's matmuls
# are the fast path. Measurements: experiments/bench_delta_forms.py,
# results/bench_delta_forms_cpu.json and results/bench_delta_forms_cpu_1thread.json.
DEFAULT_FORMS: dict[str, tuple[str, str]] = {"cpu": ("recurrent", "chunk")}
DEFAULT_PRODUCT_FORMS: dict[str, tuple[str, str]] = {"cpu": ("recurrent", "recurrent")}


def resolve_form(form: str, steps: int = 1) -> tuple[str, str]:
  """``(values form, gradient form)`` for ``form`` and ``steps`` sub-steps per token.

  A named form (``"parallel"``, ``"chunk"``, ``"recurrent"``) is both. ``"auto"`` is
  :data:`DEFAULT_FORMS` (``steps == 1``) or :data:`DEFAULT_PRODUCT_FORMS` (``steps > 1``) for
  ``jax.default_backend()``, else ``("chunk", "chunk")``.

  Raises:
    ValueError: ``form`` is not one of those nor ``"auto"``.
  """
  return common.resolve_auto_form(form, DEFAULT_FORMS if steps == 1 else DEFAULT_PRODUCT_FORMS)


def resolve_chunk_size(chunk_size: int | None) -> int:
  """``chunk_size``, or for None this engine's default on this backend
  (:func:`~linear_attention.engines.dispatch.resolve_chunk_size`: 32 on CPU, 64 elsewhere)."""
  return dispatch.resolve_chunk_size(chunk_size, "dplr")


def _check_inputs(q, k, v, a, b, log_decay, form, chunk_size, initial_state, segment_ids):
  """The engine's checks; returns ``(B, T, H, K, V)``."""
  bsz, t, h, dk, dv = dplr_terms.check_dplr_inputs(q, k, v, k if a is None else a, b,
                                                    log_decay)
  # k, a and b may be wider than q: the variants build them in the accumulation dtype.
  common.check_same_dtype(q=q, v=v)
  common.check_sequence_args(form, chunk_size, segment_ids, bsz, t, initial_state,
                             (bsz, h, dk, dv), auto=True)
  return bsz, t, h, dk, dv


def dplr_attention(
    q: Array,
    k: Array,
    v: Array,
    a: Array | None,
    b: Array,
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
  """The diagonal-plus-low-rank recurrence over a sequence.

  ``S_t = (diag(exp(log_decay_t)) + a_t b_t^T) S_{t-1} + k_t v_t^T``,
  ``o_t = scale * S_t^T q_t``. With an ``R`` axis, each token runs ``R`` such
  sub-steps (the decay in the first, the read after the last).

  Grouped value heads: ``q`` may have fewer heads ``Hk`` than the ``H`` of every other
  argument (``H`` a multiple of ``Hk``); value head ``h`` reads query head
  ``h // (H // Hk)`` (transformers' ``repeat_interleave``). ``k, a, b`` and ``log_decay``
  are per value head (in the variants they carry ``beta`` and the per-value-head decays),
  and so is the state. The query is repeated per value head inside, where it meets the
  per-value-head decay (``Q e^G`` is per value head whenever the decay is).

  Args:
    q: ``[B, T, Hk, K]`` queries.
    k: ``[B, T, H, K]`` write keys, or ``[B, T, H, R, K]``.
    v: ``[B, T, H, V]`` values, or ``[B, T, H, R, V]``.
    a: ``[B, T, H, K]`` (or ``[B, T, H, R, K]``): the correction's write vector; None
      means ``a = -k``, the delta rule's map (KDA, Gated DeltaProduct), whose chunk form
      then computes its scores once.
    b: the same shape as ``a``: the correction's read vector (``b^T S_{t-1}``).
    log_decay: None (no decay), ``[B, T, H]`` (one per head) or ``[B, T, H, K]``
      (per key channel), values ``<= 0``, ``-inf`` included; the sign is
      checked only for concrete values (see
      :func:`~linear_attention.common.check_log_decay`).
    scale: output scale; ``None`` means ``K ** -0.5``.
    form: ``"auto"`` (default: :func:`resolve_form`; on CPU the recurrent form's values
      with the chunk form's gradient, the chunk form elsewhere; no forward-mode derivative
      where the two differ), ``"chunk"`` (linear in T), ``"recurrent"`` or ``"parallel"``.
    chunk_size: tokens per chunk of the chunk form (``chunk_size * R``
      sub-steps; any ``T`` works, padded inside); None: the backend's default
      (:func:`~linear_attention.engines.dispatch.resolve_chunk_size`: 32 on CPU, 64 elsewhere).
    initial_state: optional ``[B, H, K, V]`` state before the first token.
    return_state: also return the final state.
    segment_ids: optional ``[B, T]`` ints packing several sequences per row; no
      state crosses a change of id. ``initial_state`` applies to the first
      segment of each row; the returned state is that at the end of the row.
    implementation: ``None`` (the Pallas chunk kernel on a backend listed in
      ``engines.dispatch.PALLAS_DEFAULT_BACKENDS`` -- none yet -- XLA otherwise),
      ``"xla"``, or ``"pallas"`` (:mod:`linear_attention.engines.dplr.pallas`:
      XLA builds every chunk's terms, the kernels run the state pass and its
      reverse; on CPU in interpret mode, exact but slow). The kernel is the
      chunk form (``form`` ``"auto"`` or ``"chunk"``; its ``chunk_size``
      counts sub-steps); another form, a dtype other than
      float32/bfloat16/float16 or a ``chunk_size`` the platform cannot tile (a
      power of two >= 16 on GPU, a multiple of 16 on TPU) make ``"pallas"``
      raise a ``ValueError``.
    context: None, or a :class:`~linear_attention.ops.context.SeqContext` to run
      with the sequence split over a mesh axis: each device runs ``form`` once on
      its slice with ``K`` extra value columns that carry its transition, folded
      across devices (:func:`~linear_attention.engines.context.affine_call`); the same
      result up to rounding.

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)`` with
    ``state`` ``[B, H, K, V]`` in float32 (float64 for float64 inputs).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.PRNGKey(0), (3, 1, 10, 2, 4))
    >>> b = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    >>> log_decay = jnp.full((1, 10, 2, 4), -0.1)  # per key channel
    >>> ops.dplr_attention(q, k, v, -0.5 * b, b, log_decay).shape
    (1, 10, 2, 4)
    >>> ops.dplr_attention(q, k, v, None, k, log_decay).shape  # a = -k
    (1, 10, 2, 4)
  """
  chunk_size = resolve_chunk_size(chunk_size)
  context_lib.check_context(context)
  if context is not None:
    context_lib.refuse_pallas(implementation)
  pallas = _use_kernel(implementation, form, q, v, chunk_size) and context is None
  _, t, _, dk, _ = _check_inputs(q, k, v, a, b, log_decay, form, chunk_size, initial_state,
                                 segment_ids)
  o, state = _run_in(context, q, k, v, a, b, log_decay,
                     scale=common.resolve_scale(scale, dk), form=form,
                     chunk_size=chunk_size, initial_state=initial_state,
                     segment_ids=segment_ids, pallas=pallas)
  o = o.astype(q.dtype)
  return (o, state) if return_state else o


def _use_kernel(implementation, form, q, v, chunk_size) -> bool:
  """Whether ``implementation`` (see :func:`dplr_attention`) runs the Pallas kernel."""
  unsupported = kernel.unsupported_arguments(q, v, chunk_size)
  if form not in ("auto", "chunk"):
    unsupported["form"] = f"{form!r} (the kernel is the chunk form)"
  return dispatch.resolve_implementation(implementation, unsupported)


def _run(q, k, v, a, b, log_decay, *, scale, form, chunk_size, initial_state, segment_ids,
         pallas=False):
  """Checked inputs in (``k, v, a, b`` with or without the ``R`` axis; ``a`` None means
  ``a = -k``, the delta-rule maps', whose chunk form then computes its scores once),
  ``(o, state)`` out; ``o`` in the accumulation dtype (the dtype of ``q`` from the kernel,
  ``pallas=True``)."""
  q = per_value_head(q, v.shape[2])
  if pallas:
    return kernel.chunk_dplr_attention(q, k, v, a, b, log_decay, scale=scale,
                                       chunk_size=chunk_size, initial_state=initial_state,
                                       return_state=True, segment_ids=segment_ids)
  t, h, dk = q.shape[1:]
  if k.ndim == 4:  # rank one: R = 1
    k, v, a, b = (None if x is None else x[:, :, :, None] for x in (k, v, a, b))
  if log_decay is not None and log_decay.ndim == 3:  # one decay per head, for every channel
    log_decay = jnp.broadcast_to(log_decay[..., None], log_decay.shape + (dk,))
  named_form = form
  form, gradient_form = resolve_form(form, k.shape[3])
  # Only the chunk form depends on chunk_size: keep it out of the others' cache key.
  chunk_size = min(chunk_size, t) if "chunk" in (form, gradient_form) else 1
  with common.forward_mode_needs_a_form(named_form):
    return _forward(q, k, v, a, b, log_decay, initial_state, segment_ids, scale, form=form,
                    gradient_form=gradient_form, chunk_size=chunk_size)


def per_value_head(q: Array, h: int, axis: int = 2) -> Array:
  """``q`` with its ``Hk`` heads (on ``axis``) repeated for the ``h // Hk`` value heads
  that read each (grouped value heads; ``q`` itself when ``Hk == h``)."""
  return q if q.shape[axis] == h else jnp.repeat(q, h // q.shape[axis], axis=axis)


def _run_in(context, q, k, v, a, b, log_decay, *, scale, form, chunk_size, initial_state,
            segment_ids, pallas=False):
  """:func:`_run`, or with a :class:`~linear_attention.ops.context.SeqContext` its
  sequence-parallel form (:func:`~linear_attention.engines.context.affine_call`)."""
  context_lib.check_context(context)
  if context is None:
    return _run(q, k, v, a, b, log_decay, scale=scale, form=form, chunk_size=chunk_size,
                initial_state=initial_state, segment_ids=segment_ids, pallas=pallas)
  context.check(*q.shape[:2])
  return context_lib.affine_call(
      _run_returning_state, context, dict(q=q, k=k, v=v, a=a, b=b, log_decay=log_decay),
      initial_state=initial_state, segment_ids=segment_ids, return_state=True,
      static=(("scale", scale), ("form", form), ("chunk_size", chunk_size), ("pallas", pallas)))


def _run_returning_state(q, k, v, a, b, log_decay, *, return_state, **kwargs):
  del return_state  # _run always returns the state
  return _run(q, k, v, a, b, log_decay, **kwargs)


@functools.partial(jax.jit, static_argnames=("form", "gradient_form", "chunk_size"))
def _forward(*args, form, gradient_form, chunk_size):
  """:func:`_forms` in ``form``, differentiated through ``gradient_form``."""
  return common.in_forms(_forms, form, gradient_form, chunk_size=chunk_size)(*args)


def _forms(q, k, v, a, b, g, initial_state, segment_ids, scale, *, form, chunk_size):
  """``q [B,T,H,K]``, ``k, a, b [B,T,H,R,K]``, ``v [B,T,H,R,V]``, ``g [B,T,H,K]`` or None."""
  acc = common.acc_dtype(q.dtype)
  # Work in [B, H, T, *]: heads become a batch axis of every matmul.
  heads = lambda x: jnp.swapaxes(x, 1, 2).astype(acc)
  qh = heads(q) * jnp.asarray(scale, acc)
  kh, vh, bh = (heads(x) for x in (k, v, b))
  # a = -k (a None): only the chunk form has a cheaper path for it.
  ah = heads(a) if a is not None else None if form == "chunk" else -kh
  gh = None if g is None else common.floor_log_decay(heads(g))  # -inf would give inf - inf
  seg = None if segment_ids is None else common.segment_index(segment_ids)
  s0 = common.zero_state(qh, vh[:, :, :, 0]) if initial_state is None else initial_state.astype(acc)

  if form == "recurrent":
    o, state = _recurrent(qh, kh, vh, ah, bh, gh, s0, seg)
  else:
    r = kh.shape[3]
    flat = _flatten(qh, kh, vh, ah, bh, gh, seg)
    if form == "parallel":
      o, state = _parallel(*flat, s0)
    else:
      o, state = _chunk(*flat, s0, chunk_size * r)
    o = o[:, :, r - 1::r]  # the read after each token's last sub-step
  return jnp.swapaxes(o, 1, 2), state


def _flatten(qh, kh, vh, ah, bh, gh, seg):
  """``[B, H, T, R, *]`` sub-steps -> ``[B, H, T R, *]``: the decay on the first
  sub-step of each token, the query on the last (zero elsewhere)."""
  bsz, h, t, r = kh.shape[:4]
  flat = lambda x: x.reshape(x.shape[:2] + (t * r,) + x.shape[4:])
  before = lambda x, n: jnp.zeros(x.shape[:3] + (n,) + x.shape[3:], x.dtype)
  qf = flat(jnp.concatenate([before(qh, r - 1), qh[:, :, :, None]], axis=3))
  af = None if ah is None else flat(ah)
  gf = None
  if gh is not None:
    gf = flat(jnp.concatenate([gh[:, :, :, None], before(gh, r - 1)], axis=3))
  segf = None if seg is None else jnp.repeat(seg, r, axis=1)
  return qf, flat(kh), flat(vh), af, flat(bh), gf, segf


def _token(s, k, v, a, b, g):
  """One token's ``R`` sub-steps on ``[B, H, *]`` arrays: ``k, a, b [B, H, R, K]``,
  ``v [B, H, R, V]``, ``g [B, H, K]`` or None (the first sub-step's decay)."""
  for j in range(k.shape[2]):
    read = jnp.einsum("bhk,bhkv->bhv", b[:, :, j], s)  # b^T S before this sub-step
    if j == 0 and g is not None:
      s = jnp.exp(g)[..., None] * s
    s = s + a[:, :, j, :, None] * read[..., None, :] + k[:, :, j, :, None] * v[:, :, j, None, :]
  return s


def _recurrent(qh, kh, vh, ah, bh, gh, s0, seg):
  """Token-by-token ``lax.scan``; ``qh [B,H,T,K]``, ``kh, ah, bh [B,H,T,R,K]``."""
  bsz, _, t = qh.shape[:3]
  starts = (jnp.zeros((bsz, t), bool) if seg is None else common.segment_starts(seg))
  move = lambda x: None if x is None else jnp.moveaxis(x, 2, 0)
  xs = tuple(move(x) for x in (qh, kh, vh, ah, bh, gh)) + (starts.T,)

  def body(s, x):
    q_t, k_t, v_t, a_t, b_t, g_t, start = x
    s = jnp.where(start[:, None, None, None], 0.0, s)  # a segment start is an exact reset
    s = _token(s, k_t, v_t, a_t, b_t, g_t)
    return s, jnp.einsum("bhk,bhkv->bhv", q_t, s)

  state, o = common.remat_scan(body, s0, xs)
  return jnp.moveaxis(o, 0, 2), state


def _exclusive(gc, axis):
  """The exclusive cumulative sum from the inclusive one: shifted, zero first."""
  first = jnp.zeros_like(lax.slice_in_dim(gc, 0, 1, axis=axis))
  return jnp.concatenate([first, lax.slice_in_dim(gc, 0, gc.shape[axis] - 1, axis=axis)], axis)


def _parallel(qh, kh, vh, ah, bh, gh, seg, s0):
  """The dense ``T x T`` form over flat sub-steps; inputs ``[B, H, T, *]``."""
  t = qh.shape[2]
  g = jnp.zeros_like(kh) if gh is None else gh
  seg4 = None if seg is None else seg[:, None]  # [B, 1, T]
  incl, strict = chunks.pair_masks(seg4, seg4, t)
  gc = jnp.cumsum(g, axis=2)
  ge = _exclusive(gc, 2)

  def pair(rows, mask):  # exp(rows_i - G_j) per channel, [B, H, T, T, K]
    return jnp.exp(jnp.where(mask[..., None], rows[..., :, None, :] - gc[..., None, :, :],
                             -jnp.inf))

  e_incl, e_strict = pair(gc, incl), pair(ge, strict)
  scores = lambda x, e, y: jnp.einsum("bhik,bhijk,bhjk->bhij", x, e, y)
  a_qk, a_qa = scores(qh, e_incl, kh), scores(qh, e_incl, ah)
  l_bk, l_ba = scores(bh, e_strict, kh), scores(bh, e_strict, ah)
  inv = chunks.unit_lower_inverse_rows(-l_ba)  # (I - L_ba)^{-1}
  first = 1.0 if seg is None else (seg == 0)[:, None, :, None]  # tokens that see S_0
  u = inv @ (l_bk @ vh + (bh * jnp.exp(ge) * first) @ s0)
  o = a_qk @ vh + a_qa @ u + (qh * jnp.exp(gc) * first) @ s0

  to_end = jnp.exp(gc[..., -1:, :] - gc)
  if seg is not None:
    to_end = to_end * (seg == seg[:, -1:])[:, None, :, None]
  carry = 1.0 if seg is None else (seg[:, -1] == 0)[:, None, None, None]
  state = (jnp.exp(gc[..., -1, :])[..., None] * s0 * carry
           + jnp.einsum("bhjk,bhjv->bhkv", kh * to_end, vh)
           + jnp.einsum("bhjk,bhjv->bhkv", ah * to_end, u))
  return o, state


# Chunks per block of the chunk form's outer scan (see _chunk and chunks.BLOCK_CHUNKS).
_BLOCK_CHUNKS = chunks.block_chunks("dplr")


def _chunk(qh, kh, vh, ah, bh, gh, seg, s0, c, block_chunks=_BLOCK_CHUNKS):
  """WY / UT-transform chunkwise form over flat sub-steps; inputs ``[B, H, T, *]``.

  Long sequences go through in blocks of ``block_chunks`` chunks, one block per
  ``lax.scan`` step with the state carried, as the diagonal-decay engine does,
  so the per-block working set stays the same at any length.
  """
  t = qh.shape[2]
  block = c * block_chunks
  if t <= block:
    return _chunk_block(qh, kh, vh, ah, bh, gh, seg, s0, c, None)
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
    *arrays, seg_b = x
    o_b, state = _chunk_block(*arrays, None if seg_b is None else seg_b[0], state, c,
                              None if seg_b is None else seg_b[1])
    return state, o_b

  state, o = lax.scan(body, s0, tuple(split(x) for x in (qh, kh, vh, ah, bh, gh)) + (segb,))
  o = jnp.moveaxis(o, 0, 2)
  return o.reshape(o.shape[:2] + (n * block,) + o.shape[4:])[:, :, :t], state


def _chunk_block(qh, kh, vh, ah, bh, gh, seg, s0, c, seg_prev):
  """One block of the chunk form; ``seg_prev [B]`` is the segment index of the
  token before the block (None: the block starts a row). The state-independent terms
  come from :func:`~linear_attention.engines.dplr.terms.dplr_chunk_terms` (shared with the Pallas
  kernel); only the thin ``K x V`` state pass is sequential."""
  bsz, h, t, _ = qh.shape
  dv = vh.shape[-1]
  qg, a_qa, a_qk, u0, w, a_end, k_end, chunk_decay = dplr_terms.dplr_chunk_terms(
      qh, kh, vh, ah, bh, gh, seg, c, seg_prev=seg_prev)
  n = qg.shape[2]
  vc = common.pad_axis(vh, c, axis=2).reshape(bsz, h, n, c, dv)
  kv_local = jnp.einsum("bhnck,bhncv->bhnkv", k_end, vc)

  def body(state, x):
    w_n, u0_n, a_n, kv_n, d_n = x
    u = u0_n + w_n @ state
    new = d_n[..., None] * state + jnp.einsum("bhck,bhcv->bhkv", a_n, u) + kv_n
    return new, (state, u)

  move = lambda x: jnp.moveaxis(x, 2, 0)
  state, (entering, u) = lax.scan(
      body, s0, tuple(move(x) for x in (w, u0, a_end, kv_local, chunk_decay)))
  entering = jnp.moveaxis(entering, 0, 2)  # [B, H, N, K, V]: the state before each chunk
  u = jnp.moveaxis(u, 0, 2)  # [B, H, N, C, V]
  o = qg @ entering + a_qa @ u + a_qk @ vc
  return o.reshape(bsz, h, n * c, dv)[:, :, :t], state


def dplr_attention_step(
    state: Array,
    q: Array,
    k: Array,
    v: Array,
    a: Array | None,
    b: Array,
    log_decay: Array | None = None,
    *,
    scale: float | None = None,
):
  """One token of :func:`dplr_attention`: decay and correct (``R`` sub-steps), write, read.

  Args:
    state: ``[B, H, K, V]`` float32 (or float64).
    q: ``[B, Hk, K]`` (grouped value heads as in :func:`dplr_attention`);
      k, a, b: ``[B, H, K]`` or ``[B, H, R, K]``; v: ``[B, H, V]``
      or ``[B, H, R, V]``; ``a`` None means ``a = -k``.
    log_decay: None, ``[B, H]`` or ``[B, H, K]``, values ``<= 0`` (checked when
      concrete only).
    scale: output scale; ``None`` means ``K ** -0.5``.

  Returns:
    ``(o, new_state)``: ``o`` ``[B, H, V]`` in the dtype of ``q``, the new
    state ``[B, H, K, V]`` in the state's dtype.

  Examples:
    >>> import jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q = k = v = a = b = jnp.full((1, 2, 4), 0.5)
    >>> o, state = ops.dplr_attention_step(jnp.zeros((1, 2, 4, 4)), q, k, v, -a, b)
    >>> o.shape
    (1, 2, 4)
  """
  common.check_step_state_first(state, "[B, H, K, V]", 4)
  named_a = k if a is None else a
  for name, x in (("q", q), ("k", k), ("v", v), ("a", named_a), ("b", b)):
    common.check_float(name, x)
  common.check_rank("q", q, 3)
  bsz, h, dk = q.shape
  if jnp.ndim(v) >= 2:  # a wrong rank of v is named below
    h *= common.check_value_groups("v", jnp.shape(v)[1], h, "q")
  if jnp.ndim(named_a) not in (3, 4):
    raise ValueError("a must have shape [B, H, K] (rank one) or [B, H, R, K] (R sub-steps), "
                     f"got {list(jnp.shape(named_a))}.")
  lead = (bsz, h) + ((named_a.shape[2],) if jnp.ndim(named_a) == 4 else ())
  for name, x in (("a", named_a), ("b", b), ("k", k)):
    common.check_shape(name, x, lead + (dk,), "B, K of q, H of v and R of a")
  common.check_shape("v", v, lead + (None,), "B of q and R of a")
  common.check_same_dtype(q=q, v=v)  # k, a, b may be wider, as in dplr_attention
  common.check_step_state("state", state, (bsz, h, dk, v.shape[-1]), "[B, H, K, V]")
  common.check_log_decay(log_decay, bsz, h, dk)
  o, new_state = _step_run(q, k, v, a, b, log_decay, state, common.resolve_scale(scale, dk))
  return o.astype(q.dtype), new_state


def _step_run(q, k, v, a, b, log_decay, state, scale):
  """Checked one-token inputs (with or without the ``R`` axis) in, ``(o, state)`` out."""
  q = per_value_head(q, v.shape[1], axis=1)
  if k.ndim == 3:
    k, v, a, b = (None if x is None else x[:, :, None] for x in (k, v, a, b))
  if log_decay is not None and log_decay.ndim == 2:
    log_decay = jnp.broadcast_to(log_decay[..., None], log_decay.shape + (q.shape[-1],))
  return _step_forward(q, k, v, a, b, log_decay, state, scale)


@jax.jit
def _step_forward(q, k, v, a, b, g, state, scale):
  acc = state.dtype
  k, v, b = (x.astype(acc) for x in (k, v, b))
  a = -k if a is None else a.astype(acc)
  g = None if g is None else g.astype(acc)
  state = _token(state, k, v, a, b, g)
  o = jnp.einsum("bhk,bhkv->bhv", q.astype(acc) * jnp.asarray(scale, acc), state)
  return o, state
