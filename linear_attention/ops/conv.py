"""Short depthwise causal convolution (the token mixer in front of Mamba's
scan and Griffin's RG-LRU).

``y_t[d] = bias[d] + sum_w weight[w, d] * x_{t - (W - 1) + w}[d]``: the last
tap ``weight[W - 1]`` multiplies the current token, as in a left-padded
``conv1d``. The decoding state is the last ``W - 1`` inputs, oldest first.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from linear_attention import common

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

  Returns:
    ``y`` ``[B, T, D]`` in the dtype of ``x``, or ``(y, state)`` with ``state``
    ``[B, W - 1, D]`` float32: the last ``W - 1`` inputs of the last segment
    (zeros where that segment is shorter).
  """
  common.check_rank("x", x, 3)
  w, d = _check_common("x", x, weight, bias, activation, 3)
  bsz, t, _ = x.shape
  common.check_seq_len(t, "axis 1 of x")
  if initial_state is not None:
    common.check_shape("initial_state", initial_state, (bsz, w - 1, d), "[B, W - 1, D]")
    common.check_float("initial_state", initial_state)
  common.check_segment_ids(segment_ids, bsz, t)
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


def causal_conv1d_step(
    x: Array,
    state: Array,
    weight: Array,
    bias: Array | None = None,
    *,
    activation: str | None = None,
):
  """One token of :func:`causal_conv1d`.

  Args:
    x: ``[B, D]`` the new token.
    state: ``[B, W - 1, D]`` the previous ``W - 1`` inputs, oldest first.
    weight: ``[W, D]``; bias: optional ``[D]``; activation: as in
      :func:`causal_conv1d`.

  Returns:
    ``(y, new_state)``: ``y`` ``[B, D]`` in the dtype of ``x``, ``new_state``
    ``[B, W - 1, D]`` float32.
  """
  common.check_rank("x", x, 2)
  w, d = _check_common("x", x, weight, bias, activation, 2)
  common.check_step_state("state", state, (x.shape[0], w - 1, d), "[B, W - 1, D]")
  acc = jnp.promote_types(x.dtype, jnp.float32)
  window = jnp.concatenate([state.astype(acc), x[:, None].astype(acc)], axis=1)  # [B, W, D]
  y = jnp.einsum("bwd,wd->bd", window, weight.astype(acc))
  if bias is not None:
    y = y + bias.astype(acc)
  return _activate(y, activation).astype(x.dtype), window[:, 1:]
