"""Short depthwise causal convolution (the token mixer in front of Mamba's
scan and Griffin's RG-LRU).

``y_t[d] = bias[d] + sum_w weight[w, d] * x_{t - (W - 1) + w}[d]``: the last
tap ``weight[W - 1]`` multiplies the current token, as in a left-padded
``conv1d``. The decoding state is the last ``W - 1`` inputs, oldest first.

With the sequence split over devices (``context=``), each device receives the
last ``W - 1`` inputs of the previous one (one ``ppermute``, :func:`halo`) and
convolves its slice with them in front: the sequence is never gathered.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from linear_attention import common
from linear_attention.engines.context import SeqContext, axis_index, check_context

Array = jax.Array

ACTIVATIONS = (None, "silu", "swish")


def _check_common(x_name, x, weight, bias, activation, batch_rank):
  common.check_float(x_name, x)
  common.check_float("weight", weight)
  common.check_rank("weight", weight, 2)
  d = x.shape[-1]
  common.check_shape("weight", weight, (None, d), "[W, D] with D the channels of x")
  if bias is not None:
    common.check_shape("bias", bias, (d,), "[D]")
  common.check_choice("activation", activation, ACTIVATIONS)
  return weight.shape[0], d


def _activate(y, activation):
  return y if activation is None else jax.nn.silu(y)


def causal_conv1d(
    x: Array,
    weight: Array,
    bias: Array | None = None,
    *,
    initial_state: Array | None = None,
    return_state: bool = False,
    segment_ids: Array | None = None,
    activation: str | None = None,
    context: SeqContext | None = None,
):
  """Depthwise causal convolution along the sequence.

  Args:
    x: ``[B, T, D]`` inputs.
    weight: ``[W, D]`` taps; ``weight[W - 1]`` multiplies the current token.
    bias: optional ``[D]``.
    initial_state: optional ``[B, W - 1, D]``: the ``W - 1`` inputs before
      ``x`` (oldest first), e.g. from a previous call; seen by the first
      segment of each row only.
    return_state: also return the state for decoding.
    segment_ids: optional ``[B, T]`` ints; taps never reach into another
      segment (they read zeros instead).
    activation: ``None`` or ``"silu"`` (``"swish"``), applied after the bias.
    context: optional :class:`~linear_attention.ops.context.SeqContext`: the
      sequence split over its mesh axis, each device holding at least ``W - 1``
      tokens; the same result, from a halo of ``W - 1`` tokens per device.

  Returns:
    ``y`` ``[B, T, D]`` in the dtype of ``x``, or ``(y, state)`` with ``state``
    ``[B, W - 1, D]`` float32: the last ``W - 1`` inputs of the last segment
    (zeros where that segment is shorter).

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> x = jax.random.normal(jax.random.key(0), (1, 8, 3))  # [B, T, D]
    >>> w = jax.random.normal(jax.random.key(1), (4, 3))  # [W, D], w[-1] for the current token
    >>> y = ops.causal_conv1d(x, w)
    >>> y.shape
    (1, 8, 3)
    >>> bool(jnp.allclose(y[:, 0], x[:, 0] * w[-1]))  # the first token sees only itself
    True
  """
  common.check_rank("x", x, 3)
  w, d = _check_common("x", x, weight, bias, activation, 3)
  bsz, t, _ = x.shape
  common.check_seq_len(t, "axis 1 of x")
  if initial_state is not None:
    common.check_shape("initial_state", initial_state, (bsz, w - 1, d), "[B, W - 1, D]")
    common.check_float("initial_state", initial_state)
  common.check_segment_ids(segment_ids, bsz, t)
  check_context(context)
  if context is not None and w > 1:
    return _context_conv(x, weight, bias, initial_state, segment_ids, context=context,
                         return_state=return_state, activation=activation)
  acc = jnp.promote_types(x.dtype, jnp.float32)

  past = (jnp.zeros((bsz, w - 1, d), acc) if initial_state is None
          else initial_state.astype(acc))
  xp = jnp.concatenate([past, x.astype(acc)], axis=1)  # [B, W - 1 + T, D]
  if segment_ids is not None:
    # The state belongs to segment 0; a tap is kept when its source position is
    # in the same (monotone-indexed) segment as the output position.
    seg = common.segment_index(segment_ids)
    segp = jnp.concatenate([jnp.zeros((bsz, w - 1), seg.dtype), seg], axis=1)
  y = jnp.zeros((bsz, t, d), acc)
  for i in range(w):
    tap = xp[:, i:i + t]
    if segment_ids is not None:
      tap = jnp.where((segp[:, i:i + t] == seg)[..., None], tap, 0)
    y = y + tap * weight[i].astype(acc)
  if bias is not None:
    y = y + bias.astype(acc)
  y = _activate(y, activation).astype(x.dtype)
  if not return_state:
    return y
  state = xp[:, xp.shape[1] - (w - 1):]
  if segment_ids is not None:
    keep = segp[:, segp.shape[1] - (w - 1):] == seg[:, -1:]
    state = jnp.where(keep[..., None], state, 0)
  return y, state


def halo(x: Array, size: int, context: SeqContext, *, from_next: bool = False) -> Array:
  """The ``size`` tokens next to this device's slice, inside the context's ``shard_map``.

  Args:
    x: ``[B, T, ...]`` this device's slice, ``T >= size``.
    size: tokens to fetch, >= 1.
    context: the context whose ``axis_name`` splits the sequence.
    from_next: False: the last ``size`` tokens of the previous device (the first
      device gets zeros); True: the first ``size`` tokens of the next device (the
      last device gets zeros).

  Returns:
    ``[B, size, ...]`` in the dtype of ``x``. One ``ppermute``.
  """
  n = context.size
  if from_next:
    return lax.ppermute(x[:, :size], context.axis_name, [(i + 1, i) for i in range(n - 1)])
  return lax.ppermute(x[:, x.shape[1] - size:], context.axis_name,
                      [(i, i + 1) for i in range(n - 1)])


def check_halo(name: str, size: int, context: SeqContext, local: int) -> None:
  """Raises a ``ValueError`` unless a device's ``local`` tokens hold a halo of ``size``."""
  if size > local:
    raise ValueError(
        f"context: {name} needs at least {size} tokens per device of mesh axis "
        f"{context.axis_name!r}, got {local}; use a longer sequence or fewer devices on "
        "that axis.")


