"""Log-linear variants of Mamba-2 (SSD) and GLA (Guo et al., 2025): the maps from each
model's inputs onto :func:`linear_attention.ops.loglinear.loglinear_decay_attention`, whose
module docstring derives the Fenwick-tree state. Re-exported by :mod:`linear_attention.ops`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from linear_attention import common
from linear_attention.ops import gated
from linear_attention.engines.context import SeqContext
from linear_attention.ops.loglinear import (
    _check_levels, init_loglinear_state, loglinear_decay_attention, loglinear_decay_step)

Array = jax.Array


def loglinear_ssd(x: Array, dt: Array, A: Array, B: Array, C: Array, level_weights: Array,
                  D: Array | None = None, *, dt_bias: Array | None = None,
                  dt_softplus: bool = False, scale: float | None = 1.0, form: str = "chunk",
                  chunk_size: int = 64, initial_state: tuple[Array, Array] | None = None,
                  return_state: bool = False, segment_ids: Array | None = None,
                  implementation: str | None = None, context: SeqContext | None = None):
  """Log-linear Mamba-2: :func:`~linear_attention.ops.gated.ssd` with Fenwick levels.

  ``q = C``, ``k = B``, ``v = dt * x``, ``log_decay = A * dt`` as in
  :func:`~linear_attention.ops.gated.ssd`, mixed over levels by
  ``level_weights``; plus the skip ``D x``.

  Args (``batch`` is the batch size):
    x: ``[batch, T, H, P]``; dt: ``[batch, T, H]``; A: ``[H]`` (negative);
    B, C: ``[batch, T, G, N]``; level_weights: ``[batch, T, H, L]``;
    D, dt_bias, dt_softplus, scale: as in :func:`~linear_attention.ops.gated.ssd`.
    form, chunk_size, return_state, segment_ids, implementation, context: as in
      :func:`loglinear_decay_attention`.
    initial_state: ``(S [batch, H, L, N, P], position [batch])``.

  Returns:
    ``y`` ``[batch, T, H, P]`` in the dtype of ``x``, or ``(y, state)``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> x = jax.random.normal(jax.random.key(0), (1, 8, 2, 4))  # [batch, T, H, P]
    >>> dt = jax.nn.softplus(jax.random.normal(jax.random.key(1), (1, 8, 2)))
    >>> A = -jnp.array([1.0, 2.0])
    >>> B, C = jax.random.normal(jax.random.key(2), (2, 1, 8, 1, 3))  # one group, N = 3
    >>> lw = jax.nn.softmax(jax.random.normal(jax.random.key(2), (1, 8, 2, 4)), -1)  # L = 4 levels
    >>> y = ops.loglinear_ssd(x, dt, A, B, C, lw)
    >>> y.shape
    (1, 8, 2, 4)
    >>> bool(jnp.allclose(y, ops.loglinear_ssd(x, dt, A, B, C, lw, form="recurrent"), atol=1e-5))
    True
  """
  common.check_rank("x", x, 4)
  common.check_seq_len(x.shape[1], "axis 1 of x")
  q, k, v, log_decay, skip = gated._ssd_inputs(x, dt, A, B, C, D, dt_bias, dt_softplus)
  _check_levels(level_weights, *x.shape[:3])
  y, state = loglinear_decay_attention(
      q, k, v, log_decay, level_weights, scale=scale, form=form, chunk_size=chunk_size,
      initial_state=initial_state, return_state=True, segment_ids=segment_ids,
      implementation=implementation, context=context)
  y = (y + skip).astype(x.dtype)
  return (y, state) if return_state else y


def loglinear_ssd_step(state: tuple[Array, Array], x: Array, dt: Array, A: Array, B: Array,
                       C: Array, level_weights: Array, D: Array | None = None, *,
                       dt_bias: Array | None = None, dt_softplus: bool = False,
                       scale: float | None = 1.0):
  """One decoding step of :func:`loglinear_ssd`.

  Args:
    state: ``(S [batch, H, L, N, P], position [batch])`` float32;
    x: ``[batch, H, P]``; dt: ``[batch, H]``; A: ``[H]``; B, C: ``[batch, G, N]``;
    level_weights: ``[batch, H, L]``; D, dt_bias, dt_softplus, scale: as in :func:`loglinear_ssd`.

  Returns:
    ``(y, new_state)``: ``y`` ``[batch, H, P]`` in the dtype of ``x``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> x = jax.random.normal(jax.random.key(0), (1, 8, 2, 4))  # [batch, T, H, P]
    >>> dt = jax.nn.softplus(jax.random.normal(jax.random.key(1), (1, 8, 2)))
    >>> A = -jnp.array([1.0, 2.0])
    >>> B, C = jax.random.normal(jax.random.key(2), (2, 1, 8, 1, 3))  # one group, N = 3
    >>> lw = jax.nn.softmax(jax.random.normal(jax.random.key(2), (1, 8, 2, 4)), -1)  # L = 4 levels
    >>> _, state = ops.loglinear_ssd(x[:, :7], dt[:, :7], A, B[:, :7], C[:, :7], lw[:, :7],
    ...                               return_state=True)
    >>> y, state = ops.loglinear_ssd_step(state, x[:, 7], dt[:, 7], A, B[:, 7], C[:, 7], lw[:, 7])
    >>> y.shape
    (1, 2, 4)
    >>> bool(jnp.allclose(y, ops.loglinear_ssd(x, dt, A, B, C, lw)[:, 7], atol=1e-5))
    True
  """
  common.check_step_state_first(state, "(S [batch, H, L, N, P], position [batch])", 5, 1)
  common.check_rank("x", x, 3)
  q, k, v, log_decay, skip = gated._ssd_inputs(x, dt, A, B, C, D, dt_bias, dt_softplus)
  y, state = loglinear_decay_step(state, q, k, v, log_decay, level_weights, scale=scale)
  return (y + skip).astype(x.dtype), state


def loglinear_gla(q: Array, k: Array, v: Array, log_g: Array, level_weights: Array, *,
                  scale: float | None = None, form: str = "chunk", chunk_size: int = 64,
                  initial_state: tuple[Array, Array] | None = None, return_state: bool = False,
                  segment_ids: Array | None = None, implementation: str | None = None,
                  context: SeqContext | None = None):
  """Log-linear GLA: :func:`~linear_attention.ops.gated.gla`'s per-channel decay with levels.

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``; log_g: ``[B, T, H, K]``
      (``<= 0``); level_weights: ``[B, T, H, L]``; the rest as in
      :func:`loglinear_decay_attention`.

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> lw = jax.nn.softmax(jax.random.normal(jax.random.key(2), (1, 8, 2, 4)), -1)  # L = 4 levels
    >>> log_g = jax.nn.log_sigmoid(jax.random.normal(jax.random.key(1), (1, 8, 2, 4)))
    >>> o = ops.loglinear_gla(q, k, v, log_g, lw)
    >>> o.shape
    (1, 8, 2, 4)
    >>> bool(jnp.allclose(o, ops.loglinear_gla(q, k, v, log_g, lw, form="parallel"), atol=1e-5))
    True
  """
  b, t, h, dk, _ = common.check_qkv(q, k, v)
  common.check_log_decay(log_g, b, t, h, dk, name="log_g", per_head=False)
  return loglinear_decay_attention(
      q, k, v, log_g, level_weights, scale=scale, form=form, chunk_size=chunk_size,
      initial_state=initial_state, return_state=return_state, segment_ids=segment_ids,
      implementation=implementation, context=context)


def loglinear_gla_step(state: tuple[Array, Array], q: Array, k: Array, v: Array, log_g: Array,
                       level_weights: Array, *, scale: float | None = None):
  """One decoding step of :func:`loglinear_gla`: the state as in
  :func:`loglinear_decay_step`, ``log_g [B, H, K]``, ``level_weights [B, H, L]``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.key(0), (3, 1, 8, 2, 4))
    >>> lw = jax.nn.softmax(jax.random.normal(jax.random.key(2), (1, 8, 2, 4)), -1)  # L = 4 levels
    >>> log_g = jax.nn.log_sigmoid(jax.random.normal(jax.random.key(1), (1, 8, 2, 4)))
    >>> state = ops.init_loglinear_state(1, 2, 4, 4, 4)
    >>> for t in range(8):
    ...   o, state = ops.loglinear_gla_step(state, q[:, t], k[:, t], v[:, t], log_g[:, t], lw[:, t])
    >>> o.shape
    (1, 2, 4)
    >>> bool(jnp.allclose(o, ops.loglinear_gla(q, k, v, log_g, lw)[:, 7], atol=1e-5))
    True
  """
  common.check_step_state_first(state, "(S [B, H, L, K, V], position [B])", 5, 1)
  b, h, dk, _ = common.check_step_qkv(q, k, v)
  common.check_log_decay(log_g, b, h, dk, name="log_g", per_head=False)
  return loglinear_decay_step(state, q, k, v, log_g, level_weights, scale=scale)
