"""The diagonal-plus-low-rank (DPLR) engine, a generalised delta rule, and its variants.

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

The variants here are thin maps onto it:

* RWKV-7 (Peng et al. 2025): ``a = -(iclr * kappa_hat)``, ``b = kappa_hat``,
  ``k = k_tilde``, the decay ``w`` per channel, plus the bonus term.
* Kimi Delta Attention (Kimi Linear, 2025):
  ``S_t = (I - beta_t k_t k_t^T) diag(alpha_t) S_{t-1} + beta_t k_t v_t^T``, i.e.
  ``a = -beta k``, ``b = alpha * k``, write key ``beta k``.
* Gated DeltaProduct (Siems et al. 2025): ``R`` Householder steps per token
  after one scalar gate.

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
(:func:`linear_attention.common.intra_scores_by_diagonals`, sub-chunked so no
``[C, C, K]`` tensor is formed); ``L_xy`` reuses it with the rows moved one
step back (``e^{E_i - G_j} = e^{G_{i-1} - G_j}``), and all four come from one call
that shares the decay factors. Every decay factor is
``exp`` of a difference of cumulative log decays, later position first, so it
is ``<= 1``: log decays down to -20 per step (and ``-inf``, floored by
:func:`~linear_attention.common.floor_log_decay`) underflow to exact zeros
and never overflow. Segment starts are exact resets, masks as in
:mod:`linear_attention.ops.delta`.

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
from linear_attention.kernels import chunk_dplr as kernel
from linear_attention.kernels import dispatch
from linear_attention.ops import context as context_lib
from linear_attention.ops import delta as delta_ops
from linear_attention.ops.context import SeqContext

Array = jax.Array


# ------------------------------------------------------------------ the engine

# The form ``form="auto"`` picks per backend, by measurement (experiments/bench_delta_forms.py;
# B=1, H=4, K=V=64, float32, 32-token chunks on CPU). On CPU it depends on XLA's threading:
# * XLA's default threads on an idle 2-core machine (results/bench_delta_forms_cpu.json, what
#   a user gets; wall ms, best of 3 in rotating order, matmul 201 GFLOP/s): the token-by-token
#   scan is 2-3x faster forward (KDA 4k 42 against 78, RWKV-7 4k 42 against 120), while the
#   chunk form is faster forward+backward (KDA 4k 287 against 346, 16k 1177 against 1644;
#   RWKV-7 4k 364 against 370, 16k 1270 against 1501); Gated DeltaProduct's chunk form is
#   slower both ways (4k forward+backward 580 against 513);
# * fewer threads (results/bench_delta_forms_cpu_1thread.json; its XLA_FLAGS held a bare
#   ``intra_op_parallelism_threads=1``, which is no XLA flag and made XLA drop the flags after
#   it, so that run may have had XLA's YNN fusions on; the studies run with
#   ``--xla_cpu_multi_thread_eigen=false``): the scan's backward is 4-5x slower than with
#   threads and the chunk form's forward+backward wins 2.5x for KDA and RWKV-7 (idle, KDA 4k:
#   569 against 2093 ms wall), while the scan stays the faster forward.
# So on CPU ``auto`` computes the values with the scan and differentiates the chunk form
# (:func:`~linear_attention.common.with_gradient_of`): the faster of the two each way. The chunk
# form's forward is dominated by the per-channel in-chunk scores
# (``common.intra_scores_by_diagonals``, an ``exp`` per pair and channel inside 4-step
# sub-chunks). With ``R > 1`` sub-steps per token (Gated DeltaProduct) the scan is the faster
# both ways on CPU. On GPU and TPU the chunk form's matmuls are the fast path.
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


# The chunk length ``chunk_size=None`` gives per backend. On CPU, by measurement (KDA, B=1,
# H=4, K=V=64, T=4096, float32, the flags above, process CPU time on a loaded machine), 32
# tokens per chunk against 64: forward 190 against 249 ms and forward+backward 929 against
# 1332 ms; with XLA's multi-threaded Eigen off only, 184 / 298 ms and 665 / 820 ms. The
# per-channel in-chunk scores cost about ``C (C / s + s)`` exps per channel and chunk of
# ``C`` steps (sub-chunks of ``s``), so per token they grow with ``C`` while the state pass
# shrinks; 16 was hardly faster (169 ms forward) and its gradient segfaulted in XLA's CPU
# backend when ``XLA_FLAGS`` held a bare ``intra_op_parallelism_threads=1`` (XLA then dropped
# the package's YNN-fusion workaround flag after it). Elsewhere 64, as the kernels tile.
DEFAULT_CHUNK_SIZES = {"cpu": 32}


def resolve_chunk_size(chunk_size: int | None) -> int:
  """``chunk_size``, or for None this backend's default:
  ``DEFAULT_CHUNK_SIZES.get(jax.default_backend(), 64)``."""
  return DEFAULT_CHUNK_SIZES.get(jax.default_backend(), 64) if chunk_size is None else chunk_size


def _check_like(name: str, x, expected, what: str) -> None:
  common.check_float(name, x)
  common.check_shape(name, x, expected, what)


def _check_inputs(q, k, v, a, b, log_decay, form, chunk_size, initial_state, segment_ids):
  """The engine's checks; returns ``(B, T, H, K, V)``."""
  bsz, t, h, dk, dv = common.check_dplr_inputs(q, k, v, a, b, log_decay)
  common.check_same_dtype(q=q, k=k, v=v)
  common.check_sequence_args(form, chunk_size, segment_ids, bsz, t, initial_state,
                             (bsz, h, dk, dv), auto=True)
  return bsz, t, h, dk, dv


