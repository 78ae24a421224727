"""The delta-rule engine: DeltaNet and Gated DeltaNet.

One recurrence over a matrix state ``S`` of shape ``[K, V]`` per batch row and
head, with a write strength ``beta_t`` and an optional scalar gate
``a_t = exp(log_decay_t)`` per head and step::

    S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    o_t = scale * S_t^T q_t

Read as a rule: decay the state, predict ``v_t`` from ``k_t``
(``p_t = a_t S_{t-1}^T k_t``) and write back ``beta_t`` times the error,
``S_t = a_t S_{t-1} + beta_t k_t (v_t - p_t)^T``. Without the gate this is
DeltaNet (Schlag et al. 2021; Yang et al. 2024), with it Gated DeltaNet
(Yang et al. 2024).

Stability: with L2-normalised keys and ``0 <= beta_t <= 2`` the transition
``I - beta_t k_t k_t^T`` has eigenvalues ``1`` and ``1 - beta_t`` in
``[-1, 1]``, so the state stays bounded over any length. Keys are NOT
normalised here: the callers (or ``normalize_qk=True`` of the variants) do it.

Forms (all agree; the tests prove it):

* ``recurrent``: ``lax.scan`` over tokens through the step, the reference.
* ``parallel``: the explicit ``T x T`` attention matrix
  ``P = A (I + L)^{-1} diag(beta)`` (see below), with the inverse by forward
  substitution; quadratic, for short inputs (a separate code path to check
  the chunk form against).
* ``chunk``: the WY / UT-transform chunkwise algorithm, linear in T.
* ``auto`` (default): a form for the values and one for the gradient, by backend
  (:data:`DEFAULT_FORMS`): on CPU the recurrent form's values and the chunk form's
  gradient, the chunk form elsewhere.

The chunk algebra. Inside a chunk with entering state ``S_0``, let ``G_i`` be
the in-chunk cumulative log decay up to token ``i`` (inclusive) and write the
update as ``S_i = a_i S_{i-1} + k_i d_i^T`` with the pseudo-value
``d_i = beta_i (v_i - a_i S_{i-1}^T k_i)``. Unrolling ``S_{i-1}`` gives the
lower-triangular system ``(I + L) D = diag(beta) V - diag(beta e^G) K S_0``
with ``L_ij = beta_i e^{G_i - G_j} k_i . k_j`` for ``j < i``. Inverting
``I + L`` once per chunk (the UT transform) gives ``U = (I + L)^{-1} diag(beta) V`` and
``W = (I + L)^{-1} diag(beta e^G) K``, so ``D = U - W S_0``; then

    O   = (Q e^G) S_0 + (Q K^T * e^{G_i - G_j} * [j <= i]) D
    S_C = e^{G_C} S_0 + (K e^{G_C - G})^T D.

The inverse ``(I + L)^{-1}`` is built by recursive block inversion (matmuls
only). Everything except ``D = U - W S_0`` and the state update is computed for
all chunks at once (matmuls); the scan over chunks does two ``[C, K] x [K, V]``
matmuls per chunk. Every decay factor is ``exp`` of a difference of cumulative
log decays taken with the later position first (masked to ``-inf`` before the
``exp`` elsewhere), so it is ``<= 1``: log decays down to -20 per step
underflow to exact zeros and never overflow.

Segments (``segment_ids``) are exact resets: a segment start behaves like
``a_t = 0``. In the chunk and parallel forms this is a mask: pairs in
different segments are dropped from ``L`` and the in-chunk scores, only the
tokens that continue the previous chunk's last segment see ``S_0``, and only
the tokens of the chunk's last segment reach ``S_C``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from linear_attention.engines.delta import pallas as kernel
from linear_attention.engines import dispatch
from linear_attention import common
from linear_attention.engines import context as context_lib
from linear_attention.engines.context import SeqContext
from linear_attention.engines.delta import terms as delta_terms

Array = jax.Array

# ``form="auto"``: ``(values form, gradient form)`` per backend, else the chunk form both ways.
# On CPU the token scan computes the values faster and the chunk form differentiates faster
# (experiments/bench_delta_forms.py, results/bench_delta_forms_cpu.json);
# :func:`~linear_attention.common.with_gradient_of` runs the pair.
DEFAULT_FORMS: dict[str, tuple[str, str]] = {"cpu": ("recurrent", "chunk")}


def _check_inputs(q, k, v, beta, log_decay, form, chunk_size, initial_state, segment_ids):
  """The sequence op's checks; returns ``(B, T, Hv, K, V)`` (``Hv`` the value heads)."""
  b, t, _, dk, dv = common.check_qkv(q, k, v, grouped=True)
  h = v.shape[2]
  common.check_beta(beta, (b, t, h), "[B, T, Hv], Hv the heads of v")
  common.check_log_decay(log_decay, b, t, h, dk, per_channel=False)
  common.check_sequence_args(form, chunk_size, segment_ids, b, t, initial_state, (b, h, dk, dv),
                             auto=True)
  return b, t, h, dk, dv


