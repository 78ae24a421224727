"""The delta-rule engine's variants: DeltaNet and Gated DeltaNet.

Both are :func:`~linear_attention.engines.delta.engine.delta_rule` (re-exported here),
DeltaNet without a gate, Gated DeltaNet with a scalar gate per head and step; with
``normalize_qk=True`` they L2-normalise ``q`` and ``k`` first.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from linear_attention import common
from linear_attention.engines.context import SeqContext
from linear_attention.engines.delta.engine import (  # noqa: F401  (the public engine)
    DEFAULT_FORMS, delta_rule, delta_rule_step)

Array = jax.Array


def l2_normalize(x: Array, eps: float = 1e-6) -> Array:
  """``x / ||x||`` over the last axis, in the accumulation dtype, cast back."""
  xf = x.astype(common.acc_dtype(x.dtype))
  return (xf * lax.rsqrt(jnp.sum(xf * xf, axis=-1, keepdims=True) + eps)).astype(x.dtype)


def deltanet(
    q: Array,
    k: Array,
    v: Array,
    beta: Array,
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
  """DeltaNet: ``S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``.

  ``o_t = scale S_t^T q_t``.
  Schlag et al. 2021, "Linear Transformers Are Secretly Fast Weight
  Programmers"; chunkwise training from Yang et al. 2024, "Parallelizing
  Linear Transformers with the Delta Rule over Sequence Length".

  Args: as :func:`delta_rule` without ``log_decay``; q, k ``[B, T, Hk, K]``,
  v ``[B, T, H, V]`` (``H`` a multiple of ``Hk``: grouped value heads, see
  :func:`delta_rule`), beta ``[B, T, H]`` in ``[0, 2]`` (the paper uses a
  sigmoid, in ``(0, 1)``). Keys should be L2-normalised; ``normalize_qk=True``
  does it here for q and k. ``implementation`` and ``context`` as in :func:`delta_rule`.

  Returns: ``o`` ``[B, T, H, V]``, or ``(o, state)`` with state ``[B, H, K, V]``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.PRNGKey(0), (3, 1, 10, 2, 4))
    >>> beta = jnp.full((1, 10, 2), 0.5)
    >>> ops.deltanet(q, k, v, beta, normalize_qk=True).shape
    (1, 10, 2, 4)
  """
  if normalize_qk:
    q, k = l2_normalize(q), l2_normalize(k)
  return delta_rule(q, k, v, beta, None, scale=scale, form=form, chunk_size=chunk_size,
                    initial_state=initial_state, return_state=return_state,
                    segment_ids=segment_ids, implementation=implementation, context=context)


def deltanet_step(
    state: Array,
    q: Array,
    k: Array,
    v: Array,
    beta: Array,
    *,
    scale: float | None = None,
    normalize_qk: bool = False,
):
  """One DeltaNet token: ``S = (I - beta k k^T) S + beta k v^T``, ``o = scale S^T q``.

  Schlag et al. 2021; Yang et al. 2024 (see :func:`deltanet`). state
  ``[B, H, K, V]``, q, k ``[B, Hk, K]`` (grouped value heads as in :func:`deltanet`),
  v ``[B, H, V]``, beta ``[B, H]``. Returns ``(o [B, H, V], new_state [B, H, K, V])``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q = k = v = jnp.full((1, 2, 4), 0.5)
    >>> o, state = ops.deltanet_step(jnp.zeros((1, 2, 4, 4)), q, k, v, jnp.full((1, 2), 0.5))
    >>> o.shape, state.shape
    ((1, 2, 4), (1, 2, 4, 4))
  """
  common.check_step_state_first(state, "[B, H, K, V]", 4)
  if normalize_qk:
    q, k = l2_normalize(q), l2_normalize(k)
  return delta_rule_step(state, q, k, v, beta, scale=scale)


def gated_deltanet(
    q: Array,
    k: Array,
    v: Array,
    beta: Array,
    log_decay: Array,
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
  """Gated DeltaNet: ``S_t = exp(log_decay_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T``.

  Yang, Kautz and Hatamizadeh 2024, "Gated Delta Networks: Improving Mamba2
  with Delta Rule". ``o_t = scale S_t^T q_t``.

  Args: as :func:`delta_rule`; q, k ``[B, T, Hk, K]``, v ``[B, T, H, V]`` (``H`` a
  multiple of ``Hk``: grouped value heads, see :func:`delta_rule`),
  beta ``[B, T, H]`` in ``[0, 2]``, log_decay ``[B, T, H]`` values ``<= 0``
  (a scalar gate per value head and step; ``-inf`` allowed; beta's range and the
  gate's sign are checked only for concrete values, not under ``jit``). Keys should be L2-normalised;
  ``normalize_qk=True`` does it here for q and k. ``implementation`` and ``context``
  as in :func:`delta_rule`.

  Returns: ``o`` ``[B, T, H, V]``, or ``(o, state)`` with state ``[B, H, K, V]``.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.PRNGKey(0), (3, 1, 10, 2, 4))
    >>> beta, log_decay = jnp.full((1, 10, 2), 0.5), jnp.full((1, 10, 2), -0.1)
    >>> ops.gated_deltanet(q, k, v, beta, log_decay, normalize_qk=True).shape
    (1, 10, 2, 4)
  """
  if log_decay is None:
    raise ValueError("log_decay must be a [B, T, H] array for gated_deltanet, got None.")
  if normalize_qk:
    q, k = l2_normalize(q), l2_normalize(k)
  return delta_rule(q, k, v, beta, log_decay, scale=scale, form=form, chunk_size=chunk_size,
                    initial_state=initial_state, return_state=return_state,
                    segment_ids=segment_ids, implementation=implementation, context=context)


def gated_deltanet_step(
    state: Array,
    q: Array,
    k: Array,
    v: Array,
    beta: Array,
    log_decay: Array,
    *,
    scale: float | None = None,
    normalize_qk: bool = False,
):
  """One Gated DeltaNet token: ``S = exp(log_decay) (I - beta k k^T) S + beta k v^T``.

  Yang et al. 2024, "Gated Delta Networks" (see :func:`gated_deltanet`). state
  ``[B, H, K, V]``, q, k ``[B, Hk, K]`` (grouped value heads as in
  :func:`gated_deltanet`), v ``[B, H, V]``, beta and log_decay ``[B, H]``. Returns ``(o [B, H, V], new_state [B, H, K, V])``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q = k = v = jnp.full((1, 2, 4), 0.5)
    >>> beta, log_decay = jnp.full((1, 2), 0.5), jnp.full((1, 2), -0.1)
    >>> o, state = ops.gated_deltanet_step(jnp.zeros((1, 2, 4, 4)), q, k, v, beta, log_decay)
    >>> o.shape
    (1, 2, 4)
  """
  common.check_step_state_first(state, "[B, H, K, V]", 4)
  if log_decay is None:
    raise ValueError("log_decay must be a [B, H] array for gated_deltanet_step, got None.")
  if normalize_qk:
    q, k = l2_normalize(q), l2_normalize(k)
  return delta_rule_step(state, q, k, v, beta, log_decay, scale=scale)