def dplr_attention(
    q: Array,
    k: Array,
    v: Array,
    a: Array,
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

  Args:
    q: ``[B, T, H, K]`` queries.
    k: ``[B, T, H, K]`` write keys, or ``[B, T, H, R, K]``.
    v: ``[B, T, H, V]`` values, or ``[B, T, H, R, V]``.
    a: ``[B, T, H, K]`` (or ``[B, T, H, R, K]``): the correction's write vector.
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
      sub-steps; any ``T`` works, padded inside); None: :func:`resolve_chunk_size`, 32 on
      CPU (measured faster there) and 64 elsewhere.
    initial_state: optional ``[B, H, K, V]`` state before the first token.
    return_state: also return the final state.
    segment_ids: optional ``[B, T]`` ints packing several sequences per row; no
      state crosses a change of id. ``initial_state`` applies to the first
      segment of each row; the returned state is that at the end of the row.
    implementation: ``None`` (the Pallas chunk kernel on a backend listed in
      ``kernels.dispatch.PALLAS_DEFAULT_BACKENDS`` -- none yet -- XLA otherwise),
      ``"xla"``, or ``"pallas"`` (:mod:`linear_attention.kernels.chunk_dplr`:
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
      across devices (:func:`~linear_attention.ops.context.affine_call`); the same
      result up to rounding.

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)`` with
    ``state`` ``[B, H, K, V]`` in float32 (float64 for float64 inputs).
  """
  chunk_size = resolve_chunk_size(chunk_size)
  pallas = _use_kernel(implementation, form, q, v, chunk_size)
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
  if pallas:
    return kernel.chunk_dplr_attention(q, k, v, a, b, log_decay, scale=scale,
                                       chunk_size=chunk_size, initial_state=initial_state,
                                       return_state=True, segment_ids=segment_ids)
  t, h, dk = q.shape[1:]
  if k.ndim == 4:  # rank one: R = 1
    k, v, a, b = (None if x is None else x[:, :, :, None] for x in (k, v, a, b))
  if log_decay is not None and log_decay.ndim == 3:  # one decay per head, for every channel
    log_decay = jnp.broadcast_to(log_decay[..., None], log_decay.shape + (dk,))
  form, gradient_form = resolve_form(form, k.shape[3])
  # Only the chunk form depends on chunk_size: keep it out of the others' cache key.
  chunk_size = min(chunk_size, t) if "chunk" in (form, gradient_form) else 1
  return _forward(q, k, v, a, b, log_decay, initial_state, segment_ids, scale, form=form,
                  gradient_form=gradient_form, chunk_size=chunk_size)


def _run_in(context, q, k, v, a, b, log_decay, *, scale, form, chunk_size, initial_state,
            segment_ids, pallas=False):
  """:func:`_run`, or with a :class:`~linear_attention.ops.context.SeqContext` its
  sequence-parallel form (:func:`~linear_attention.ops.context.affine_call`)."""
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
  incl, strict = common.pair_masks(seg4, seg4, t)
  gc = jnp.cumsum(g, axis=2)
  ge = _exclusive(gc, 2)

  def pair(rows, mask):  # exp(rows_i - G_j) per channel, [B, H, T, T, K]
    return jnp.exp(jnp.where(mask[..., None], rows[..., :, None, :] - gc[..., None, :, :],
                             -jnp.inf))

  e_incl, e_strict = pair(gc, incl), pair(ge, strict)
  scores = lambda x, e, y: jnp.einsum("bhik,bhijk,bhjk->bhij", x, e, y)
  a_qk, a_qa = scores(qh, e_incl, kh), scores(qh, e_incl, ah)
  l_bk, l_ba = scores(bh, e_strict, kh), scores(bh, e_strict, ah)
  inv = common.unit_lower_inverse_rows(-l_ba)  # (I - L_ba)^{-1}
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


# Chunks per block of the chunk form's outer scan (see _chunk and common.BLOCK_CHUNKS).
_BLOCK_CHUNKS = common.block_chunks("dplr")


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
  come from :func:`~linear_attention.common.dplr_chunk_terms` (shared with the Pallas
  kernel); only the thin ``K x V`` state pass is sequential."""
  bsz, h, t, _ = qh.shape
  dv = vh.shape[-1]
  qg, a_qa, a_qk, u0, w, a_end, k_end, chunk_decay = common.dplr_chunk_terms(
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
    a: Array,
    b: Array,
    log_decay: Array | None = None,
    *,
    scale: float | None = None,
):
  """One token of :func:`dplr_attention`: decay and correct (``R`` sub-steps), write, read.

  Args:
    state: ``[B, H, K, V]`` float32 (or float64).
    q: ``[B, H, K]``; k, a, b: ``[B, H, K]`` or ``[B, H, R, K]``; v: ``[B, H, V]``
      or ``[B, H, R, V]``.
    log_decay: None, ``[B, H]`` or ``[B, H, K]``, values ``<= 0`` (checked when
      concrete only).
    scale: output scale; ``None`` means ``K ** -0.5``.

  Returns:
    ``(o, new_state)``: ``o`` ``[B, H, V]`` in the dtype of ``q``, the new
    state ``[B, H, K, V]`` in the state's dtype.
  """
  common.check_step_state_first(state, "[B, H, K, V]", 4)
  for name, x in (("q", q), ("k", k), ("v", v), ("a", a), ("b", b)):
    common.check_float(name, x)
  common.check_rank("q", q, 3)
  bsz, h, dk = q.shape
  if jnp.ndim(a) not in (3, 4):
    raise ValueError("a must have shape [B, H, K] (rank one) or [B, H, R, K] (R sub-steps), "
                     f"got {list(jnp.shape(a))}.")
  lead = (bsz, h) + ((a.shape[2],) if jnp.ndim(a) == 4 else ())
  for name, x in (("a", a), ("b", b), ("k", k)):
    common.check_shape(name, x, lead + (dk,), "B, H, K of q and R of a")
  common.check_shape("v", v, lead + (None,), "B, H of q and R of a")
  common.check_same_dtype(q=q, k=k, v=v)
  common.check_step_state("state", state, (bsz, h, dk, v.shape[-1]), "[B, H, K, V]")
  common.check_log_decay(log_decay, bsz, h, dk)
  o, new_state = _step_run(q, k, v, a, b, log_decay, state, common.resolve_scale(scale, dk))
  return o.astype(q.dtype), new_state