def delta_rule(
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
    implementation: str | None = None,
    context: SeqContext | None = None,
):
  """The (gated) delta rule over a sequence.

  ``S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T`` with
  ``a_t = exp(log_decay_t)`` (1 without a gate), ``o_t = scale * S_t^T q_t``.

  Grouped value heads: ``q, k`` may have fewer heads ``Hk`` than ``v``'s ``Hv``
  (``Hv`` a multiple of ``Hk``, as Qwen3-Next's 16 key and 32 value heads); value
  head ``h`` reads query/key head ``h // (Hv // Hk)`` (transformers'
  ``repeat_interleave``), without repeating ``q, k`` in memory. ``beta``,
  ``log_decay`` and the state are per value head. ``H`` below is ``Hv``.

  Args:
    q: ``[B, T, Hk, K]`` queries.
    k: ``[B, T, Hk, K]`` keys, expected L2-normalised over ``K`` by the caller.
    v: ``[B, T, H, V]`` values (``H`` a multiple of ``Hk``).
    beta: ``[B, T, H]`` write strengths in ``[0, 2]`` (checked only when the
      value is concrete, i.e. not under ``jit``/``grad``/``vmap``).
    log_decay: None (DeltaNet) or ``[B, T, H]`` values ``<= 0``, ``-inf``
      included (Gated DeltaNet; same concreteness rule for the sign check: a
      traced gate is not checked, see
      :func:`~linear_attention.common.check_log_decay`).
    scale: output scale; ``None`` means ``K ** -0.5``.
    form: ``"auto"`` (default: on CPU the recurrent form's values with the chunk form's
      gradient, see :data:`DEFAULT_FORMS`; the chunk form elsewhere; no forward-mode
      derivative where the two differ), ``"chunk"`` (linear in T), ``"recurrent"`` or
      ``"parallel"``.
    chunk_size: chunk length of the chunk form (any ``T`` works: padded inside
      with ``beta = 0, k = 0``, which leaves the state unchanged); None: the backend's
      default (:func:`~linear_attention.engines.dispatch.resolve_chunk_size`, 64).
    initial_state: optional ``[B, H, K, V]`` state before the first token.
    return_state: also return the final state.
    segment_ids: optional ``[B, T]`` ints packing several sequences per row; no
      state crosses a change of id. ``initial_state`` applies to the first
      segment of each row, later segments start from zero; the returned state
      is that at the end of the row.
    implementation: ``None`` (the Pallas chunk kernel on a backend listed in
      ``engines.dispatch.PALLAS_DEFAULT_BACKENDS`` -- none yet -- when it
      supports the arguments, XLA otherwise and always on CPU), ``"xla"``, or
      ``"pallas"`` (:mod:`linear_attention.engines.delta.pallas`: XLA prepares
      every chunk's UT transform, the kernels run the sequential state pass and
      its reverse; on CPU in interpret mode, exact but slow). The kernel is the
      chunk form, with packed segments; another form, a dtype other than
      float32/bfloat16/float16 or a ``chunk_size`` the platform cannot tile (a
      power of two >= 16 on GPU, a multiple of 16 on TPU) makes ``"pallas"``
      raise a ``ValueError``.
    context: None, or a :class:`~linear_attention.ops.context.SeqContext` to run
      with the sequence split over a mesh axis: each device runs ``form`` once on
      its slice with ``K`` extra value columns that carry its transition, and the
      transitions are folded across devices
      (:func:`~linear_attention.engines.context.affine_call`); the same result up to
      rounding.

  Returns:
    ``o`` of shape ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)``
    with ``state`` ``[B, H, K, V]`` in float32 (float64 for float64 inputs).

  Gates, ``beta`` and ``initial_state`` may be in any floating dtype; all work
  is done in ``promote_types(q.dtype, float32)``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.PRNGKey(0), (3, 1, 10, 2, 4))
    >>> k = k / jnp.linalg.norm(k, axis=-1, keepdims=True)
    >>> beta = jnp.full((1, 10, 2), 0.5)
    >>> ops.delta_rule(q, k, v, beta).shape
    (1, 10, 2, 4)
  """
  context_lib.check_context(context)
  chunk_size = dispatch.resolve_chunk_size(chunk_size, "delta")
  b, t, _, dk, _ = _check_inputs(
      q, k, v, beta, log_decay, form, chunk_size, initial_state, segment_ids)
  if context is not None:
    context.check(b, t)
    context_lib.refuse_pallas(implementation)
    out = context_lib.affine_call(
        delta_rule, context, dict(q=q, k=k, v=v, beta=beta, log_decay=log_decay),
        initial_state=initial_state, segment_ids=segment_ids, return_state=return_state,
        static=(("scale", common.resolve_scale(scale, dk)), ("form", form),
                ("chunk_size", chunk_size), ("implementation", implementation)))
    return (out[0].astype(q.dtype), out[1]) if return_state else out.astype(q.dtype)
  unsupported = kernel.unsupported_arguments(q, beta, log_decay, segment_ids, chunk_size)
  if form not in ("auto", "chunk"):
    unsupported["form"] = f"{form!r} (the kernel is the chunk form)"
  if dispatch.resolve_implementation(implementation, unsupported):
    return kernel.chunk_delta_attention(
        q, k, v, beta, log_decay, scale=scale, chunk_size=chunk_size,
        initial_state=initial_state, return_state=return_state, segment_ids=segment_ids)
  scale = common.resolve_scale(scale, dk)
  named_form = form
  form, gradient_form = common.resolve_auto_form(form, DEFAULT_FORMS)
  # Only the chunk form depends on chunk_size: keep it out of the others' cache key.
  chunk_size = min(chunk_size, t) if "chunk" in (form, gradient_form) else 1
  with common.forward_mode_needs_a_form(named_form):
    o, state = _forward(q, k, v, beta, log_decay, initial_state, segment_ids, scale,
                        form=form, gradient_form=gradient_form, chunk_size=chunk_size)
  return (o, state) if return_state else o