def _context_conv(x, weight, bias, initial_state, segment_ids, *, context, return_state,
                  activation):
  """:func:`causal_conv1d` with the sequence split over ``context``'s axis (``W >= 2``)."""
  context.check(x.shape[0], x.shape[1])
  w = weight.shape[0]
  acc = jnp.promote_types(x.dtype, jnp.float32)

  def body(x, weight, bias=None, initial_state=None, segment_ids=None):
    check_halo(f"the short convolution of width {w}", w - 1, context, x.shape[1])
    first = axis_index(context.axis_name) == 0
    prev = halo(x.astype(acc), w - 1, context)
    if initial_state is not None:
      prev = jnp.where(first, initial_state.astype(acc), prev)
    xs = jnp.concatenate([prev, x.astype(acc)], axis=1)
    seg = None
    if segment_ids is not None:
      # The first device's halo (the initial state) belongs to its first segment.
      prev_ids = jnp.where(first, segment_ids[:, :1], halo(segment_ids, w - 1, context))
      seg = jnp.concatenate([prev_ids, segment_ids], axis=1)
    out = causal_conv1d(xs, weight, bias, segment_ids=seg, activation=activation,
                        return_state=return_state)
    y = (out[0] if return_state else out)[:, w - 1:].astype(x.dtype)
    if not return_state:
      return y
    last = axis_index(context.axis_name) == context.size - 1
    return y, lax.psum(jnp.where(last, out[1], 0.0), context.axis_name)

  spec = context.seq_spec
  named = {"x": (x, spec), "weight": (weight, P()), "bias": (bias, P()),
           "initial_state": (initial_state, context.row_spec), "segment_ids": (segment_ids, spec)}
  return context.shard(body, named, (spec, context.row_spec) if return_state else spec)


def causal_conv1d_step(
    state: Array,
    x: Array,
    weight: Array,
    bias: Array | None = None,
    *,
    activation: str | None = None,
):
  """One token of :func:`causal_conv1d`.

  Args:
    state: ``[B, W - 1, D]`` the previous ``W - 1`` inputs, oldest first.
    x: ``[B, D]`` the new token.
    weight: ``[W, D]``; bias: optional ``[D]``; activation: as in
      :func:`causal_conv1d`.

  Returns:
    ``(y, new_state)``: ``y`` ``[B, D]`` in the dtype of ``x``, ``new_state``
    ``[B, W - 1, D]`` float32.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> from linear_attention import ops
    >>> x = jax.random.normal(jax.random.key(0), (1, 8, 3))
    >>> w = jax.random.normal(jax.random.key(1), (4, 3))
    >>> _, state = ops.causal_conv1d(x[:, :7], w, return_state=True)
    >>> y, state = ops.causal_conv1d_step(state, x[:, 7], w)
    >>> y.shape, state.shape  # state: the last W - 1 inputs
    ((1, 3), (1, 3, 3))
    >>> bool(jnp.allclose(y, ops.causal_conv1d(x, w)[:, 7], atol=1e-5))
    True
  """
  common.check_step_state_first(state, "[B, W - 1, D]", 3)
  common.check_rank("x", x, 2)
  w, d = _check_common("x", x, weight, bias, activation, 2)
  common.check_step_state("state", state, (x.shape[0], w - 1, d), "[B, W - 1, D]")
  acc = jnp.promote_types(x.dtype, jnp.float32)
  window = jnp.concatenate([state.astype(acc), x[:, None].astype(acc)], axis=1)  # [B, W, D]
  y = jnp.einsum("bwd,wd->bd", window, weight.astype(acc))
  if bias is not None:
    y = y + bias.astype(acc)
  return _activate(y, activation).astype(x.dtype), window[:, 1:]