def _step_run(q, k, v, a, b, log_decay, state, scale):
  """Checked one-token inputs (with or without the ``R`` axis) in, ``(o, state)`` out."""
  if k.ndim == 3:
    k, v, a, b = (x[:, :, None] for x in (k, v, a, b))
  if log_decay is not None and log_decay.ndim == 2:
    log_decay = jnp.broadcast_to(log_decay[..., None], log_decay.shape + (q.shape[-1],))
  return _step_forward(q, k, v, a, b, log_decay, state, scale)


@jax.jit
def _step_forward(q, k, v, a, b, g, state, scale):
  acc = state.dtype
  k, v, a, b = (x.astype(acc) for x in (k, v, a, b))
  g = None if g is None else g.astype(acc)
  state = _token(state, k, v, a, b, g)
  o = jnp.einsum("bhk,bhkv->bhv", q.astype(acc) * jnp.asarray(scale, acc), state)
  return o, state


# ------------------------------------------------------------------ RWKV-7


def _check_rwkv7(r, k, v, log_w, kappa, a, bonus, lead):
  """``lead`` is ``(B, T, H)`` or ``(B, H)``; returns ``K``."""
  dk = r.shape[-1]
  what = "[B, T, H, K]" if len(lead) == 3 else "[B, H, K]"
  common.check_log_decay(log_w, *lead, dk, name="log_w", per_head=False)
  _check_like("kappa", kappa, lead + (dk,), what + ", the shape of r")
  _check_like("a", a, lead + (dk,), what + ", the shape of r")
  if bonus is not None:
    _check_like("bonus", bonus, (lead[-1], dk), "[H, K]")
  return dk


