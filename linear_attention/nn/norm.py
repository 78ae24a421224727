"""RMS normalisation with the conventions real checkpoints use.

:class:`RMSNorm` normalises the last axis of ``[..., dim]`` in float32 and multiplies by
``offset + scale``: ``offset=0`` is the usual learned scale (initialised at 1), ``offset=1``
the zero-centred scale of Gemma and Qwen3-Next (initialised at 0). Applied to ``[..., H, Dh]``
with ``dim = Dh`` it is a per-head norm with one scale shared by the heads; applied to the
flat ``[..., H * Dh]`` it is a full-width norm (OLMo's q/k norm).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from linear_attention.nn.mixer import check_positive

Array = jax.Array
Dtype = Any


def check_eps(name: str, value: Any) -> None:
  """``ValueError`` naming ``name`` unless ``value`` is a number > 0."""
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
    raise ValueError(f"{name} must be a number > 0, got {value!r}.")


class RMSNorm(nnx.Module):
  """``x / sqrt(mean(x^2) + eps) * (offset + scale)`` over the last axis.

  Args:
    dim: size of the normalised (last) axis.
    eps: added to the mean square.
    offset: 0 (scale starts at 1) or 1 (zero-centred scale, starts at 0).
  """

  def __init__(self, dim: int, *, eps: float = 1e-6, offset: float = 0.0,
               rngs: nnx.Rngs | None = None, param_dtype: Dtype = jnp.float32):
    del rngs
    check_positive("dim", dim)
    check_eps("eps", eps)
    if offset not in (0, 1):
      raise ValueError(f"offset must be 0 or 1, got {offset!r}.")
    self.dim, self.eps, self.offset = dim, float(eps), float(offset)
    self.scale = nnx.Param(jnp.full((dim,), 1.0 - offset, param_dtype))

  def __call__(self, x: Array) -> Array:
    """``[..., dim]`` -> the same shape and dtype; float32 inside."""
    if x.shape[-1] != self.dim:
      raise ValueError(f"x must have last axis {self.dim}, got shape {tuple(x.shape)}.")
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
    return (xf * (self.offset + self.scale[...].astype(jnp.float32))).astype(x.dtype)
