"""Pre-norm residual block: ``x + mixer(RMSNorm(x))``, then ``x + MLP(RMSNorm(x))``.

Shapes: ``x [B, T, D] -> [B, T, D]``; decoding ``x_t [B, D] -> [B, D]``.
"""

from __future__ import annotations

from typing import Any, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from linear_attention.models import stack
from linear_attention.nn import modules
from linear_attention.nn import registry

Array = jax.Array


class GLUMLP(nnx.Module):
  """Gated MLP ``W_down(silu(W_gate x) * W_up x)`` (SwiGLU), hidden width ``hidden``."""

  def __init__(self, d_model: int, hidden: int, *, rngs: nnx.Rngs, dtype=None,
               param_dtype=jnp.float32):
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.hidden = hidden
    self.up = modules.dense(d_model, 2 * hidden, **kw)  # gate and up, one matmul
    self.down = modules.dense(hidden, d_model, **kw)

  def __call__(self, x: Array) -> Array:
    """``[..., D] -> [..., D]``."""
    gu = self.up(x)
    return self.down(jax.nn.silu(gu[..., :self.hidden]) * gu[..., self.hidden:])


def mlp_hidden(d_model: int, mlp_ratio: float) -> int:
  """``mlp_ratio * D`` rounded up to a multiple of 8 (0 when ``mlp_ratio`` is 0)."""
  h = int(round(mlp_ratio * d_model))
  return 0 if h <= 0 else -(-h // 8) * 8


class Block(nnx.Module):
  """One pre-norm residual block around a mixer from the registry (and an optional GLU MLP).

  Args:
    d_model: width ``D``.
    mixer: a registry name (see ``linear_attention.nn.MIXERS``).
    num_heads: heads of the mixer.
    mlp_ratio: MLP hidden width over ``D``; 0 drops the MLP (Mamba-style stacks).
    mixer_kwargs: extra keyword arguments of the mixer.
    short_conv: width of a depthwise causal convolution applied to the mixer's
      (normalised) input, 0 for none. It gives every mixer a previous-token
      path, as Zoology's MQAR recipes (a short convolution before each mixer)
      and flash-linear-attention's ``use_short_conv`` do. Its window is
      carried in the decode cache, so decoding still equals the forward pass.
  """

  def __init__(self, d_model: int, mixer: str, num_heads: int, *, mlp_ratio: float = 8 / 3,
               mixer_kwargs: Mapping[str, Any] | None = None, norm_eps: float = 1e-6,
               short_conv: int = 0, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    if short_conv < 0 or short_conv == 1:
      raise ValueError(f"short_conv must be 0 (none) or a width >= 2, got {short_conv}.")
    self.mixer_name = mixer
    norm = lambda: nnx.RMSNorm(d_model, epsilon=norm_eps, dtype=dtype, param_dtype=param_dtype,
                               rngs=rngs)
    self.mixer_norm = norm()
    # No activation: a linear mix of the last few tokens, which the mixer's own
    # projections then read (keys from the previous token, values from this one).
    self.pre_conv = modules.ShortConv(d_model, short_conv, activation=None, rngs=rngs,
                                   param_dtype=param_dtype) if short_conv else None
    self.mixer = registry.make_mixer(mixer, d_model, num_heads, rngs=rngs, dtype=dtype,
                                     param_dtype=param_dtype, **dict(mixer_kwargs or {}))
    hidden = mlp_hidden(d_model, mlp_ratio)
    self.mlp_norm = norm() if hidden else None
    self.mlp = GLUMLP(d_model, hidden, rngs=rngs, dtype=dtype,
                      param_dtype=param_dtype) if hidden else None

  def _mlp(self, x):
    return x if self.mlp is None else x + self.mlp(self.mlp_norm(x))

  def __call__(self, x: Array, segment_ids: Array | None = None, *,
               remat_mixer: bool = False) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``.

    ``remat_mixer``: recompute the mixer in the backward pass instead of keeping its
    intermediates (``model.remat="mixer_only"``); the values are the same.
    """
    h = self.mixer_norm(x)
    if self.pre_conv is not None:
      h = self.pre_conv(h, segment_ids=segment_ids)
    if remat_mixer:
      x = x + stack.call_checkpointed(self.mixer, lambda m, h, s: m(h, segment_ids=s), h,
                                      segment_ids)
    else:
      x = x + self.mixer(h, segment_ids=segment_ids)
    return self._mlp(x)

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32):
    """The mixer's cache (with ``short_conv``: ``{"mixer": ..., "conv": [B, W-1, D]}``)."""
    cache = self.mixer.init_cache(batch, max_len, dtype)
    if self.pre_conv is None:
      return cache
    return {"mixer": cache, "conv": self.pre_conv.init_state(batch)}

  def decode_step(self, x: Array, cache) -> tuple[Array, Any]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    h = self.mixer_norm(x)
    if self.pre_conv is None:
      y, cache = self.mixer.decode_step(h, cache)
      return self._mlp(x + y), cache
    h, conv = self.pre_conv.step(h, cache["conv"])
    y, mixer_cache = self.mixer.decode_step(h, cache["mixer"])
    return self._mlp(x + y), {"mixer": mixer_cache, "conv": conv}