def rwkv7_bonus(r: Array, k: Array, v: Array, bonus: Array) -> Array:
  """RWKV-7's bonus term ``u_t = (r_t . (bonus * k_t)) v_t`` per head.

  Args:
    r, k: ``[..., H, K]`` (receptance, replacement key); v: ``[..., H, V]``;
    bonus: ``[H, K]`` (the paper's ``rho``).

  Returns:
    ``[..., H, V]`` in the accumulation dtype (float32 for half inputs).
  """
  acc = common.acc_dtype(r.dtype)
  weight = jnp.sum(r.astype(acc) * bonus.astype(acc) * k.astype(acc), axis=-1, keepdims=True)
  return weight * v.astype(acc)


def _rwkv7_ab(kappa, a, acc):
  """The engine's correction: ``a = -(iclr * kappa_hat)``, ``b = kappa_hat``."""
  kappa = kappa.astype(acc)
  return -(a.astype(acc) * kappa), kappa


def rwkv7(
    r: Array,
    k: Array,
    v: Array,
    log_w: Array,
    kappa: Array,
    a: Array,
    bonus: Array | None = None,
    *,
    scale: float | None = 1.0,
    form: str = "auto",
    chunk_size: int | None = None,
    initial_state: Array | None = None,
    return_state: bool = False,
    segment_ids: Array | None = None,
    implementation: str | None = None,
    context: SeqContext | None = None,
):
  """RWKV-7 "Goose" time mixing (Peng et al. 2025, arXiv:2503.14456) on the DPLR engine.

  In the paper's row-vector form, with the state ``wkv [V, K]``::

      wkv_t = wkv_{t-1} (diag(w_t) - kappa_hat_t^T (a_t * kappa_hat_t)) + v_t^T k_tilde_t
      o_t   = wkv_t r_t^T + (r_t . (rho * k_tilde_t)) v_t

  Here the state is ``S = wkv^T [K, V]``: ``S_t = (diag(w_t) - (a_t * kappa_hat_t)
  kappa_hat_t^T) S_{t-1} + k_tilde_t v_t^T``, the engine with
  ``a = -(a_t * kappa_hat_t)``, ``b = kappa_hat_t``.

  Args:
    r: ``[B, T, H, K]`` receptance (the query).
    k: ``[B, T, H, K]`` replacement key ``k_tilde = k * (1 + (a - 1) * alpha)``.
    v: ``[B, T, H, V]`` values.
    log_w: ``[B, T, H, K]`` log decay ``log w_t <= 0`` (RWKV-7:
      ``-exp(-0.5) * sigmoid(d_t)``); checked when concrete only.
    kappa: ``[B, T, H, K]`` removal key ``kappa_hat``, L2-normalised per head by
      the caller (``kappa = k * xi``, then normalised).
    a: ``[B, T, H, K]`` in-context learning rate, in ``[0, 1]`` in RWKV-7
      (sigmoid; not checked).
    bonus: None or ``[H, K]``, the paper's ``rho``: adds ``(r . (rho * k)) v``.
      RWKV-7 adds it after the output norm: pass None here and add
      :func:`rwkv7_bonus` after the norm.
    scale: ``1.0`` as in RWKV; ``None`` means ``K ** -0.5``.
    form, chunk_size, initial_state (``[B, H, K, V]``), return_state,
      segment_ids, implementation, context: as in :func:`dplr_attention`.

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``r``, or ``(o, state)`` with state
    ``[B, H, K, V]`` float32 (``wkv^T``).
  """
  bsz, t, h, dk, dv = common.check_qkv(r, k, v, names=("r", "k", "v"))
  _check_rwkv7(r, k, v, log_w, kappa, a, bonus, (bsz, t, h))
  chunk_size = resolve_chunk_size(chunk_size)
  pallas = _use_kernel(implementation, form, r, v, chunk_size)
  common.check_sequence_args(form, chunk_size, segment_ids, bsz, t, initial_state,
                             (bsz, h, dk, dv), auto=True)
  ea, eb = _rwkv7_ab(kappa, a, common.acc_dtype(r.dtype))
  o, state = _run_in(context, r, k, v, ea, eb, log_w,
                     scale=common.resolve_scale(scale, dk), form=form,
                     chunk_size=chunk_size, initial_state=initial_state,
                     segment_ids=segment_ids, pallas=pallas)
  if bonus is not None:
    o = o + rwkv7_bonus(r, k, v, bonus)
  o = o.astype(r.dtype)
  return (o, state) if return_state else o


