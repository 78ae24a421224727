"""Argument checks and sequence helpers shared by every op.

Shape notation used in docstrings across ``ops/``:
B batch, T sequence length, H heads, K key (feature) dimension, V value
dimension, C chunk size. Every check raises a ``ValueError`` that names the
argument, what was expected and what was received.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import jax
import jax.numpy as jnp

Array = jax.Array

FORMS = ("parallel", "chunk", "recurrent")


def check_rank(name: str, x: Array, rank: int) -> None:
  """Raises unless ``x`` has exactly ``rank`` dimensions."""
  if jnp.ndim(x) != rank:
    raise ValueError(
        f"{name} must have rank {rank}, got shape {tuple(jnp.shape(x))} "
        f"(rank {jnp.ndim(x)})."
    )


def check_shape(name: str, x: Array, expected: Sequence[int | None], what: str = "") -> None:
  """Raises unless ``x.shape`` matches ``expected`` (``None`` matches any size)."""
  shape = tuple(jnp.shape(x))
  ok = len(shape) == len(expected) and all(
      e is None or e == s for e, s in zip(expected, shape)
  )
  if not ok:
    want = "[" + ", ".join("*" if e is None else str(e) for e in expected) + "]"
    extra = f" ({what})" if what else ""
    raise ValueError(f"{name} must have shape {want}{extra}, got {list(shape)}.")


def check_float(name: str, x: Array) -> None:
  """Raises unless ``x`` has a floating dtype."""
  if not jnp.issubdtype(jnp.result_type(x), jnp.floating):
    raise ValueError(f"{name} must be a floating-point array, got dtype {jnp.result_type(x)}.")


def check_same_dtype(**arrays: Array) -> None:
  """Raises unless every given array has the same dtype."""
  dtypes = {n: jnp.result_type(a) for n, a in arrays.items() if a is not None}
  if len(set(dtypes.values())) > 1:
    desc = ", ".join(f"{n}={d}" for n, d in dtypes.items())
    raise ValueError(f"{', '.join(dtypes)} must share one dtype, got {desc}.")


def check_choice(name: str, value, choices: Iterable) -> None:
  """Raises unless ``value`` is one of ``choices``, listing the valid ones."""
  choices = tuple(choices)
  if value not in choices:
    raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}.")


def check_positive_int(name: str, value) -> None:
  """Raises unless ``value`` is an int >= 1."""
  if isinstance(value, bool) or not isinstance(value, int) or value < 1:
    raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")


def check_qkv(q: Array, k: Array, v: Array) -> tuple[int, int, int, int, int]:
  """Checks ``q, k: [B,T,H,K]`` and ``v: [B,T,H,V]``; returns ``(B, T, H, K, V)``."""
  for name, x in (("q", q), ("k", k), ("v", v)):
    check_rank(name, x, 4)
    check_float(name, x)
  b, t, h, dk = q.shape
  check_shape("k", k, (b, t, h, dk), "the shape of q")
  check_shape("v", v, (b, t, h, None), "batch, seq and heads of q")
  check_same_dtype(q=q, k=k, v=v)
  return b, t, h, dk, v.shape[-1]


def check_segment_ids(segment_ids: Array | None, batch: int, seq: int) -> None:
  """Raises unless ``segment_ids`` is ``None`` or an integer ``[B, T]`` array."""
  if segment_ids is None:
    return
  check_shape("segment_ids", segment_ids, (batch, seq), "[batch, seq]")
  if not jnp.issubdtype(jnp.result_type(segment_ids), jnp.integer):
    raise ValueError(
        f"segment_ids must be integers, got dtype {jnp.result_type(segment_ids)}."
    )


def check_state(name: str, state: Array | None, expected: Sequence[int]) -> None:
  """Raises unless ``state`` is ``None`` or a floating array of shape ``expected``."""
  if state is None:
    return
  check_shape(name, state, expected, "[batch, heads, key_dim, value_dim]")
  check_float(name, state)


def resolve_scale(scale: float | None, key_dim: int) -> float:
  """``scale=None`` means ``key_dim ** -0.5``."""
  return key_dim**-0.5 if scale is None else scale


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
  prev = jnp.concatenate([segment_ids[:, :1], segment_ids[:, :-1]], axis=1)
  return segment_ids != prev


def segment_index(segment_ids: Array) -> Array:
  """``[B, T]`` int32 running count of segment starts: equal values share a segment.

  Unlike the raw ids, this is monotone, so ``a == b`` for positions ``i <= j``
  means no boundary lies between them even if an id is reused later.
  """
  return jnp.cumsum(segment_starts(segment_ids).astype(jnp.int32), axis=1)


def zero_state(qh: Array, vh: Array) -> Array:
  """A zero ``[B, H, K, V]`` state for ``qh [B, H, T, K]`` and ``vh [B, H, T, V]``.

  Built with ``zeros_like`` of an expression of the inputs rather than
  ``jnp.zeros``, so that inside ``jax.shard_map`` it varies over the same
  mesh axes as the inputs and a ``lax.scan`` carrying it keeps one type.
  """
  return jnp.zeros_like(qh[:, :, 0, :, None] * vh[:, :, 0, None, :])


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
