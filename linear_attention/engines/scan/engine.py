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

With ``context=`` (a :class:`~linear_attention.ops.context.SeqContext`) the
sequence is split over a mesh axis and the same idea runs across devices: each
device scans its slice from a zero state (any form), the per-device pairs
``(prod of a, h at the end)`` are gathered and folded (``P`` elementwise steps),
and each device adds ``(prod of a so far) * entering state``.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from linear_attention.engines import dispatch
from linear_attention.engines.scan import pallas as kernel
from linear_attention import common
from linear_attention.engines import context as context_lib
from linear_attention.engines.context import SeqContext

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
    form: str = "auto",
    chunk_size: int | None = None,
    reverse: bool = False,
    segment_ids: Array | None = None,
    return_state: bool = False,
    implementation: str | None = None,
    context: SeqContext | None = None,
):
  """``h_t = a_t * h_{t-1} + b_t`` along axis 1, elementwise over the rest.

  Args:
    a: ``[B, T, ...]`` transition (any sign, real or complex), same shape as ``b``.
    b: ``[B, T, ...]`` input.
    h0: optional ``[B, ...]`` state before the first step (after the last one
      when ``reverse``); it applies to the first segment of each row only.
    form: ``"auto"`` (default: the chunk form on every backend), ``"chunk"``,
      ``"associative"`` or ``"recurrent"``.
    chunk_size: chunk length of the chunk form (any ``T`` works: padded inside); None: the
      backend's default (:func:`~linear_attention.engines.dispatch.resolve_chunk_size`, 64).
    reverse: run from the end: ``h_t = a_t * h_{t+1} + b_t`` (bidirectional use).
    segment_ids: optional ``[B, T]`` ints; ``h`` is reset to zero where a new
      segment begins (``h_t = b_t`` there), so packed sequences never mix.
    return_state: also return the final state (``h`` at ``T - 1``, or at ``0``
      when ``reverse``).
    implementation: ``None`` (the Pallas scan kernel on a backend listed in
      ``engines.dispatch.PALLAS_DEFAULT_BACKENDS`` -- none yet -- when it
      supports the arguments, XLA otherwise and always on CPU), ``"xla"``, or
      ``"pallas"`` (:mod:`linear_attention.engines.scan.pallas`; on CPU it runs in
      interpret mode: exact but slow). The kernel replaces ``form="chunk"``
      (``chunk_size`` is then unused); with another form or complex/float64
      inputs, ``"pallas"`` raises a ``ValueError``.
    context: None, or a :class:`~linear_attention.ops.context.SeqContext` to run
      with the sequence split over a mesh axis (see the module docstring); the
      same result up to rounding. ``reverse`` then flips the global arrays
      (XLA moves the slices between devices).

  Returns:
    ``h`` ``[B, T, ...]`` in the dtype of ``b``, or ``(h, state)`` with ``state``
    ``[B, ...]`` in float32 (complex64 for complex inputs; wider inputs keep
    their width).

  Examples:
    >>> import jax.numpy as jnp
    >>> from linear_attention import ops
    >>> a = jnp.full((1, 5, 3), 0.5)
    >>> b = jnp.ones((1, 5, 3))
    >>> ops.linear_scan(a, b)[0, :, 0]  # h_t = 0.5 h_{t-1} + 1
    Array([1.    , 1.5   , 1.75  , 1.875 , 1.9375], dtype=float32)
  """
  context_lib.check_context(context)
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
  common.check_choice("form", form, SCAN_FORMS + ("auto",))
  form = "chunk" if form == "auto" else form
  chunk_size = dispatch.resolve_chunk_size(chunk_size, "scan")
  common.check_segment_ids(segment_ids, bsz, t)
  unsupported = kernel.unsupported_arguments(a, b, h0)
  if form != "chunk":
    unsupported["form"] = f"{form!r} (the kernel replaces the chunk form)"
  use_pallas = dispatch.resolve_implementation(implementation, unsupported)
  if context is not None:
    context.check(bsz, t)
    context_lib.refuse_pallas(implementation)
    return _placed(a, b, h0, segment_ids, context=context, form=form, chunk_size=chunk_size,
                   reverse=reverse, return_state=return_state, implementation=implementation)

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


# ------------------------------------------------------------ sequence parallel


def _placed(a, b, h0, segment_ids, *, context, form, chunk_size, reverse, return_state,
            implementation):
  """:func:`linear_scan` (checked) with the sequence split over ``context``."""
  if reverse:
    if context.is_local:
      raise ValueError("context: reverse=True needs the global arrays (the scan runs from the "
                       f"last device of {context.axis_name!r}); call linear_scan outside "
                       "jax.shard_map.")
    flip = lambda x: None if x is None else jnp.flip(x, 1)
    out = _placed(flip(a), flip(b), h0, flip(segment_ids), context=context, form=form,
                  chunk_size=chunk_size, reverse=False, return_state=return_state,
                  implementation=implementation)
    return (flip(out[0]), out[1]) if return_state else flip(out)
  out = _sequence_parallel(a, b, h0, segment_ids, context=context, form=form,
                           chunk_size=chunk_size, return_state=return_state,
                           implementation=implementation)
  return (out[0].astype(b.dtype), out[1]) if return_state else out.astype(b.dtype)


def _sequence_parallel(a, b, h0, segment_ids, *, context, form, chunk_size, return_state,
                       implementation):
  named = {"a": (a, context.seq_spec), "b": (b, context.seq_spec),
           "h0": (h0, context.row_spec), "segment_ids": (segment_ids, context.seq_spec)}
  out = (context.seq_spec, context.row_spec) if return_state else context.seq_spec
  return context_lib.run_sharded(_local, context, named, out, form=form, chunk_size=chunk_size,
                                 return_state=return_state, implementation=implementation)


def _local(a, b, h0=None, segment_ids=None, *, axis_name, form, chunk_size, return_state,
           implementation):
  """Per device: the slice from a zero state, then ``+ (prod of a so far) * entering state``."""
  acc = common.acc_dtype(a.dtype, b.dtype, *(() if h0 is None else (h0.dtype,)))
  a, b = a.astype(acc), b.astype(acc)
  zero = jnp.zeros_like(b[:, 0]) + context_lib.varying_zero(a, segment_ids, dtype=acc)
  h, end = linear_scan(a, b, h0=zero, form=form, chunk_size=chunk_size,
                       segment_ids=segment_ids, return_state=True,
                       implementation=implementation)
  cont = None
  if segment_ids is not None:  # a reset inside the slice stops the entering state there
    starts = common.segment_starts(segment_ids)
    a = jnp.where(starts.reshape(starts.shape + (1,) * (a.ndim - 2)), 0, a)
    cont, _, _ = context_lib.device_segments(segment_ids, axis_name, jnp.float32)
  cum_a = lax.associative_scan(jnp.multiply, a, axis=1)
  s_in, s_end = context_lib.fold_affine(
      jnp.multiply, lax.all_gather(cum_a[:, -1], axis_name), lax.all_gather(end, axis_name),
      h0, cont, axis_name)
  h = h.astype(acc) + cum_a * s_in[:, None]
  return (h, context_lib.replicate(s_end, axis_name)) if return_state else h