@functools.partial(jax.jit, static_argnames=("form", "gradient_form", "chunk_size"))
def _forward(*args, form, gradient_form, chunk_size):
  """:func:`_forms` in ``form``, differentiated through ``gradient_form``. Jitted so that
  eager calls compile once per shape instead of dispatching every small op on its own."""
  return common.in_forms(_forms, form, gradient_form, chunk_size=chunk_size)(*args)


def _forms(q, k, v, beta, log_decay, initial_state, segment_ids, scale, *, form, chunk_size):
  """Checked inputs in, ``(o, state)`` out."""
  acc = common.acc_dtype(q.dtype)
  b, _, hk, dk = q.shape
  # Work in [B, Hk, G, T, *]: heads become batch axes of every matmul, and q, k (G = 1)
  # broadcast over the value heads of their group instead of being repeated.
  grouped = lambda x: None if x is None else common.group_heads(x, hk).astype(acc)
  qh, kh, vh, bh = (grouped(x) for x in (q, k, v, beta))
  qh = qh * jnp.asarray(scale, acc)
  g = common.floor_log_decay(grouped(log_decay))  # -inf would give inf - inf in the cumsums
  seg = None if segment_ids is None else common.segment_index(segment_ids)
  s0 = None if initial_state is None else _group_state(initial_state.astype(acc), hk)

  if form == "recurrent":
    o, state = _recurrent(qh, kh, vh, bh, g, s0, seg)
  elif form == "parallel":
    o, state = _parallel(qh, kh, vh, bh, g, s0, seg)
  else:
    o, state = _chunk(qh, kh, vh, bh, g, s0, seg, chunk_size)
  return common.ungroup_heads(o).astype(q.dtype), _ungroup_state(state)


