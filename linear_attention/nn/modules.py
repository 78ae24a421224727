"""The small modules and helpers the mixer layers are built from: projections, rotary
embeddings (``rope``), the short causal convolution (``ShortConv``), the per-head norm
(``HeadNorm``), token shift, head splitting, and the Performer features' variable type.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from linear_attention.nn import context_parallel as cp
from linear_attention import common as common_ops
from linear_attention.ops import conv as conv_ops
from linear_attention.ops import feature_maps as fm

Array = jax.Array
Dtype = Any


class RandomFeatures(nnx.Variable):
  """A non-trainable random projection ``[num_features, dim]`` (Performer features).

  Not an ``nnx.Param``: optimisers built with ``wrt=nnx.Param`` leave it alone
  and ``count_params`` does not count it. ``orthogonal`` is kept as metadata so
  that :meth:`redraw` draws the same kind of matrix again.
  """

  def redraw(self, key: Array) -> None:
    """Replaces the projection by a fresh draw of the same shape and kind."""
    m, d = self[...].shape
    self.set_value(fm.random_projection(key, m, d, orthogonal=bool(self.orthogonal)))


def dense(in_features: int, out_features: int, *, rngs: nnx.Rngs, dtype: Dtype = None,
          param_dtype: Dtype = jnp.float32, use_bias: bool = False, **kwargs) -> nnx.Linear:
  """``nnx.Linear`` with this package's defaults (no bias)."""
  return nnx.Linear(in_features, out_features, use_bias=use_bias, dtype=dtype,
                    param_dtype=param_dtype, rngs=rngs, **kwargs)


def param(value: Array, dtype: Dtype) -> nnx.Param:
  """An ``nnx.Param`` holding ``value`` cast to ``dtype``."""
  return nnx.Param(jnp.asarray(value).astype(dtype))


def inverse_softplus(x: Array) -> Array:
  """``y`` with ``softplus(y) = x`` (for ``x > 0``), stable for small ``x``."""
  return x + jnp.log(-jnp.expm1(-x))


def log_uniform(key: Array, shape, low: float, high: float) -> Array:
  """Samples log-uniformly in ``[low, high]``, float32."""
  u = jax.random.uniform(key, shape, jnp.float32)
  return jnp.exp(u * (jnp.log(high) - jnp.log(low)) + jnp.log(low))


# ----------------------------------------------------------------------------- decay init
# The Mamba family's per-step decay is exp(-A * dt), dt = softplus(x W + dt_bias). Its
# starting point (A's range, dt's range) decides what a short run can learn (the MQAR
# study sweeps it), so the layers take it as options; these helpers keep them one way.


def check_decay_init(*, a_init_range=None, **positive: float) -> None:
  """ValueError naming the argument unless every ``positive`` value is a number > 0, ``dt_min
  <= dt_max`` when both are given, and ``a_init_range`` (if given) is ``(low, high)`` with
  ``0 < low <= high``."""
  for name, v in positive.items():
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
      raise ValueError(f"{name} must be a number > 0, got {v!r}.")
  if "dt_min" in positive and "dt_max" in positive and positive["dt_min"] > positive["dt_max"]:
    raise ValueError(f"dt_min must be <= dt_max, got dt_min={positive['dt_min']!r}, "
                     f"dt_max={positive['dt_max']!r}.")
  if a_init_range is not None:
    ok = isinstance(a_init_range, (tuple, list)) and len(a_init_range) == 2
    ok = ok and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in a_init_range)
    if not (ok and 0 < a_init_range[0] <= a_init_range[1]):
      raise ValueError(f"a_init_range must be (low, high) with 0 < low <= high, got "
                       f"{a_init_range!r}.")


def dt_bias_init(key: Array, shape, dt_min: float, dt_max: float, floor: float = 1e-4) -> Array:
  """``dt_bias`` with ``softplus(dt_bias)`` log-uniform in ``[dt_min, dt_max]``, at least
  ``floor`` (Mamba's ``dt_init_floor``); float32 ``shape``."""
  dt = jnp.maximum(log_uniform(key, shape, dt_min, dt_max), floor)
  return inverse_softplus(dt)


def a_log_init(key: Array, shape, a_init_range=(1.0, 16.0)) -> Array:
  """``A_log = log(A)`` with ``A`` uniform in ``a_init_range`` (Mamba-2's ``A_init_range``),
  float32 ``shape``."""
  low, high = a_init_range
  return jnp.log(jax.random.uniform(key, shape, minval=low, maxval=high))


def positions_of(batch: int, seq: int, segment_ids: Array | None) -> Array:
  """``[B, T]`` int32 positions, restarting at 0 at each segment start."""
  pos = jnp.broadcast_to(jnp.arange(seq, dtype=jnp.int32), (batch, seq))
  if segment_ids is None:
    return pos
  starts = common_ops.segment_starts(segment_ids)
  first = jax.lax.cummax(jnp.where(starts, pos, 0), axis=1)
  return pos - first


def rope(x: Array, positions: Array, base: float = 10000.0) -> Array:
  """Rotary embedding of ``x [B, T, H, Dh]`` at ``positions [B, T]`` (half-split layout).

  Rotated in float32, returned in the dtype of ``x``. ``Dh`` must be even.
  """
  dh = x.shape[-1]
  half = dh // 2
  freq = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
  angle = positions.astype(jnp.float32)[..., None, None] * freq  # [B, T, 1, half]
  sin, cos = jnp.sin(angle), jnp.cos(angle)
  x1, x2 = x[..., :half].astype(jnp.float32), x[..., half:].astype(jnp.float32)
  out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
  return out.astype(x.dtype)


