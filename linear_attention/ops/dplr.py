"""The DPLR engine's variants: RWKV-7, Kimi Delta Attention and Gated DeltaProduct.

Each maps its inputs onto :func:`~linear_attention.engines.dplr.engine.dplr_attention`
(``S_t = (diag(exp(log_decay_t)) + a_t b_t^T) S_{t-1} + k_t v_t^T``) and calls it, as
:func:`~linear_attention.ops.gated.gla` calls the diagonal-decay engine:

* RWKV-7 (Peng et al. 2025): ``a = -(iclr * kappa_hat)``, ``b = kappa_hat``,
  ``k = k_tilde``, the decay ``w`` per channel, plus the bonus term.
* Kimi Delta Attention (Kimi Linear, 2025):
  ``S_t = (I - beta_t k_t k_t^T) diag(alpha_t) S_{t-1} + beta_t k_t v_t^T``, i.e.
  ``a = -beta k`` (``a=None``), ``b = alpha * k``, write key ``beta k``.
* Gated DeltaProduct (Siems et al. 2025): ``R`` Householder steps per token
  after one scalar gate (``a=None``, ``b = k`` with the gate on the first step's).

The engine, its forms and its defaults are re-exported here under their old names.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from linear_attention import common
from linear_attention.engines.context import SeqContext
from linear_attention.engines.dplr.engine import (  # noqa: F401  (the public engine)
    DEFAULT_FORMS, DEFAULT_PRODUCT_FORMS, dplr_attention, dplr_attention_step, resolve_chunk_size,
    resolve_form)
from linear_attention.engines.dplr.engine import per_value_head
from linear_attention.ops import delta as delta_ops

Array = jax.Array


def _check_like(name: str, x, expected, what: str) -> None:
  common.check_float(name, x)
  common.check_shape(name, x, expected, what)


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

  Examples:
    >>> import jax.numpy as jnp
    >>> from linear_attention import ops
    >>> r = k = v = jnp.ones((1, 10, 2, 4))
    >>> ops.rwkv7_bonus(r, k, v, jnp.full((2, 4), 0.25))[0, 0, 0]  # (r . (rho * k)) v
    Array([1., 1., 1., 1.], dtype=float32)
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

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> r, k, v, kappa = jax.random.normal(jax.random.PRNGKey(0), (4, 1, 10, 2, 4))
    >>> kappa = kappa / jnp.linalg.norm(kappa, axis=-1, keepdims=True)
    >>> log_w, a = jnp.full((1, 10, 2, 4), -0.1), jnp.full((1, 10, 2, 4), 0.5)
    >>> ops.rwkv7(r, k, v, log_w, kappa, a).shape
    (1, 10, 2, 4)
  """
  bsz, t, h, dk, dv = common.check_qkv(r, k, v, names=("r", "k", "v"))
  _check_rwkv7(r, k, v, log_w, kappa, a, bonus, (bsz, t, h))
  ea, eb = _rwkv7_ab(kappa, a, common.acc_dtype(r.dtype))
  o, state = dplr_attention(r, k, v, ea, eb, log_w, scale=scale, form=form,
                            chunk_size=chunk_size, initial_state=initial_state,
                            return_state=True, segment_ids=segment_ids,
                            implementation=implementation, context=context)
  if bonus is not None:
    o = (o.astype(common.acc_dtype(r.dtype)) + rwkv7_bonus(r, k, v, bonus)).astype(r.dtype)
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

  Examples:
    >>> import jax.numpy as jnp
    >>> from linear_attention import ops
    >>> r = k = v = kappa = a = jnp.full((1, 2, 4), 0.5)
    >>> log_w = jnp.full((1, 2, 4), -0.1)
    >>> o, state = ops.rwkv7_step(jnp.zeros((1, 2, 4, 4)), r, k, v, log_w, kappa, a)
    >>> o.shape
    (1, 2, 4)
  """
  common.check_step_state_first(state, "[B, H, K, V]", 4)
  bsz, h, dk, dv = common.check_step_qkv(r, k, v, names=("r", "k", "v"))
  common.check_step_state("state", state, (bsz, h, dk, dv), "[B, H, K, V]")
  _check_rwkv7(r, k, v, log_w, kappa, a, bonus, (bsz, h))
  ea, eb = _rwkv7_ab(kappa, a, state.dtype)
  o, state = dplr_attention_step(state, r, k, v, ea, eb, log_w, scale=scale)
  if bonus is not None:
    o = (o.astype(state.dtype) + rwkv7_bonus(r, k, v, bonus).astype(state.dtype)).astype(r.dtype)
  return o, state


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

  Grouped value heads: ``q, k`` may have fewer heads ``Hk`` than ``v``'s ``H`` (a
  multiple of ``Hk``; value head ``h`` reads query/key head ``h // (H // Hk)``, as in
  :func:`dplr_attention`); ``beta``, ``log_alpha`` and the state are per value head.

  Args:
    q, k: ``[B, T, Hk, K]`` (keys L2-normalised by the caller, or ``normalize_qk``).
    v: ``[B, T, H, V]``.
    beta: ``[B, T, H]`` write strengths in ``[0, 2]`` (checked when concrete).
    log_alpha: ``[B, T, H, K]`` per-channel log decay ``<= 0``, ``-inf``
      included (checked when concrete).
    scale, form, chunk_size, initial_state, return_state, segment_ids, implementation, context: as in
      :func:`dplr_attention`.
    normalize_qk: L2-normalise ``q`` and ``k`` over ``K`` here.

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.PRNGKey(0), (3, 1, 10, 2, 4))
    >>> beta, log_alpha = jnp.full((1, 10, 2), 0.5), jnp.full((1, 10, 2, 4), -0.1)
    >>> ops.kda(q, k, v, beta, log_alpha, normalize_qk=True).shape
    (1, 10, 2, 4)
  """
  bsz, t, _, dk, dv = common.check_qkv(q, k, v, grouped=True)
  h = v.shape[2]
  common.check_beta(beta, (bsz, t, h), "[B, T, Hv], Hv the heads of v")
  common.check_log_decay(log_alpha, bsz, t, h, dk, name="log_alpha", per_head=False)
  if normalize_qk:
    q, k = delta_ops.l2_normalize(q), delta_ops.l2_normalize(k)
  # beta k and alpha k are per value head: k meets them once per value head of its group.
  wk, _, eb = _kda_map(per_value_head(k, h), beta, log_alpha, common.acc_dtype(q.dtype))
  return dplr_attention(q, wk, v, None, eb, log_alpha, scale=scale, form=form,  # a = -wk
                        chunk_size=chunk_size, initial_state=initial_state,
                        return_state=return_state, segment_ids=segment_ids,
                        implementation=implementation, context=context)


