"""Gated and decayed linear attention: GLA, RetNet, HGRN2, RWKV-6, Mamba-2 (SSD).

Each op builds the engine's ``q, k, v`` and log decay from its own
parametrisation and calls :func:`linear_attention.ops.decay.decay_linear_attention`
(forms ``parallel``, ``chunk``, ``recurrent``) or its step::

    op          engine q, k, v            engine log decay          default scale
    gla         q, k, v                   log_g    [B,T,H,K]        K ** -0.5
    retention   q, k, v                   log gamma_h  [B,T,H]      K ** -0.5
    hgrn2       q, 1 - exp(log_f), v      log_f    [B,T,H,K]        1
    rwkv6       r, k and v one step late  log_w one step late       1 (+ bonus u)
    ssd         C, B, dt * x              A * dt   [B,T,H]          1 (+ skip D)

The shared arguments (``form``, ``chunk_size``, ``initial_state``,
``return_state``, ``segment_ids``) mean what they mean for the engine. Every
state is float32 ``[B, H, K, V]``; outputs come back in the input dtype.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from linear_attention import common
from linear_attention.ops import decay
from linear_attention.engines.context import SeqContext

Array = jax.Array


def _check_param(name: str, x: Array, expected, what: str) -> None:
  common.check_float(name, x)
  common.check_shape(name, x, expected, what)


# --------------------------------------------------------------------------- GLA


def gla(q: Array, k: Array, v: Array, log_g: Array, *, scale: float | None = None,
        form: str = "auto", chunk_size: int | None = None, initial_state: Array | None = None,
        return_state: bool = False, segment_ids: Array | None = None,
        implementation: str | None = None, context: SeqContext | None = None):
  """Gated linear attention (Yang et al. 2023, arXiv:2312.06635).

  ``S_t = diag(exp(log_g_t)) S_{t-1} + k_t v_t^T``, ``o_t = scale * S_t^T q_t``.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    log_g: ``[B, T, H, K]`` data-dependent forget gate per key channel, in log
      space (``<= 0``, ``-inf`` allowed; GLA uses ``logsigmoid(x) / 16``); the
      sign is checked only when concrete (not under ``jit``/``grad``/``vmap``; see
      :func:`~linear_attention.common.check_log_decay`).
    scale: ``None`` means ``K ** -0.5``.
    form, chunk_size, initial_state (``[B, H, K, V]``), return_state,
      segment_ids: as in :func:`~linear_attention.ops.decay.decay_linear_attention`.
    implementation: ``None``, ``"xla"`` or ``"pallas"``: the engine's kernel
      choice (see :func:`~linear_attention.ops.decay.decay_linear_attention`).
    context: None, or a :class:`~linear_attention.ops.context.SeqContext`: the
      sequence split over a mesh axis (as in the engine).

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)`` with the
    float32 state ``[B, H, K, V]``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.PRNGKey(0), (3, 1, 10, 2, 4))
    >>> log_g = jax.nn.log_sigmoid(jnp.full((1, 10, 2, 4), 2.0))  # per key channel
    >>> ops.gla(q, k, v, log_g).shape
    (1, 10, 2, 4)
  """
  b, t, h, dk, _ = common.check_qkv(q, k, v)
  common.check_log_decay(log_g, b, t, h, dk, name="log_g", per_head=False)
  return decay.decay_linear_attention(
      q, k, v, log_g, scale=scale, form=form, chunk_size=chunk_size,
      initial_state=initial_state, return_state=return_state, segment_ids=segment_ids,
      implementation=implementation, context=context)


def gla_step(state: Array, q: Array, k: Array, v: Array, log_g: Array, *,
             scale: float | None = None):
  """One decoding step of :func:`gla`.

  Args:
    state: ``[B, H, K, V]`` float32;
    q, k: ``[B, H, K]``; v: ``[B, H, V]``;
    log_g: ``[B, H, K]`` (``<= 0``; the sign is checked as in :func:`gla`);
    scale: ``None`` means ``K ** -0.5``.

  Returns:
    ``(o, new_state)``: ``o`` ``[B, H, V]`` in the dtype of ``q``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> log_g = jax.nn.log_sigmoid(jax.random.normal(jax.random.key(1), (1, 8, 2, 4)))
    >>> _, state = ops.gla(q[:, :7], k[:, :7], v[:, :7], log_g[:, :7], return_state=True)
    >>> o, state = ops.gla_step(state, q[:, 7], k[:, 7], v[:, 7], log_g[:, 7])
    >>> o.shape, state.shape
    ((1, 2, 4), (1, 2, 4, 4))
    >>> bool(jnp.allclose(o, ops.gla(q, k, v, log_g)[:, 7], atol=1e-5))  # the sequence's last token
    True
  """
  common.check_step_state_first(state, "[B, H, K, V]", 4)
  b, h, dk, _ = common.check_step_qkv(q, k, v)
  common.check_log_decay(log_g, b, h, dk, name="log_g", per_head=False)
  return decay.decay_linear_attention_step(state, q, k, v, log_g, scale=scale)


# ------------------------------------------------------------------------ RetNet


def retnet_gammas(num_heads: int) -> Array:
  """RetNet's multi-scale decays ``gamma_h = 1 - 2 ** (-5 - h)`` for ``h < H``: ``[H]`` float32.

  From ``h = 20`` on, ``gamma_h`` rounds to 1 in float32; :func:`retention`
  with ``gamma=None`` takes the logs in float64 and stays exact.

  Examples:
    >>> from linear_attention import ops
    >>> ops.retnet_gammas(3).tolist()  # 1 - 2 ** (-5 - h)
    [0.96875, 0.984375, 0.9921875]
  """
  common.check_positive_int("num_heads", num_heads)
  return jnp.asarray(1.0 - 2.0 ** (-5.0 - np.arange(num_heads)), jnp.float32)


def _retention_log_gamma(gamma: Array | None, heads: int) -> Array:
  """``[H]`` ``log(gamma)`` (float32 or wider); the default via ``log1p`` in float64."""
  if gamma is None:
    return jnp.asarray(np.log1p(-(2.0 ** (-5.0 - np.arange(heads)))), jnp.float32)
  _check_param("gamma", gamma, (heads,), "[H], one decay per head")
  c = common.concrete(gamma)
  if c is not None and not (np.all(c > 0) and np.all(c < 1)):  # NaN fails too
    raise ValueError(f"gamma must lie in (0, 1), got values from {np.min(c)} to {np.max(c)}.")
  return jnp.log(gamma.astype(common.acc_dtype(gamma.dtype)))


def retention(q: Array, k: Array, v: Array, *, gamma: Array | None = None,
              scale: float | None = None, form: str = "auto", chunk_size: int | None = None,
              initial_state: Array | None = None, return_state: bool = False,
              segment_ids: Array | None = None,
              implementation: str | None = None, context: SeqContext | None = None):
  """RetNet retention, recurrent view (Sun et al. 2023, arXiv:2307.08621).

  ``S_t = gamma_h S_{t-1} + k_t v_t^T``, ``o_t = scale * S_t^T q_t``, a fixed
  decay per head. The xPos rotation and the group norm belong to the layer.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    gamma: ``[H]`` decays in ``(0, 1)``; ``None`` means :func:`retnet_gammas`.
    scale: ``None`` means ``K ** -0.5``.
    form, chunk_size, initial_state (``[B, H, K, V]``), return_state,
      segment_ids: as in :func:`~linear_attention.ops.decay.decay_linear_attention`.
    implementation: ``None``, ``"xla"`` or ``"pallas"``: the engine's kernel
      choice (see :func:`~linear_attention.ops.decay.decay_linear_attention`).
    context: None, or a :class:`~linear_attention.ops.context.SeqContext`: the
      sequence split over a mesh axis (as in the engine).

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)``.

  Examples:
    >>> import jax
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.PRNGKey(0), (3, 1, 10, 2, 4))
    >>> ops.retention(q, k, v).shape  # RetNet's fixed decay per head
    (1, 10, 2, 4)
  """
  b, t, h, _, _ = common.check_qkv(q, k, v)
  log_decay = jnp.broadcast_to(_retention_log_gamma(gamma, h), (b, t, h))
  return decay.decay_linear_attention(
      q, k, v, log_decay, scale=scale, form=form, chunk_size=chunk_size,
      initial_state=initial_state, return_state=return_state, segment_ids=segment_ids,
      implementation=implementation, context=context)


def retention_step(state: Array, q: Array, k: Array, v: Array, *, gamma: Array | None = None,
                   scale: float | None = None):
  """One decoding step of :func:`retention`.

  Args:
    state: ``[B, H, K, V]`` float32;
    q, k: ``[B, H, K]``; v: ``[B, H, V]``;
    gamma: ``[H]`` or ``None`` (:func:`retnet_gammas`); scale: ``None`` means ``K ** -0.5``.

  Returns:
    ``(o, new_state)``: ``o`` ``[B, H, V]`` in the dtype of ``q``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> _, state = ops.retention(q[:, :7], k[:, :7], v[:, :7], return_state=True)
    >>> o, state = ops.retention_step(state, q[:, 7], k[:, 7], v[:, 7])
    >>> o.shape, state.shape
    ((1, 2, 4), (1, 2, 4, 4))
    >>> bool(jnp.allclose(o, ops.retention(q, k, v)[:, 7], atol=1e-5))
    True
  """
  common.check_step_state_first(state, "[B, H, K, V]", 4)
  b, h, _, _ = common.check_step_qkv(q, k, v)
  log_decay = jnp.broadcast_to(_retention_log_gamma(gamma, h), (b, h))
  return decay.decay_linear_attention_step(state, q, k, v, log_decay, scale=scale)


# ------------------------------------------------------------------------- HGRN2


def _hgrn2_key(log_f: Array, dtype) -> Array:
  # 1 - f through expm1: exact for f close to 1, where the key is small.
  return (-jnp.expm1(log_f.astype(common.acc_dtype(log_f.dtype)))).astype(dtype)


def hgrn2(q: Array, log_f: Array, v: Array, *, scale: float | None = 1.0,
          form: str = "auto", chunk_size: int | None = None, initial_state: Array | None = None,
          return_state: bool = False, segment_ids: Array | None = None,
          implementation: str | None = None, context: SeqContext | None = None):
  """HGRN2 (Qin et al. 2024, arXiv:2404.07904): the forget gate doubles as the key.

  ``S_t = diag(f_t) S_{t-1} + (1 - f_t) v_t^T``, ``o_t = scale * S_t^T q_t``,
  ``f_t = exp(log_f_t)``. ``scale=1`` as in the paper (fla's layer keeps
  ``chunk_gla``'s ``K ** -0.5``; an RMSNorm follows in both).

  Args:
    q: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    log_f: ``[B, T, H, K]`` forget gate in log space (``<= 0``; HGRN2 uses
      ``logsigmoid``, with a lower bound in layers above the first); the sign
      is checked only when concrete (not under ``jit``/``grad``/``vmap``; see
      :func:`~linear_attention.common.check_log_decay`).
    scale: output scale; ``None`` means ``K ** -0.5``.
    form, chunk_size, initial_state (``[B, H, K, V]``), return_state,
      segment_ids: as in :func:`~linear_attention.ops.decay.decay_linear_attention`.
    implementation: ``None``, ``"xla"`` or ``"pallas"``: the engine's kernel
      choice (see :func:`~linear_attention.ops.decay.decay_linear_attention`).
    context: None, or a :class:`~linear_attention.ops.context.SeqContext`: the
      sequence split over a mesh axis (as in the engine).

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> log_f = jax.nn.log_sigmoid(jax.random.normal(jax.random.key(1), (1, 8, 2, 4)))
    >>> o = ops.hgrn2(q, log_f, v)  # the key is 1 - f
    >>> o.shape
    (1, 8, 2, 4)
    >>> bool(jnp.allclose(o, ops.hgrn2(q, log_f, v, form="recurrent"), atol=1e-5))
    True
  """
  b, t, h, dk, _ = common.check_qkv(q, q, v)
  common.check_log_decay(log_f, b, t, h, dk, name="log_f", per_head=False)
  return decay.decay_linear_attention(
      q, _hgrn2_key(log_f, q.dtype), v, log_f, scale=scale, form=form,
      chunk_size=chunk_size, initial_state=initial_state, return_state=return_state,
      segment_ids=segment_ids, implementation=implementation, context=context)


def hgrn2_step(state: Array, q: Array, log_f: Array, v: Array, *, scale: float | None = 1.0):
  """One decoding step of :func:`hgrn2`.

  Args:
    state: ``[B, H, K, V]`` float32;
    q: ``[B, H, K]``; log_f: ``[B, H, K]`` (``<= 0``, checked as in :func:`hgrn2`);
    v: ``[B, H, V]``; scale: as in :func:`hgrn2`.

  Returns:
    ``(o, new_state)``: ``o`` ``[B, H, V]`` in the dtype of ``q``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> log_f = jax.nn.log_sigmoid(jax.random.normal(jax.random.key(1), (1, 8, 2, 4)))
    >>> _, state = ops.hgrn2(q[:, :7], log_f[:, :7], v[:, :7], return_state=True)
    >>> o, state = ops.hgrn2_step(state, q[:, 7], log_f[:, 7], v[:, 7])
    >>> o.shape
    (1, 2, 4)
    >>> bool(jnp.allclose(o, ops.hgrn2(q, log_f, v)[:, 7], atol=1e-5))
    True
  """
  common.check_step_state_first(state, "[B, H, K, V]", 4)
  b, h, dk, _ = common.check_step_qkv(q, q, v)
  common.check_log_decay(log_f, b, h, dk, name="log_f", per_head=False)
  return decay.decay_linear_attention_step(
      state, q, _hgrn2_key(log_f, q.dtype), v, log_f, scale=scale)


# ------------------------------------------------------------------------ RWKV-6


def rwkv6(r: Array, k: Array, v: Array, log_w: Array, u: Array, *, scale: float | None = 1.0,
          form: str = "auto", chunk_size: int | None = None, initial_state: Array | None = None,
          return_state: bool = False, segment_ids: Array | None = None,
          implementation: str | None = None, context: SeqContext | None = None):
  """RWKV-6 "Finch" time mixing (Peng et al. 2024, arXiv:2404.05892).

  ``o_t = scale * r_t^T (S_{t-1} + diag(u) k_t v_t^T)``,
  ``S_t = diag(exp(log_w_t)) S_{t-1} + k_t v_t^T``: as in fla's
  ``naive_recurrent_rwkv6``, the output reads the state before step ``t``'s
  decay, so ``k_j v_j^T`` (``j < t``) reaches ``o_t`` decayed by
  ``exp(log_w_{j+1} + ... + log_w_{t-1})``, and token ``t`` itself enters only
  through the bonus ``u``. ``initial_state`` is ``S_{-1}``; the returned state
  is ``S_{T-1}``.

  On the engine: with ``k``, ``v`` and ``log_w`` shifted one step later (zero
  at ``t = 0`` and at segment starts), the engine's state after step ``t`` is
  ``S_{t-1}``; the bonus is elementwise, and one engine step gives ``S_{T-1}``.

  Args:
    r (receptance), k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    log_w: ``[B, T, H, K]`` data-dependent decay in log space (``<= 0``; RWKV-6
      uses ``-exp(w)``); the sign is checked only when concrete (not under
      ``jit``/``grad``/``vmap``; see
      :func:`~linear_attention.common.check_log_decay`).
    u: ``[H, K]`` bonus for the current token.
    scale: ``1.0`` as in RWKV; ``None`` means ``K ** -0.5``.
    form, chunk_size, initial_state (``[B, H, K, V]``), return_state,
      segment_ids: as in :func:`~linear_attention.ops.decay.decay_linear_attention`.
    implementation: ``None``, ``"xla"`` or ``"pallas"``: the engine's kernel
      choice (see :func:`~linear_attention.ops.decay.decay_linear_attention`).
    context: None, or a :class:`~linear_attention.ops.context.SeqContext`: the
      sequence split over a mesh axis (as in the engine).

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``r``, or ``(o, state)``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> log_w = -jnp.exp(jax.random.normal(jax.random.key(1), (1, 8, 2, 4)))
    >>> u = jnp.full((2, 4), 0.5)  # the current token's bonus
    >>> o = ops.rwkv6(q, k, v, log_w, u)
    >>> o.shape
    (1, 8, 2, 4)
    >>> bool(jnp.allclose(o, ops.rwkv6(q, k, v, log_w, u, form="parallel"), atol=1e-5))
    True
  """
  b, t, h, dk, _ = common.check_qkv(r, k, v, names=("r", "k", "v"))
  common.check_log_decay(log_w, b, t, h, dk, name="log_w", per_head=False)
  _check_param("u", u, (h, dk), "[H, K]")
  common.check_segment_ids(segment_ids, b, t)
  if context is not None and context.is_local:
    # The one-step shift below would need the previous device's last token.
    raise ValueError("context: rwkv6 shifts k, v and log_w one token later across device "
                     "edges; call it on the global arrays (outside jax.shard_map), not on "
                     f"local slices of mesh axis {context.axis_name!r}.")
  scale = common.resolve_scale(scale, dk)
  acc = common.acc_dtype(r.dtype)
  r32, k32, v32 = (x.astype(acc) for x in (r, k, v))

  late = lambda x: jnp.concatenate([jnp.zeros_like(x[:, :1]), x[:, :-1]], axis=1)
  k_late = late(k32)
  if segment_ids is not None:
    # The first token of a segment must not inherit the previous segment's key.
    k_late = jnp.where(common.segment_starts(segment_ids)[..., None, None], 0.0, k_late)
  o, state = decay.decay_linear_attention(
      r32, k_late, late(v32), late(log_w), scale=scale, form=form, chunk_size=chunk_size,
      initial_state=initial_state, return_state=True, segment_ids=segment_ids,
      implementation=implementation, context=context)
  bonus = jnp.sum(r32 * u.astype(acc) * k32, axis=-1, keepdims=True) * v32
  o = (o + scale * bonus).astype(r.dtype)
  if not return_state:
    return o
  _, state = decay.decay_linear_attention_step(
      state, r32[:, -1], k32[:, -1], v32[:, -1], log_w[:, -1], scale=scale)
  return o, state


def rwkv6_step(state: Array, r: Array, k: Array, v: Array, log_w: Array, u: Array, *,
               scale: float | None = 1.0):
  """One decoding step of :func:`rwkv6`: read with the bonus, then decay and add.

  Args:
    state: ``[B, H, K, V]`` float32 (``S_{t-1}``);
    r, k: ``[B, H, K]``; v: ``[B, H, V]``; log_w: ``[B, H, K]`` (``<= 0``, checked as in
    :func:`rwkv6`); u: ``[H, K]``;
    scale: as in :func:`rwkv6`.

  Returns:
    ``(o, new_state)``: ``o`` ``[B, H, V]`` in the dtype of ``r``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> log_w = -jnp.exp(jax.random.normal(jax.random.key(1), (1, 8, 2, 4)))
    >>> u = jnp.full((2, 4), 0.5)
    >>> _, state = ops.rwkv6(q[:, :7], k[:, :7], v[:, :7], log_w[:, :7], u, return_state=True)
    >>> o, state = ops.rwkv6_step(state, q[:, 7], k[:, 7], v[:, 7], log_w[:, 7], u)
    >>> o.shape
    (1, 2, 4)
    >>> bool(jnp.allclose(o, ops.rwkv6(q, k, v, log_w, u)[:, 7], atol=1e-5))
    True
  """
  common.check_step_state_first(state, "[B, H, K, V]", 4)
  b, h, dk, _ = common.check_step_qkv(r, k, v, names=("r", "k", "v"))
  common.check_step_state("state", state, (b, h, dk, v.shape[-1]), "[B, H, K, V]")
  common.check_log_decay(log_w, b, h, dk, name="log_w", per_head=False)
  _check_param("u", u, (h, dk), "[H, K]")
  _, new_state = decay.decay_linear_attention_step(state, r, k, v, log_w, scale=scale)
  acc = state.dtype
  r32, k32, v32 = (x.astype(acc) for x in (r, k, v))
  read = state + (u.astype(acc) * k32)[..., None] * v32[..., None, :]
  o = common.resolve_scale(scale, r.shape[-1]) * jnp.einsum("bhk,bhkv->bhv", r32, read)
  return o.astype(r.dtype), new_state


# ------------------------------------------------------------------ Mamba-2 (SSD)


def _ssd_inputs(x, dt, A, B, C, D, dt_bias, dt_softplus):
  """Validates Mamba-2 inputs (``x`` ``[*lead, H, P]``) and maps them onto the engine.

  Returns ``(q, k, v, log_decay, skip)`` in the accumulation dtype.
  """
  lead, h = x.shape[:-2], x.shape[-2]
  common.check_float("x", x)
  _check_param("dt", dt, lead + (h,), "the leading axes and heads of x")
  _check_param("A", A, (h,), "[H], one rate per head of x")
  _check_param("B", B, lead + (None, None), "[..., G, N] with the leading axes of x")
  common.check_float("C", C)
  if jnp.ndim(C) == jnp.ndim(B) and C.shape[-2] != B.shape[-2]:
    raise ValueError(
        f"B and C must have the same number of groups, got {B.shape[-2]} (B) and "
        f"{C.shape[-2]} (C).")
  common.check_shape("C", C, B.shape, "the shape of B")
  groups = B.shape[-2]
  if h % groups:
    raise ValueError(
        f"the number of groups of B and C must divide the heads of x ({h}), got {groups}.")
  for name, p in (("D", D), ("dt_bias", dt_bias)):
    if p is not None:
      _check_param(name, p, (h,), "[H], one per head of x")

  acc = common.acc_dtype(x.dtype)
  dt = dt.astype(acc) if dt_bias is None else dt.astype(acc) + dt_bias.astype(acc)
  if dt_softplus:
    dt = jax.nn.softplus(dt)
  # NaN is refused here, under the caller's names: as a log decay it would pass for -inf.
  common.check_range("A", A, high=0.0, strict=True, what="Mamba-2's -exp(A_log)")
  common.check_range("dt", dt, low=0.0, what="after dt_bias and softplus")

  # Head h reads group h // (H / G), Mamba-2's order.
  per_head = lambda m: jnp.repeat(m.astype(acc), h // groups, axis=-2)
  x32 = x.astype(acc)
  skip = 0.0 if D is None else x32 * D.astype(acc)[:, None]
  # A = -inf is a decay of exactly 0 for dt > 0 and none for dt = 0 (no step),
  # never 0 * -inf = NaN; no gradient goes through the infinite branch (the
  # double where).
  finite = jnp.isfinite(A)
  hard = jnp.where(dt > 0, -jnp.inf, 0.0)
  log_decay = jnp.where(finite, dt * jnp.where(finite, A.astype(acc), 0.0), hard)
  return per_head(C), per_head(B), x32 * dt[..., None], log_decay, skip


def ssd(x: Array, dt: Array, A: Array, B: Array, C: Array, D: Array | None = None, *,
        dt_bias: Array | None = None, dt_softplus: bool = False, scale: float | None = 1.0,
        form: str = "auto", chunk_size: int | None = None, initial_state: Array | None = None,
        return_state: bool = False, segment_ids: Array | None = None,
        implementation: str | None = None, context: SeqContext | None = None):
  """Mamba-2's state-space duality layer core, SSD (Dao & Gu 2024, arXiv:2405.21060).

  ``h_t = exp(dt_t A) h_{t-1} + B_t (dt_t x_t)^T``, ``y_t = h_t^T C_t + D x_t``
  per head, with a scalar decay per head and step. On the engine:
  ``q = C``, ``k = B``, ``v = dt * x``, ``log_decay = A * dt``, scale 1.

  Args (``batch`` is the batch size, written so to keep ``B`` for the input):
    x: ``[batch, T, H, P]`` inputs (``P`` the head dim).
    dt: ``[batch, T, H]`` step sizes, ``>= 0`` after ``dt_bias`` and softplus.
    A: ``[H]`` negative per-head rates (Mamba-2's ``-exp(A_log)``); ``-inf``
      is a decay of exactly zero at every step with ``dt > 0`` (none at
      ``dt = 0``). The signs of ``A`` and ``dt`` are checked only when
      concrete (not under ``jit``/``grad``/``vmap``; see
      :func:`~linear_attention.common.check_log_decay`).
    B, C: ``[batch, T, G, N]`` input and output projections, shared by the
      ``H / G`` heads of a group (head ``h`` reads group ``h // (H / G)``).
    D: optional ``[H]`` skip connection.
    dt_bias: optional ``[H]`` added to ``dt``; dt_softplus: then apply
      softplus (Mamba-2's ``dt_bias`` and ``dt_softplus``; no ``dt_limit``).
    scale: output scale of the ``C`` read; ``1`` as in Mamba-2.
    form, chunk_size, return_state, segment_ids: as in
      :func:`~linear_attention.ops.decay.decay_linear_attention`.
    initial_state: ``[batch, H, N, P]`` float32 (Mamba-2's kernels store the
      transpose, ``[batch, H, P, N]``).
    implementation: ``None``, ``"xla"`` or ``"pallas"``: the engine's kernel
      choice (see :func:`~linear_attention.ops.decay.decay_linear_attention`).
    context: None, or a :class:`~linear_attention.ops.context.SeqContext`: the
      sequence split over a mesh axis (as in the engine).

  Returns:
    ``y`` ``[batch, T, H, P]`` in the dtype of ``x``, or ``(y, state)`` with
    the state ``[batch, H, N, P]`` in float32.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> x = jax.random.normal(jax.random.key(0), (1, 8, 2, 4))  # [batch, T, H, P]
    >>> dt = jax.nn.softplus(jax.random.normal(jax.random.key(1), (1, 8, 2)))
    >>> A = -jnp.array([1.0, 2.0])
    >>> B, C = jax.random.normal(jax.random.key(2), (2, 1, 8, 1, 3))  # one group, N = 3
    >>> y = ops.ssd(x, dt, A, B, C)
    >>> y.shape
    (1, 8, 2, 4)
    >>> bool(jnp.allclose(y, ops.ssd(x, dt, A, B, C, form="recurrent"), atol=1e-5))
    True
  """
  common.check_rank("x", x, 4)
  common.check_seq_len(x.shape[1], "axis 1 of x")
  q, k, v, log_decay, skip = _ssd_inputs(x, dt, A, B, C, D, dt_bias, dt_softplus)
  y, state = decay.decay_linear_attention(
      q, k, v, log_decay, scale=scale, form=form, chunk_size=chunk_size,
      initial_state=initial_state, return_state=True, segment_ids=segment_ids,
      implementation=implementation, context=context)
  y = (y + skip).astype(x.dtype)
  return (y, state) if return_state else y


def ssd_step(state: Array, x: Array, dt: Array, A: Array, B: Array, C: Array,
             D: Array | None = None, *, dt_bias: Array | None = None,
             dt_softplus: bool = False, scale: float | None = 1.0):
  """One decoding step of :func:`ssd`.

  Args:
    state: ``[batch, H, N, P]`` float32;
    x: ``[batch, H, P]``; dt: ``[batch, H]``; A: ``[H]``; B, C: ``[batch, G, N]``;
    D, dt_bias, dt_softplus, scale: as in
    :func:`ssd` (sign checks for concrete values only).

  Returns:
    ``(y, new_state)``: ``y`` ``[batch, H, P]`` in the dtype of ``x``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> x = jax.random.normal(jax.random.key(0), (1, 8, 2, 4))  # [batch, T, H, P]
    >>> dt = jax.nn.softplus(jax.random.normal(jax.random.key(1), (1, 8, 2)))
    >>> A = -jnp.array([1.0, 2.0])
    >>> B, C = jax.random.normal(jax.random.key(2), (2, 1, 8, 1, 3))  # one group, N = 3
    >>> _, state = ops.ssd(x[:, :7], dt[:, :7], A, B[:, :7], C[:, :7], return_state=True)
    >>> y, state = ops.ssd_step(state, x[:, 7], dt[:, 7], A, B[:, 7], C[:, 7])
    >>> y.shape, state.shape  # state [batch, H, N, P]
    ((1, 2, 4), (1, 2, 3, 4))
    >>> bool(jnp.allclose(y, ops.ssd(x, dt, A, B, C)[:, 7], atol=1e-5))
    True
  """
  common.check_step_state_first(state, "[batch, H, N, P]", 4)
  common.check_rank("x", x, 3)
  q, k, v, log_decay, skip = _ssd_inputs(x, dt, A, B, C, D, dt_bias, dt_softplus)
  y, state = decay.decay_linear_attention_step(state, q, k, v, log_decay, scale=scale)
  return (y + skip).astype(x.dtype), state