def rwkv7_step(state: Array, r: Array, k: Array, v: Array, log_w: Array, kappa: Array,
               a: Array, bonus: Array | None = None, *, scale: float | None = 1.0):
  """One token of :func:`rwkv7`.

  Args:
    state: ``[B, H, K, V]`` float32 (``wkv^T``);
    r, k (``k_tilde``), kappa (``kappa_hat``), a: ``[B, H, K]``; v: ``[B, H, V]``;
    log_w: ``[B, H, K]`` (``<= 0``,
    checked when concrete); bonus: None or ``[H, K]``; scale: as in :func:`rwkv7`.

  Returns:
    ``(o [B, H, V] in the dtype of r, new_state [B, H, K, V])``.
  """
  common.check_step_state_first(state, "[B, H, K, V]", 4)
  bsz, h, dk, dv = common.check_step_qkv(r, k, v, names=("r", "k", "v"))
  common.check_step_state("state", state, (bsz, h, dk, dv), "[B, H, K, V]")
  _check_rwkv7(r, k, v, log_w, kappa, a, bonus, (bsz, h))
  ea, eb = _rwkv7_ab(kappa, a, state.dtype)
  o, state = _step_run(r, k, v, ea, eb, log_w, state, common.resolve_scale(scale, dk))
  if bonus is not None:
    o = o + rwkv7_bonus(r, k, v, bonus).astype(o.dtype)
  return o.astype(r.dtype), state


# ------------------------------------------------------------------ Kimi Delta Attention


def _kda_map(k, beta, log_alpha, acc):
  """``(write key beta k, a = -beta k, b = alpha * k)``; the decay acts before the correction."""
  k, beta = k.astype(acc), beta.astype(acc)[..., None]
  alpha = jnp.exp(common.floor_log_decay(log_alpha.astype(acc)))
  return beta * k, -beta * k, alpha * k


def kda(
    q: Array,
    k: Array,
    v: Array,
    beta: Array,
    log_alpha: Array,
    *,
    scale: float | None = None,
    form: str = "auto",
    chunk_size: int | None = None,
    initial_state: Array | None = None,
    return_state: bool = False,
    segment_ids: Array | None = None,
    normalize_qk: bool = False,
    implementation: str | None = None,
    context: SeqContext | None = None,
):
  """Kimi Delta Attention (Kimi Team 2025, "Kimi Linear"): the gated delta rule with a
  per-channel decay.

  ``S_t = (I - beta_t k_t k_t^T) diag(alpha_t) S_{t-1} + beta_t k_t v_t^T``,
  ``o_t = scale * S_t^T q_t``, ``alpha_t = exp(log_alpha_t)``. On the engine:
  ``a = -beta k``, ``b = alpha * k``, write key ``beta k``.

  Args:
    q, k: ``[B, T, H, K]`` (keys L2-normalised by the caller, or ``normalize_qk``).
    v: ``[B, T, H, V]``.
    beta: ``[B, T, H]`` write strengths in ``[0, 2]`` (checked when concrete).
    log_alpha: ``[B, T, H, K]`` per-channel log decay ``<= 0``, ``-inf``
      included (checked when concrete).
    scale, form, chunk_size, initial_state, return_state, segment_ids, implementation, context: as in
      :func:`dplr_attention`.
    normalize_qk: L2-normalise ``q`` and ``k`` over ``K`` here.

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)``.
  """
  bsz, t, h, dk, dv = common.check_qkv(q, k, v)
  common.check_beta(beta, (bsz, t, h), "[B, T, H]")
  common.check_log_decay(log_alpha, bsz, t, h, dk, name="log_alpha", per_head=False)
  chunk_size = resolve_chunk_size(chunk_size)
  pallas = _use_kernel(implementation, form, q, v, chunk_size)
  common.check_sequence_args(form, chunk_size, segment_ids, bsz, t, initial_state,
                             (bsz, h, dk, dv), auto=True)
  if normalize_qk:
    q, k = delta_ops._l2_normalize(q), delta_ops._l2_normalize(k)
  wk, _, eb = _kda_map(k, beta, log_alpha, common.acc_dtype(q.dtype))
  o, state = _run_in(context, q, wk, v, None, eb, log_alpha,  # a = -wk
                     scale=common.resolve_scale(scale, dk), form=form,
                     chunk_size=chunk_size, initial_state=initial_state,
                     segment_ids=segment_ids, pallas=pallas)
  o = o.astype(q.dtype)
  return (o, state) if return_state else o