def kda_step(state: Array, q: Array, k: Array, v: Array, beta: Array, log_alpha: Array, *,
             scale: float | None = None, normalize_qk: bool = False):
  """One token of :func:`kda`: ``S = (I - beta k k^T) diag(alpha) S + beta k v^T``.

  Args: state ``[B, H, K, V]`` float32; q, k ``[B, Hk, K]`` (grouped value heads as in
  :func:`kda`); v ``[B, H, V]``; beta ``[B, H]`` in ``[0, 2]``; log_alpha ``[B, H, K]``
  ``<= 0``.

  Returns: ``(o [B, H, V] in the dtype of q, new_state [B, H, K, V])``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q = k = v = jnp.full((1, 2, 4), 0.5)
    >>> beta, log_alpha = jnp.full((1, 2), 0.5), jnp.full((1, 2, 4), -0.1)
    >>> o, state = ops.kda_step(jnp.zeros((1, 2, 4, 4)), q, k, v, beta, log_alpha)
    >>> o.shape
    (1, 2, 4)
  """
  common.check_step_state_first(state, "[B, H, K, V]", 4)
  bsz, _, dk, dv = common.check_step_qkv(q, k, v, grouped=True)
  h = v.shape[1]
  common.check_beta(beta, (bsz, h), "[B, Hv], Hv the heads of v")
  common.check_log_decay(log_alpha, bsz, h, dk, name="log_alpha", per_head=False)
  common.check_step_state("state", state, (bsz, h, dk, dv), "[B, H, K, V]")
  if normalize_qk:
    q, k = delta_ops.l2_normalize(q), delta_ops.l2_normalize(k)
  wk, _, eb = _kda_map(per_value_head(k, h, axis=1), beta, log_alpha, state.dtype)
  return dplr_attention_step(state, q, wk, v, None, eb, log_alpha, scale=scale)


# ------------------------------------------------------------------ Gated DeltaProduct


