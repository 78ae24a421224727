"""The elementwise linear-recurrence engine.

One recurrence, elementwise over any trailing shape::

    h_t = a_t * h_{t-1} + b_t

RG-LRU (Hawk, Griffin), the recurrent form of S4D and Mamba-1's selective scan
(over a ``[D, N]`` state per token) are all this scan with different ``a`` and
``b``. ``a`` may have any sign (or be complex), so no form takes its log.

Forms (all agree; the tests prove it):

* ``recurrent``: ``lax.scan`` token by token, the reference.
* ``associative``: one ``lax.associative_scan`` over the whole sequence
  (log depth, ``O(T log T)`` work).
* ``chunk`` (default): the sequence is cut into chunks of ``chunk_size``; every
  chunk is scanned from a zero state, all chunks at once, then a short
  ``lax.scan`` over chunk ends carries the state between chunks and each chunk
  adds ``(prod of a so far) * entering state``. Memory ``O(T)``, sequential
  depth ``C + T / C``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from linear_attention.kernels import dispatch
from linear_attention.kernels import scan as kernel
from linear_attention import common

Array = jax.Array

SCAN_FORMS = ("chunk", "associative", "recurrent")


def _check_inexact(name: str, x: Array) -> None:
  if not jnp.issubdtype(jnp.result_type(x), jnp.inexact):
    raise ValueError(
        f"{name} must be a floating-point or complex array, got dtype {jnp.result_type(x)}."
    )


def linear_scan(
    a: Array,
    b: Array,
    *,
    h0: Array | None = None,
    form: str = "chunk",
    chunk_size: int = 64,
    reverse: bool = False,
    segment_ids: Array | None = None,
    return_state: bool = False,
    implementation: str | None = None,
):
  """``h_t = a_t * h_{t-1} + b_t`` along axis 1, elementwise over the rest.

  Args:
    a: ``[B, T, ...]`` transition (any sign, real or complex), same shape as ``b``.
    b: ``[B, T, ...]`` input.
    h0: optional ``[B, ...]`` state before the first step (after the last one
      when ``reverse``); it applies to the first segment of each row only.
    form: ``"chunk"`` (default), ``"associative"`` or ``"recurrent"``.
    chunk_size: chunk length of the chunk form (any ``T`` works: padded inside).
    reverse: run from the end: ``h_t = a_t * h_{t+1} + b_t`` (bidirectional use).
    segment_ids: optional ``[B, T]`` ints; ``h`` is reset to zero where a new
      segment begins (``h_t = b_t`` there), so packed sequences never mix.
    return_state: also return the final state (``h`` at ``T - 1``, or at ``0``
      when ``reverse``).
    implementation: ``None`` (the Pallas scan kernel on a backend listed in
      ``kernels.dispatch.PALLAS_DEFAULT_BACKENDS`` -- none yet -- when it
      supports the arguments, XLA otherwise and always on CPU), ``"xla"``, or
      ``"pallas"`` (:mod:`linear_attention.kernels.scan`; on CPU it runs in
      interpret mode: exact but slow). The kernel replaces ``form="chunk"``
      (``chunk_size`` is then unused); with another form or complex/float64
      inputs, ``"pallas"`` raises a ``ValueError``.

  Returns:
    ``h`` ``[B, T, ...]`` in the dtype of ``b``, or ``(h, state)`` with ``state``
    ``[B, ...]`` in float32 (complex64 for complex inputs; wider inputs keep
    their width).
  """
  a, b = jnp.asarray(a), jnp.asarray(b)
  _check_inexact("a", a)
  _check_inexact("b", b)
  if jnp.ndim(b) < 2:
    raise ValueError(f"b must have shape [B, T, ...], got {list(jnp.shape(b))}.")
  common.check_shape("a", a, b.shape, "the shape of b; a is never broadcast")
  bsz, t = b.shape[:2]
  common.check_seq_len(t, "axis 1 of b")
  if h0 is not None:
    _check_inexact("h0", h0)
    common.check_shape("h0", h0, (bsz,) + b.shape[2:], "[B, ...] as b without T")
  common.check_choice("form", form, SCAN_FORMS)
  common.check_positive_int("chunk_size", chunk_size)
  common.check_segment_ids(segment_ids, bsz, t)
  unsupported = kernel.unsupported_arguments(a, b, h0)
  if form != "chunk":
    unsupported["form"] = f"{form!r} (the kernel replaces the chunk form)"
  use_pallas = dispatch.resolve_implementation(implementation, unsupported)

  out_dtype = b.dtype
  acc = common.acc_dtype(a.dtype, b.dtype, *(() if h0 is None else (h0.dtype,)))
  a, b = a.astype(acc), b.astype(acc)
  h0 = None if h0 is None else h0.astype(acc)
  if reverse:
    a, b = jnp.flip(a, 1), jnp.flip(b, 1)
    segment_ids = None if segment_ids is None else jnp.flip(segment_ids, 1)
  if segment_ids is not None:
    starts = common.segment_starts(segment_ids)
    a = jnp.where(starts.reshape(starts.shape + (1,) * (a.ndim - 2)), 0, a)

  if use_pallas:
    h, state = kernel.linear_scan(a, b, h0=h0, return_state=True)
  elif form == "recurrent":
    h, state = _recurrent(a, b, h0)
  elif form == "associative":
    h, state = _associative(a, b, h0)
  else:
    h, state = _chunk(a, b, h0, min(chunk_size, t))
  if reverse:
    h = jnp.flip(h, 1)
  h = h.astype(out_dtype)
  return (h, state) if return_state else h


def _combine(x, y):
  """Composes two steps: first ``x = (a1, b1)``, then ``y = (a2, b2)``."""
  a1, b1 = x
  a2, b2 = y
  return a1 * a2, a2 * b1 + b2


# The forms are jitted so that eager calls compile once per shape instead of
# dispatching the many small ops of a scan one by one.
@jax.jit
def _recurrent(a, b, h0):
  """Token-by-token ``lax.scan``; ``a, b`` ``[B, T, ...]``."""
  init = jnp.zeros(b.shape[:1] + b.shape[2:], b.dtype) if h0 is None else h0

  def body(h, x):
    a_t, b_t = x
    h = a_t * h + b_t
    return h, h

  state, h = lax.scan(body, init, (jnp.moveaxis(a, 1, 0), jnp.moveaxis(b, 1, 0)))
  return jnp.moveaxis(h, 0, 1), state


@jax.jit
def _associative(a, b, h0):
  """One ``lax.associative_scan`` over the sequence; ``h0`` folded into ``b_0``."""
  if h0 is not None:
    b = b.at[:, 0].add(a[:, 0] * h0)
  _, h = lax.associative_scan(_combine, (a, b), axis=1)
  return h, h[:, -1]


@functools.partial(jax.jit, static_argnums=3)
def _chunk(a, b, h0, c):
  """Chunked scan: in-chunk scans from zero, a ``lax.scan`` over chunk ends."""
  bsz, t = b.shape[:2]
  rest = b.shape[2:]
  # Padding with a = 1, b = 0 leaves the state unchanged, so the carry of the
  # scan over chunks is the state after the last real token.
  a = common.pad_axis(a, c, axis=1, value=1)
  b = common.pad_axis(b, c, axis=1, value=0)
  n = a.shape[1] // c
  a = a.reshape((bsz, n, c) + rest)
  b = b.reshape((bsz, n, c) + rest)
  # In-chunk prefix products and zero-state scans, all chunks at once.
  cum_a, local = lax.associative_scan(_combine, (a, b), axis=2)

  def body(h, x):
    a_end, h_end = x
    return a_end * h + h_end, h

  init = jnp.zeros((bsz,) + rest, b.dtype) if h0 is None else h0
  state, entering = lax.scan(
      body, init, (jnp.moveaxis(cum_a[:, :, -1], 1, 0), jnp.moveaxis(local[:, :, -1], 1, 0)))
  entering = jnp.moveaxis(entering, 0, 1)  # [B, N, ...]: the state before each chunk
  h = local + cum_a * entering[:, :, None]
  return h.reshape((bsz, n * c) + rest)[:, :t], state
