"""Forgetting Attention (FoX, Lin et al. 2025): causal softmax attention whose logits get
a data-dependent decay bias ``sum_{j < s <= i} log f_s = D_i - D_j``.

It runs the softmax engine (:mod:`linear_attention.engines.softmax.engine`) with that bias
through the engine's one hook, so it keeps the engine's ``O(T)`` memory, packing and
context parallelism; :func:`forgetting_attention_step` decodes with a KV cache that also
stores each key's ``D``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from linear_attention import common
from linear_attention.engines.context import SeqContext, check_context
from linear_attention.engines.softmax import engine as sm

Array = jax.Array


def forgetting_attention(
    q: Array,
    k: Array,
    v: Array,
    log_fgate: Array,
    *,
    scale: float | None = None,
    segment_ids: Array | None = None,
    implementation: str | None = None,
    algorithm: str | None = None,
    block_size: int = 128,
    context: SeqContext | None = None,
) -> Array:
  """Forgetting Attention (FoX): causal softmax attention with a forget gate per head.

  ``o_i = sum_{j <= i} softmax_j(scale * q_i . k_j + D_i - D_j) v_j`` with
  ``D_i = sum_{s <= i} log f_s``: key ``j`` is down-weighted by the product of
  the forget gates after it, ``prod_{j < s <= i} f_s``. With every gate 1
  (``log_fgate = 0``) it is causal :func:`softmax_attention`.

  Args:
    q: ``[B, T, H, K]``; k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    log_fgate: ``[B, T, H]`` log forget gates ``log f_t <= 0`` (e.g.
      ``jax.nn.log_sigmoid`` of a projection), any float dtype; ``-inf`` is a
      hard reset (see :func:`forget_cumsum`). The sign is checked for concrete
      values (``common.log_decay_checks`` under ``jit``).
    scale: logit scale; ``None`` means ``K ** -0.5``.
    segment_ids: optional ``[B, T]`` ints; a query sees only keys of its own
      segment (nothing crosses a boundary, the forgetting bias included).
    implementation: ``None`` or ``"xla"`` (``"pallas"`` raises: the flash
      kernel does not take the forgetting bias yet).
    algorithm: ``"naive"`` (dense ``T x T`` logits), ``"blockwise"`` (online
      softmax, ``O(T)`` memory, custom backward) or ``None``: naive for
      ``T <= sm.NAIVE_MAX_LEN``, blockwise above.
    block_size: the blockwise path's block length (capped at ``T``).
    context: optional :class:`~linear_attention.ops.context.SeqContext`, as in
      :func:`softmax_attention`; ``D`` is the global cumulative sum (each
      device's own plus the gathered totals of the devices before it).

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``; statistics and accumulation
    in float32 (``D`` too, whatever the gates' dtype).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> q, k, v = jax.random.normal(jax.random.PRNGKey(0), (3, 1, 10, 2, 4))
    >>> log_fgate = jax.nn.log_sigmoid(jnp.full((1, 10, 2), 3.0))
    >>> ops.forgetting_attention(q, k, v, log_fgate).shape
    (1, 10, 2, 4)
  """
  b, t, h, dk, _ = common.check_attention(q, k, v, segment_ids)
  common.check_log_decay(log_fgate, b, t, h, dk, name="log_fgate", per_channel=False)
  implementation, algorithm = sm.check_implementation(implementation, algorithm)
  if implementation == "pallas":
    raise ValueError("forgetting_attention has no Pallas kernel yet: implementation must be "
                     "None or 'xla', got 'pallas'.")
  common.check_positive_int("block_size", block_size)
  scale = common.resolve_scale(scale, dk)
  if context is not None:
    return sm._context_attention(q, k, v, segment_ids, log_fgate, context=context, causal=True,
                              scale=scale, implementation=implementation, algorithm=algorithm,
                              block_size=block_size)
  d = sm.forget_cumsum(log_fgate)
  if algorithm is None:
    algorithm = "naive" if t <= sm.NAIVE_MAX_LEN else "blockwise"
  if algorithm == "naive":
    o = sm._naive(q, k, v, segment_ids, scale=float(scale), causal=True, log_forget=d)
  else:
    o, _ = sm.self_attention_stats(q, k, v, segment_ids, scale=scale, block_size=block_size,
                                causal=True, log_forget=d)
  return o.astype(q.dtype)


class ForgettingCache(NamedTuple):
  """Decoding cache of :func:`forgetting_attention_step` (a pytree).

  Attributes:
    keys: ``[B, L, H, K]``; slot ``t`` holds token ``t``.
    values: ``[B, L, H, V]``.
    log_forget: ``[B, L, H]`` float32, ``D_t`` of each cached token.
    total: ``[B, H]`` float32, ``D`` after the last token written.
    length: int32 scalar, tokens written so far (the same for every row).
  """

  keys: Array
  values: Array
  log_forget: Array
  total: Array
  length: Array


def init_forgetting_cache(batch: int, heads: int, max_len: int, key_dim: int,
                          value_dim: int, dtype=jnp.float32) -> ForgettingCache:
  """An empty :class:`ForgettingCache` for up to ``max_len`` tokens.

  ``keys`` and ``values`` take ``dtype``; ``log_forget`` and ``total`` are float32.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> cache = ops.init_forgetting_cache(1, 2, max_len=8, key_dim=4, value_dim=4)
    >>> cache.keys.shape, cache.values.shape
    ((1, 8, 2, 4), (1, 8, 2, 4))
  """
  for name, x in (("batch", batch), ("heads", heads), ("max_len", max_len),
                  ("key_dim", key_dim), ("value_dim", value_dim)):
    common.check_positive_int(name, x)
  return ForgettingCache(jnp.zeros((batch, max_len, heads, key_dim), dtype),
                         jnp.zeros((batch, max_len, heads, value_dim), dtype),
                         jnp.zeros((batch, max_len, heads), jnp.float32),
                         jnp.zeros((batch, heads), jnp.float32), jnp.zeros((), jnp.int32))


def forgetting_step_bias(total: Array, log_forget: Array) -> Array:
  """The one-query forgetting bias ``D_t - D_j``: ``[B, H]``, ``[B, L, H]`` -> ``[B, 1, H, L]``."""
  return (total[:, :, None] - jnp.swapaxes(log_forget, 1, 2))[:, None]


def forgetting_attention_step(cache: ForgettingCache, q: Array, k: Array, v: Array,
                              log_fgate: Array, *, scale: float | None = None):
  """One decoding step of :func:`forgetting_attention`.

  Adds the gate to the running ``D``, writes ``k, v`` and ``D`` at slot
  ``cache.length`` and attends ``q`` over the tokens so far, itself included.
  Stepping through a sequence equals ``forgetting_attention`` on it.

  Args:
    cache: from :func:`init_forgetting_cache` with ``max_len`` at least the
      number of tokens to decode. Past it an eager call raises; under ``jit``
      the position cannot be checked and the last slot is overwritten.
    q, k: ``[B, H, K]``; v: ``[B, H, V]``; log_fgate: ``[B, H]`` (``<= 0``).
    scale: logit scale; ``None`` means ``K ** -0.5``.

  Returns:
    ``(o, new_cache)`` with ``o`` ``[B, H, V]`` in the dtype of ``q``.

  Examples:
    >>> import jax.numpy as jnp
    >>> from linear_attention import ops
    >>> cache = ops.init_forgetting_cache(1, 2, max_len=8, key_dim=4, value_dim=4)
    >>> q = k = v = jnp.ones((1, 2, 4))
    >>> o, cache = ops.forgetting_attention_step(cache, q, k, v, jnp.full((1, 2), -0.1))
    >>> o.shape
    (1, 2, 4)
  """
  if not isinstance(cache, ForgettingCache):
    raise ValueError("cache must be a ForgettingCache (from init_forgetting_cache), got "
                     f"{type(cache).__name__}.")
  b, h, dk, dv = common.check_step_qkv(q, k, v)
  common.check_log_decay(log_fgate, b, h, dk, name="log_fgate", per_channel=False)
  length = cache.keys.shape[1]
  common.check_shape("cache.keys", cache.keys, (b, length, h, dk), "[B, max_len, H, K]")
  common.check_shape("cache.values", cache.values, (b, length, h, dv), "[B, max_len, H, V]")
  common.check_shape("cache.log_forget", cache.log_forget, (b, length, h), "[B, max_len, H]")
  common.check_shape("cache.total", cache.total, (b, h), "[B, H]")
  pos = common.concrete(cache.length)
  if pos is not None and pos >= length:
    raise ValueError(f"cache is full: it holds max_len={length} tokens and {int(pos)} were "
                     "written; make it with a larger max_len.")
  scale = common.resolve_scale(scale, dk)
  total = cache.total + common.floor_log_decay(log_fgate.astype(cache.total.dtype))
  slot = cache.length
  keys = lax.dynamic_update_index_in_dim(cache.keys, k.astype(cache.keys.dtype), slot, 1)
  values = lax.dynamic_update_index_in_dim(cache.values, v.astype(cache.values.dtype), slot, 1)
  log_forget = lax.dynamic_update_index_in_dim(cache.log_forget, total, slot, 1)
  filled = jnp.arange(length) <= slot
  o, _ = sm.dense_attention_stats(q[:, None], keys, values, filled[None, None, :], scale,
                               forgetting_step_bias(total, log_forget))
  return o[:, 0].astype(q.dtype), ForgettingCache(keys, values, log_forget, total,
                                                  cache.length + 1)