def _check_deltaproduct(q, k, v, beta, log_decay, lead):
  """``lead`` is ``(B, T, Hk)`` or ``(B, H)`` (from ``q``); returns ``(R, V, H)``, ``H`` the
  value heads (a multiple of ``Hk``: grouped value heads)."""
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
  if jnp.ndim(v) == rank:  # a wrong rank of v is named below
    heads = common.check_value_groups("v", v.shape[len(lead) - 1], lead[-1], "q and k")
    lead = lead[:-1] + (lead[-1] * heads,)
  common.check_shape("v", v, lead + (r, None), "B, T of q, the value heads and the R of k")
  common.check_same_dtype(q=q, k=k, v=v)
  common.check_beta(beta, lead + (r,), "[B, T, H, R]" if len(lead) == 3 else "[B, H, R]")
  common.check_log_decay(log_decay, *lead, dk, per_channel=False)
  return r, v.shape[-1], lead[-1]


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

  Grouped value heads: ``q, k`` may have fewer heads ``Hk`` than ``v``'s ``H`` (as in
  :func:`kda`); ``beta``, ``log_decay`` and the state are per value head.

  Args:
    q: ``[B, T, Hk, K]``.
    k: ``[B, T, Hk, R, K]`` keys per step (L2-normalised by the caller, or
      ``normalize_qk``).
    v: ``[B, T, H, R, V]``.
    beta: ``[B, T, H, R]`` in ``[0, 2]`` (checked when concrete).
    log_decay: None or ``[B, T, H]`` (one gate per head and token), ``<= 0``.
    scale, form, chunk_size (tokens; ``R`` sub-steps each), initial_state,
      return_state, segment_ids, implementation, context: as in :func:`dplr_attention`.
    normalize_qk: L2-normalise ``q`` and every ``k`` over ``K`` here.

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q = jax.random.normal(jax.random.PRNGKey(0), (1, 10, 2, 4))
    >>> k, v = jax.random.normal(jax.random.PRNGKey(1), (2, 1, 10, 2, 3, 4))  # R = 3
    >>> beta, log_decay = jnp.full((1, 10, 2, 3), 0.5), jnp.full((1, 10, 2), -0.1)
    >>> ops.gated_deltaproduct(q, k, v, beta, log_decay, normalize_qk=True).shape
    (1, 10, 2, 4)
  """
  common.check_float("q", q)
  common.check_rank("q", q, 4)
  bsz, t, h, dk = q.shape
  common.check_seq_len(t, "axis 1 of q")
  _, dv, h = _check_deltaproduct(q, k, v, beta, log_decay, (bsz, t, h))
  if normalize_qk:
    q, k = delta_ops.l2_normalize(q), delta_ops.l2_normalize(k)
  wk, _, eb = _deltaproduct_map(per_value_head(k, h), beta, log_decay,
                                common.acc_dtype(q.dtype))
  return dplr_attention(q, wk, v, None, eb, log_decay, scale=scale, form=form,  # a = -wk
                        chunk_size=chunk_size, initial_state=initial_state,
                        return_state=return_state, segment_ids=segment_ids,
                        implementation=implementation, context=context)


def gated_deltaproduct_step(state: Array, q: Array, k: Array, v: Array, beta: Array,
                            log_decay: Array | None = None, *, scale: float | None = None,
                            normalize_qk: bool = False):
  """One token of :func:`gated_deltaproduct`.

  Args: state ``[B, H, K, V]`` float32; q ``[B, Hk, K]``; k ``[B, Hk, R, K]`` (grouped
  value heads as in :func:`gated_deltaproduct`);
  v ``[B, H, R, V]``; beta ``[B, H, R]`` in ``[0, 2]``; log_decay None or
  ``[B, H]`` ``<= 0``.

  Returns: ``(o [B, H, V] in the dtype of q, new_state [B, H, K, V])``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q = jnp.full((1, 2, 4), 0.5)
    >>> k = v = jnp.full((1, 2, 3, 4), 0.5)  # R = 3 steps
    >>> beta = jnp.full((1, 2, 3), 0.5)
    >>> o, state = ops.gated_deltaproduct_step(jnp.zeros((1, 2, 4, 4)), q, k, v, beta)
    >>> o.shape
    (1, 2, 4)
  """
  common.check_step_state_first(state, "[B, H, K, V]", 4)
  common.check_float("q", q)
  common.check_rank("q", q, 3)
  bsz, h, dk = q.shape
  _, dv, h = _check_deltaproduct(q, k, v, beta, log_decay, (bsz, h))
  common.check_step_state("state", state, (bsz, h, dk, dv), "[B, H, K, V]")
  if normalize_qk:
    q, k = delta_ops.l2_normalize(q), delta_ops.l2_normalize(k)
  wk, _, eb = _deltaproduct_map(per_value_head(k, h, axis=1), beta, log_decay, state.dtype)
  return dplr_attention_step(state, q, wk, v, None, eb, log_decay, scale=scale)