def kda_step(state: Array, q: Array, k: Array, v: Array, beta: Array, log_alpha: Array, *,
             scale: float | None = None, normalize_qk: bool = False):
  """One token of :func:`kda`: ``S = (I - beta k k^T) diag(alpha) S + beta k v^T``.

  Args: state ``[B, H, K, V]`` float32; q, k ``[B, H, K]``; v ``[B, H, V]``;
  beta ``[B, H]`` in ``[0, 2]``; log_alpha ``[B, H, K]`` ``<= 0``.

  Returns: ``(o [B, H, V] in the dtype of q, new_state [B, H, K, V])``.
  """
  common.check_step_state_first(state, "[B, H, K, V]", 4)
  bsz, h, dk, dv = common.check_step_qkv(q, k, v)
  common.check_beta(beta, (bsz, h), "[B, H]")
  common.check_log_decay(log_alpha, bsz, h, dk, name="log_alpha", per_head=False)
  common.check_step_state("state", state, (bsz, h, dk, dv), "[B, H, K, V]")
  if normalize_qk:
    q, k = delta_ops._l2_normalize(q), delta_ops._l2_normalize(k)
  wk, ea, eb = _kda_map(k, beta, log_alpha, state.dtype)
  o, state = _step_run(q, wk, v, ea, eb, log_alpha, state, common.resolve_scale(scale, dk))
  return o.astype(q.dtype), state


# ------------------------------------------------------------------ Gated DeltaProduct


def _check_deltaproduct(q, k, v, beta, log_decay, lead):
  """``lead`` is ``(B, T, H)`` or ``(B, H)`` (from ``q``); returns ``(R, V)``."""
  dk = q.shape[-1]
  rank = len(lead) + 2
  common.check_float("k", k)
  common.check_float("v", v)
  if jnp.ndim(k) != rank:
    letters = "[B, T, H, R, K]" if len(lead) == 3 else "[B, H, R, K]"
    raise ValueError(f"k must have shape {letters} (R Householder steps per token), got "
                     f"{list(jnp.shape(k))}.")
  r = k.shape[-2]
  common.check_shape("k", k, lead + (r, dk), "B, T, H, K of q and R steps")
  common.check_shape("v", v, lead + (r, None), "B, T, H of q and the R of k")
  common.check_same_dtype(q=q, k=k, v=v)
  common.check_beta(beta, lead + (r,), "[B, T, H, R]" if len(lead) == 3 else "[B, H, R]")
  common.check_log_decay(log_decay, *lead, dk, per_channel=False)
  return r, v.shape[-1]


def _deltaproduct_map(k, beta, log_decay, acc):
  """``(write keys beta k, a = -beta k, b = k)``, the first step's ``b`` times the gate."""
  k, beta = k.astype(acc), beta.astype(acc)[..., None]
  b = k
  if log_decay is not None:  # the gate acts before the first correction: b_0 = gate * k_0
    gate = jnp.exp(common.floor_log_decay(log_decay.astype(acc)))[..., None, None]
    b = jnp.concatenate([gate * k[..., :1, :], k[..., 1:, :]], axis=-2)
  return beta * k, -beta * k, b