def repeat_kv(x: Array, groups: int) -> Array:
  """``[..., Hkv, Dh] -> [..., Hkv * groups, Dh]``: head ``h`` reads kv head ``h // groups``."""
  return x if groups == 1 else jnp.repeat(x, groups, axis=-2)


def token_shift(x: Array, segment_ids: Array | None, first: Array | None = None) -> Array:
  """``x`` one step later along axis 1: ``out_t = x_{t-1}``; zeros (or ``first``) at ``t = 0``.

  With ``segment_ids``, ``out_t = 0`` where a new segment starts.
  """
  head = jnp.zeros_like(x[:, :1]) if first is None else first[:, None].astype(x.dtype)
  out = jnp.concatenate([head, x[:, :-1]], axis=1)
  if segment_ids is not None:
    out = jnp.where(common_ops.segment_starts(segment_ids)[..., None], 0, out)
  return out


class ShortConv(nnx.Module):
  """Depthwise causal convolution of width ``W`` over ``channels`` (Mamba, DeltaNet, Hawk).

  ``__call__(x [B, T, C]) -> [B, T, C]``; ``step(x [B, C], state [B, W-1, C])``.
  """

  def __init__(self, channels: int, width: int = 4, *, activation: str | None = "silu",
               use_bias: bool = True, rngs: nnx.Rngs, param_dtype: Dtype = jnp.float32):
    self.width = width
    self.channels = channels
    self.activation = activation
    # PyTorch's Conv1d default: uniform in +-1/sqrt(fan_in), fan_in = width (depthwise).
    bound = width**-0.5
    self.weight = nnx.Param(jax.random.uniform(
        rngs.params(), (width, channels), jnp.float32, -bound, bound).astype(param_dtype))
    self.bias = nnx.Param(jnp.zeros((channels,), param_dtype)) if use_bias else None

  def _bias(self):
    return None if self.bias is None else self.bias[...]

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, C]`` -> ``[B, T, C]`` in the dtype of ``x``.

    With the sequence sharded (``config.mesh.seq``), each device reads a halo of ``W - 1``
    tokens from the previous one (see :mod:`~linear_attention.nn.context_parallel`).
    """
    return conv_ops.causal_conv1d(x, self.weight[...].astype(x.dtype), self._bias(),
                                  segment_ids=segment_ids, activation=self.activation,
                                  context=cp.context())

  def init_state(self, batch: int) -> Array:
    """Zeros ``[B, W - 1, C]`` float32 (the op keeps its state in float32)."""
    return jnp.zeros((batch, self.width - 1, self.channels), jnp.float32)

  def step(self, x: Array, state: Array) -> tuple[Array, Array]:
    """``x [B, C]``, ``state [B, W-1, C]`` -> ``(y [B, C], new_state)``."""
    return conv_ops.causal_conv1d_step(state, x, self.weight[...].astype(x.dtype), self._bias(),
                                       activation=self.activation)


class HeadNorm(nnx.Module):
  """RMSNorm over the last axis of ``[..., H, Dh]`` with one scale shared by the heads.

  With ``center=True`` it subtracts the mean first (a LayerNorm per head: the
  group norm of RetNet and RWKV-6, one group per head). With ``heads=H`` every channel of
  every head has its own scale ``[H, Dh]`` (xLSTM-7B's multi-head norm), and ``use_bias``
  adds a bias of the scale's shape.
  """

  def __init__(self, dim: int, *, eps: float = 1e-5, center: bool = False,
               heads: int | None = None, use_bias: bool = False,
               rngs: nnx.Rngs, param_dtype: Dtype = jnp.float32):
    del rngs
    if heads is not None and (isinstance(heads, bool) or not isinstance(heads, int)
                              or heads < 1):
      raise ValueError(f"heads must be None (one scale shared by the heads) or an int >= 1, "
                       f"got {heads!r}.")
    self.eps = eps
    self.center = center
    shape = (dim,) if heads is None else (heads, dim)
    self.scale = nnx.Param(jnp.ones(shape, param_dtype))
    self.bias = nnx.Param(jnp.zeros(shape, param_dtype)) if use_bias else None

  def __call__(self, x: Array) -> Array:
    """Normalises in float32, returns the dtype of ``x``."""
    xf = x.astype(jnp.float32)
    if self.center:
      xf = xf - jnp.mean(xf, axis=-1, keepdims=True)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
    xf = xf * self.scale[...].astype(jnp.float32)
    if self.bias is not None:
      xf = xf + self.bias[...].astype(jnp.float32)
    return xf.astype(x.dtype)


def soft_cap(x: Array, cap: float | None) -> Array:
  """``cap * tanh(x / cap)`` (Gemma's and xLSTM-7B's logit and gate soft-cap), ``x`` itself
  for ``cap=None``; any shape, the dtype of ``x``."""
  if cap is None:
    return x
  return (cap * jnp.tanh(x.astype(jnp.float32) / cap)).astype(x.dtype)


def check_soft_cap(name: str, cap: Any) -> None:
  """``ValueError`` naming ``name`` unless ``cap`` is None or a finite number > 0."""
  if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float))
                          or not 0 < cap < float("inf")):
    raise ValueError(f"{name} must be None (no cap) or a finite number > 0, got {cap!r}.")


def split_heads(x: Array, heads: int) -> Array:
  """``[..., H * Dh] -> [..., H, Dh]``."""
  return x.reshape(x.shape[:-1] + (heads, x.shape[-1] // heads))


def merge_heads(x: Array) -> Array:
  """``[..., H, Dh] -> [..., H * Dh]``."""
  return x.reshape(x.shape[:-2] + (-1,))
