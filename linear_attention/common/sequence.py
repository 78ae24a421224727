"""Sequence helpers shared by every op: padding, packed segments, log-decay floors, the
accumulation dtype and the rematerialised scan of the recurrent forms."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def log_zero(dtype) -> float:
  """A finite log decay whose ``exp`` is exactly 0 in ``dtype``: 1.5 times the log of
  the smallest subnormal (-155 in float32, -1117 in float64)."""
  return 1.5 * float(np.log(jnp.finfo(dtype).smallest_subnormal))


def floor_log_decay(g: Array | None) -> Array | None:
  """Replaces ``-inf`` (and anything below :func:`log_zero`) by ``log_zero``.

  A log decay of ``-inf`` (a hard reset, and what ``log(sigmoid(x))``
  underflows to) is exact in a step, ``exp(-inf) = 0``, but cumulative sums
  and their differences turn it into ``-inf - (-inf) = NaN``. Every single
  step below ``log_zero`` already decays by exactly 0 in that dtype, and so
  does every sum containing one, so the floor changes no value; its
  gradient below the floor is 0, as is the recurrence's (``exp(-inf) = 0``).
  """
  if g is None:
    return None
  return jnp.maximum(g, log_zero(g.dtype))


def pad_axis(x: Array, multiple: int, axis: int = 1, value=0) -> Array:
  """Pads ``axis`` of ``x`` at the end up to a multiple of ``multiple``."""
  n = x.shape[axis]
  extra = -n % multiple
  if extra == 0:
    return x
  widths = [(0, 0)] * x.ndim
  widths[axis] = (0, extra)
  return jnp.pad(x, widths, constant_values=value)


def pad_segment_ids(segment_ids: Array, multiple: int) -> Array:
  """Pads ``[B, T]`` ids by repeating the last id, so padding continues the last segment."""
  extra = -segment_ids.shape[1] % multiple
  if extra == 0:
    return segment_ids
  return jnp.concatenate(
      [segment_ids, jnp.repeat(segment_ids[:, -1:], extra, axis=1)], axis=1
  )


def segment_starts(segment_ids: Array) -> Array:
  """``[B, T]`` bool: True where a new segment begins (never at ``t = 0``)."""
  # Compare neighbours, then pad: the equivalent ``ids != concat([ids[:, :1], ids[:, :-1]])``
  # lost the start on a device edge when XLA's partitioner sharded it along T (jax 0.10.2,
  # RG-LRU under a SeqContext; tests/ops/test_context.py).
  return jnp.pad(segment_ids[:, 1:] != segment_ids[:, :-1], ((0, 0), (1, 0)))


def segment_index(segment_ids: Array) -> Array:
  """``[B, T]`` int32 running count of segment starts: equal values share a segment.

  Unlike the raw ids, this is monotone, so ``a == b`` for positions ``i <= j``
  means no boundary lies between them even if an id is reused later.
  """
  return jnp.cumsum(segment_starts(segment_ids).astype(jnp.int32), axis=1)


def group_heads(x: Array | None, hk: int) -> Array | None:
  """``[B, T, H, *]`` -> ``[B, Hk, H // Hk, T, *]`` (None passes), for grouped value heads.

  Head ``h`` lands in group ``h // (H // Hk)``, slot ``h % (H // Hk)`` (transformers'
  ``repeat_interleave`` of the query/key heads). An argument with ``Hk`` heads gets a
  group axis of 1, which broadcasts against the value heads' ``G`` in elementwise ops and
  ``...``-einsums without repeating it in memory.
  """
  if x is None:
    return None
  b, t, h = x.shape[:3]
  return jnp.moveaxis(x.reshape((b, t, hk, h // hk) + x.shape[3:]), 1, 3)


def ungroup_heads(x: Array) -> Array:
  """The inverse of :func:`group_heads`: ``[B, Hk, G, T, *]`` -> ``[B, T, Hk G, *]``."""
  x = jnp.moveaxis(x, 3, 1)
  return x.reshape(x.shape[:2] + (x.shape[2] * x.shape[3],) + x.shape[4:])


def zero_state(qh: Array, vh: Array) -> Array:
  """A zero ``[B, H, K, V]`` state for ``qh [B, H, T, K]`` and ``vh [B, H, T, V]`` (any
  leading axes: ``[B, Hk, 1, T, K]`` and ``[B, Hk, G, T, V]`` give ``[B, Hk, G, K, V]``).

  Built with ``zeros_like`` of an expression of the inputs rather than
  ``jnp.zeros``, so that inside ``jax.shard_map`` it varies over the same
  mesh axes as the inputs and a ``lax.scan`` carrying it keeps one type.
  """
  return jnp.zeros_like(qh[..., 0, :, None] * vh[..., 0, None, :])


# Steps per rematerialised chunk of the recurrent forms (see remat_scan).
REMAT_CHUNK = 64


def remat_scan(body, init, xs, chunk: int = REMAT_CHUNK):
  """``lax.scan(body, init, xs)`` over a leading time axis, in rematerialised chunks.

  Each run of ``chunk`` steps is one ``jax.checkpoint``-ed inner scan, so the
  backward pass stores one carry per chunk instead of one per step and
  recomputes the rest: on CPU this is both less memory and faster than
  storing every state. ``xs`` is a pytree of ``[T, ...]`` arrays (``None``
  leaves allowed); the time axis is zero-padded to a multiple of ``chunk``, so
  a zero input must leave the carry unchanged (true of every recurrence
  here: zero keys, values, steps and log decays). Returns ``(carry, ys)``
  with ``ys`` cut back to ``T`` steps.
  """
  t = jax.tree_util.tree_leaves(xs)[0].shape[0]
  c = max(1, min(chunk, t))
  n = -(-t // c)
  split = lambda x: pad_axis(x, c, axis=0).reshape((n, c) + x.shape[1:])
  inner = jax.checkpoint(lambda carry, x: jax.lax.scan(body, carry, x))
  carry, ys = jax.lax.scan(inner, init, jax.tree_util.tree_map(split, xs))
  return carry, jax.tree_util.tree_map(lambda y: y.reshape((n * c,) + y.shape[2:])[:t], ys)


def acc_dtype(*dtypes) -> jnp.dtype:
  """The accumulation dtype: float32 (complex64 for complex inputs), or wider when the inputs are
  (float64 keeps gradient checks precise)."""
  return jnp.promote_types(jnp.result_type(*dtypes), jnp.float32)