def _group_state(x, hk):
  """``[B, Hv, *]`` -> ``[B, Hk, Hv // Hk, *]`` (a state, or one token's per-value-head input)."""
  return x.reshape((x.shape[0], hk, x.shape[1] // hk) + x.shape[2:])


def _ungroup_state(x):
  """The inverse of :func:`_group_state`."""
  return x.reshape((x.shape[0], x.shape[1] * x.shape[2]) + x.shape[3:])


def delta_rule_step(
    state: Array,
    q: Array,
    k: Array,
    v: Array,
    beta: Array,
    log_decay: Array | None = None,
    *,
    scale: float | None = None,
):
  """One token of the (gated) delta rule: decay, correct towards ``v``, read.

  Args:
    state: ``[B, H, K, V]`` (float32, or float64).
    q, k: ``[B, Hk, K]`` (``H`` a multiple of ``Hk``: grouped value heads, as in
      :func:`delta_rule`); v: ``[B, H, V]``; beta: ``[B, H]`` in ``[0, 2]``.
    log_decay: None or ``[B, H]``, values ``<= 0`` (checked when concrete only).
    scale: output scale; ``None`` means ``K ** -0.5``.

  Returns:
    ``(o, new_state)``: ``o`` ``[B, H, V]`` in the dtype of ``q``, the new
    state ``[B, H, K, V]`` in the state's dtype.

  Examples:
    >>> import jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q = k = v = jnp.full((1, 2, 4), 0.5)
    >>> o, state = ops.delta_rule_step(jnp.zeros((1, 2, 4, 4)), q, k, v, jnp.full((1, 2), 0.5))
    >>> o.shape, state.shape
    ((1, 2, 4), (1, 2, 4, 4))
  """
  common.check_step_state_first(state, "[B, H, K, V]", 4)
  b, _, dk, dv = common.check_step_qkv(q, k, v, grouped=True)
  h = v.shape[1]
  common.check_beta(beta, (b, h), "[B, Hv], Hv the heads of v")
  common.check_log_decay(log_decay, b, h, dk, per_channel=False)
  common.check_step_state("state", state, (b, h, dk, dv), "[B, H, K, V]")
  return _step_forward(q, k, v, beta, log_decay, state, common.resolve_scale(scale, dk))


@jax.jit
def _step_forward(q, k, v, beta, log_decay, state, scale):
  acc, hk = state.dtype, q.shape[1]
  grouped = lambda x: None if x is None else _group_state(x.astype(acc), hk)
  o, new_state = _step(
      q.astype(acc)[:, :, None] * jnp.asarray(scale, acc), k.astype(acc)[:, :, None],
      grouped(v), grouped(beta), grouped(log_decay), grouped(state))
  return _ungroup_state(o).astype(q.dtype), _ungroup_state(new_state)


def _step(q, k, v, beta, g, state):
  """Unchecked step on ``[B, Hk, G, *]`` arrays (``q, k`` with ``G = 1``); ``q`` scaled."""
  if g is not None:
    state = jnp.exp(g)[..., None, None] * state
  error = v - jnp.einsum("...k,...kv->...v", k, state)
  state = state + (beta[..., None] * k)[..., :, None] * error[..., None, :]
  return jnp.einsum("...k,...kv->...v", q, state), state


def _recurrent(qh, kh, vh, bh, g, s0, seg):
  """Token-by-token ``lax.scan``; inputs ``[B, Hk, G, T, *]`` (``qh, kh`` with ``G = 1``),
  ``bh, g`` ``[B, Hk, G, T]``."""
  t = qh.shape[3]
  state = common.zero_state(qh, vh) if s0 is None else s0
  starts = (jnp.zeros(qh.shape[:1] + (t,), bool) if seg is None
            else common.segment_starts(seg))
  move = lambda x: jnp.moveaxis(x, 3, 0)
  xs = (move(qh), move(kh), move(vh), move(bh), None if g is None else move(g), starts.T)

  def body(s, x):
    q_t, k_t, v_t, b_t, g_t, start = x
    # A segment start is a gate of exactly zero.
    s = jnp.where(start[:, None, None, None, None], 0.0, s)
    o_t, s = _step(q_t, k_t, v_t, b_t, g_t, s)
    return s, o_t

  state, o = common.remat_scan(body, state, xs)
  return jnp.moveaxis(o, 0, 3), state


def _parallel(qh, kh, vh, bh, g, s0, seg):
  """The ``T x T`` form; inputs as :func:`_chunk`'s.

  The chunk form's algebra (:func:`~linear_attention.engines.delta.terms.delta_chunk_terms`) with one
  chunk of length ``T``: pseudo-values ``D = (I + L)^{-1} (diag(beta) V - diag(beta e^G) K
  S_0)``, outputs ``O = A D + (Q e^G) S_0``, one causal ``T x T`` attention matrix.
  """
  return _chunk(qh, kh, vh, bh, g, s0, seg, qh.shape[3])


def _chunk(qh, kh, vh, bh, g, s0, seg, chunk_size):
  """WY / UT-transform chunkwise form; inputs ``[B, Hk, G, T, *]`` (``qh, kh`` with
  ``G = 1``, broadcast over the group), ``bh, g`` ``[B, Hk, G, T]``."""
  t = qh.shape[3]
  dv = vh.shape[-1]
  # Everything that does not depend on the entering state, for all chunks at once.
  qg, a, u, w, k_end, chunk_decay = delta_terms.delta_chunk_terms(qh, kh, vh, bh, g, seg, chunk_size)
  n, c = qg.shape[3:5]

  def body(state, x):
    u_n, w_n, k_n, a_n = x
    d = u_n - jnp.einsum("...ck,...kv->...cv", w_n, state)
    new = a_n[..., None, None] * state + jnp.einsum("...ck,...cv->...kv", k_n, d)
    return new, (state, d)

  init = common.zero_state(qh, vh) if s0 is None else s0
  move = lambda x: jnp.moveaxis(x, 3, 0)
  state, (entering, d) = lax.scan(
      body, init, (move(u), move(w), move(k_end), move(chunk_decay)))
  entering = jnp.moveaxis(entering, 0, 3)  # [B, Hk, G, N, K, V]: the state before each chunk
  d = jnp.moveaxis(d, 0, 3)  # [B, Hk, G, N, C, V]
  o = (jnp.einsum("...ik,...kv->...iv", qg, entering)
       + jnp.einsum("...ij,...jv->...iv", a, d))
  o = o.reshape(o.shape[:3] + (n * c, dv))[..., :t, :]
  return o, state