def gated_deltaproduct(
    q: Array,
    k: Array,
    v: Array,
    beta: Array,
    log_decay: Array | None = None,
    *,
    scale: float | None = None,
    form: str = "auto",
    chunk_size: int | None = None,
    initial_state: Array | None = None,
    return_state: bool = False,
    segment_ids: Array | None = None,
    normalize_qk: bool = False,
    implementation: str | None = None,
    context: SeqContext | None = None,
):
  """Gated DeltaProduct (Siems et al. 2025, "DeltaProduct"): ``R`` delta-rule
  (Householder-like) steps per token after one scalar gate.

  ``S <- exp(log_decay_t) S``, then for ``j = 1..R``:
  ``S <- (I - beta_tj k_tj k_tj^T) S + beta_tj k_tj v_tj^T``; ``o_t = scale * S_t^T q_t``.
  Without ``log_decay`` it is DeltaProduct; with ``R = 1``, Gated DeltaNet.

  Args:
    q: ``[B, T, H, K]``.
    k: ``[B, T, H, R, K]`` keys per step (L2-normalised by the caller, or
      ``normalize_qk``).
    v: ``[B, T, H, R, V]``.
    beta: ``[B, T, H, R]`` in ``[0, 2]`` (checked when concrete).
    log_decay: None or ``[B, T, H]`` (one gate per head and token), ``<= 0``.
    scale, form, chunk_size (tokens; ``R`` sub-steps each), initial_state,
      return_state, segment_ids, implementation, context: as in :func:`dplr_attention`.
    normalize_qk: L2-normalise ``q`` and every ``k`` over ``K`` here.

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)``.
  """
  common.check_float("q", q)
  common.check_rank("q", q, 4)
  bsz, t, h, dk = q.shape
  common.check_seq_len(t, "axis 1 of q")
  _, dv = _check_deltaproduct(q, k, v, beta, log_decay, (bsz, t, h))
  chunk_size = resolve_chunk_size(chunk_size)
  pallas = _use_kernel(implementation, form, q, v, chunk_size)
  common.check_sequence_args(form, chunk_size, segment_ids, bsz, t, initial_state,
                             (bsz, h, dk, dv), auto=True)
  if normalize_qk:
    q, k = delta_ops._l2_normalize(q), delta_ops._l2_normalize(k)
  wk, _, eb = _deltaproduct_map(k, beta, log_decay, common.acc_dtype(q.dtype))
  o, state = _run_in(context, q, wk, v, None, eb, log_decay,  # a = -wk
                     scale=common.resolve_scale(scale, dk), form=form,
                     chunk_size=chunk_size, initial_state=initial_state,
                     segment_ids=segment_ids, pallas=pallas)
  o = o.astype(q.dtype)
  return (o, state) if return_state else o


def gated_deltaproduct_step(state: Array, q: Array, k: Array, v: Array, beta: Array,
                            log_decay: Array | None = None, *, scale: float | None = None,
                            normalize_qk: bool = False):
  """One token of :func:`gated_deltaproduct`.

  Args: state ``[B, H, K, V]`` float32; q ``[B, H, K]``; k ``[B, H, R, K]``;
  v ``[B, H, R, V]``; beta ``[B, H, R]`` in ``[0, 2]``; log_decay None or
  ``[B, H]`` ``<= 0``.

  Returns: ``(o [B, H, V] in the dtype of q, new_state [B, H, K, V])``.
  """
  common.check_step_state_first(state, "[B, H, K, V]", 4)
  common.check_float("q", q)
  common.check_rank("q", q, 3)
  bsz, h, dk = q.shape
  _, dv = _check_deltaproduct(q, k, v, beta, log_decay, (bsz, h))
  common.check_step_state("state", state, (bsz, h, dk, dv), "[B, H, K, V]")
  if normalize_qk:
    q, k = delta_ops._l2_normalize(q), delta_ops._l2_normalize(k)
  wk, ea, eb = _deltaproduct_map(k, beta, log_decay, state.dtype)
  o, state = _step_run(q, wk, v, ea, eb, log_decay, state, common.resolve_scale(scale, dk))
  return o.astype(q.dtype), state
