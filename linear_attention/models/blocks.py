"""Pre-norm residual block: ``x + mixer(RMSNorm(x))``, then ``x + MLP(RMSNorm(x))``.

Shapes: ``x [B, T, D] -> [B, T, D]``; decoding ``x_t [B, D] -> [B, D]``.

A model given layer by layer (the real checkpoints of :mod:`linear_attention.hub`) is a
list of :class:`LayerSpec`: each layer names its own mixer (or none), heads, mixer
options, MLP kind and width, so no option is shared by name across layers.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Mapping

import jax
import jax.numpy as jnp
from flax import nnx

from linear_attention.models import stack
from linear_attention.nn import modules
from linear_attention.nn import moe as moe_lib
from linear_attention.nn.mlp import MLP
from linear_attention.nn import norm as norm_lib
from linear_attention.nn import registry

Array = jax.Array


class GLUMLP(MLP):
  """Gated MLP ``W_down(silu(W_gate x) * W_up x)`` (SwiGLU): :class:`~nn.mlp.MLP` with silu."""

  def __init__(self, d_model: int, hidden: int, *, rngs: nnx.Rngs, dtype=None,
               param_dtype=jnp.float32):
    super().__init__(d_model, hidden, activation="silu", gated=True, rngs=rngs, dtype=dtype,
                     param_dtype=param_dtype)


class ReluSquaredMLP(MLP):
  """Plain MLP ``W_down(relu(W_up x)^2)`` (Nemotron-H, Primer's squared ReLU): an ungated
  :class:`~nn.mlp.MLP`."""

  def __init__(self, d_model: int, hidden: int, *, rngs: nnx.Rngs, dtype=None,
               param_dtype=jnp.float32):
    super().__init__(d_model, hidden, activation="relu2", gated=False, rngs=rngs, dtype=dtype,
                     param_dtype=param_dtype)


def _moe(d_model: int, hidden: int, **kwargs) -> moe_lib.MoE:
  """A mixture of experts of width ``hidden`` per expert (``kwargs``: :class:`~nn.moe.MoE`'s)."""
  return moe_lib.MoE(d_model, hidden=hidden, **kwargs)


# MLP kinds of a block: name -> class taking (d_model, hidden, rngs=, dtype=, param_dtype=,
# **mlp_kwargs); "moe" needs mlp_kwargs (num_experts, top_k, ...: nn.moe.MoE's options).
# "geglu_bias": GeGLU (tanh GELU) with biases on its three projections (RecurrentGemma).
MLPS = {"swiglu": GLUMLP, "relu2": ReluSquaredMLP, "moe": _moe,
        "geglu_bias": functools.partial(MLP, activation="gelu_tanh", gated=True, use_bias=True)}


@dataclasses.dataclass(frozen=True)
class LayerSpec:
  """One layer of a model described layer by layer.

  Attributes:
    mixer: a registry name (``linear_attention.nn.MIXERS``), or ``None`` for a layer that
      is only an MLP (Nemotron-H's ``-`` layers).
    num_heads: the mixer's heads.
    mixer_kwargs: the mixer's options, for this layer only.
    mlp: an MLP kind of :data:`MLPS`, or ``None`` for no MLP (Mamba stacks).
    mlp_hidden: the MLP's hidden width (``> 0`` when ``mlp`` is set; an expert's for MoE).
    norm_eps: epsilon of the block's RMSNorms.
    mlp_kwargs: the MLP's options (``"moe"``: :class:`~linear_attention.nn.moe.MoE`'s).
    norm_offset: 1 for zero-centred norm scales (``1 + scale``, Qwen3-Next), else 0.
    post_norm: normalise the mixer's and the MLP's outputs instead of their inputs
      (``x + RMSNorm(mixer(x))``, OLMo-2/OLMo-Hybrid's attention layers).
    residual_scale: multiplies the mixer's and the MLP's outputs before each residual add
      (Granite's ``residual_multiplier``); a pair ``(mixer's, MLP's)`` scales them apart.
    residual_alpha: multiplies the residual itself, a number or a pair ``(mixer's, MLP's)``
      (MiniMax-01's ``*_alpha_factor``; ``residual_scale`` is its ``*_beta_factor``).
    norm_residual: the residual is the normalised input, ``RMSNorm(x) * alpha + mixer(RMSNorm(x))
      * scale`` (MiniMax-01's blocks), not ``x``.
  """
  mixer: str | None
  num_heads: int = 1
  mixer_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  mlp: str | None = None
  mlp_hidden: int = 0
  norm_eps: float = 1e-6
  mlp_kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  norm_offset: float = 0.0
  post_norm: bool = False
  residual_scale: float | tuple[float, float] = 1.0
  residual_alpha: float | tuple[float, float] = 1.0
  norm_residual: bool = False

  def __post_init__(self):
    if self.mixer is None and self.mlp is None:
      raise ValueError("LayerSpec needs a mixer or an mlp (or both), got neither.")
    if self.mixer is not None and self.mixer not in registry.MIXERS:
      raise ValueError(f"LayerSpec mixer must be one of {list(registry.MIXERS)} or None, got "
                       f"{self.mixer!r}.")
    if self.mlp is not None and self.mlp not in MLPS:
      raise ValueError(f"LayerSpec mlp must be one of {list(MLPS)} or None, got {self.mlp!r}.")
    if self.mlp is not None and not (isinstance(self.mlp_hidden, int) and self.mlp_hidden > 0):
      raise ValueError(f"LayerSpec mlp_hidden must be an int > 0 with mlp={self.mlp!r}, got "
                       f"{self.mlp_hidden!r}.")


def _pair(name: str, value) -> tuple[float, float]:
  """A number, or a ``(mixer's, MLP's)`` pair of numbers, as two floats."""
  values = tuple(value) if isinstance(value, (tuple, list)) else (value, value)
  if len(values) != 2 or any(isinstance(v, bool) or not isinstance(v, (int, float))
                             for v in values):
    raise ValueError(f"{name} must be a number or a (mixer's, MLP's) pair of numbers, got "
                     f"{value!r}.")
  return float(values[0]), float(values[1])


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
    mlp: the MLP kind (:data:`MLPS`) when there is one.
    hidden: the MLP's hidden width, instead of ``mlp_ratio`` (0: no MLP).
    mlp_kwargs: the MLP's options (``mlp="moe"``: :class:`~linear_attention.nn.moe.MoE`'s).
    norm_offset: 1 for zero-centred norm scales (``1 + scale``), else 0.
    post_norm: ``x + RMSNorm(mixer(x))`` and ``x + RMSNorm(MLP(x))`` (norms after, not before).
    residual_scale: multiplies the mixer's and the MLP's outputs before the residual adds; a
      pair ``(mixer's, MLP's)`` scales them apart.
    residual_alpha: multiplies the residual (a number or a ``(mixer's, MLP's)`` pair).
    norm_residual: the residual of each add is the normalised input instead of ``x``.

  ``mixer=None`` makes a block that is only ``x + MLP(RMSNorm(x))`` (its cache is ``None``).
  """

  def __init__(self, d_model: int, mixer: str | None, num_heads: int, *,
               mlp_ratio: float = 8 / 3, mixer_kwargs: Mapping[str, Any] | None = None,
               norm_eps: float = 1e-6, short_conv: int = 0, mlp: str = "swiglu",
               hidden: int | None = None, mlp_kwargs: Mapping[str, Any] | None = None,
               norm_offset: float = 0.0, post_norm: bool = False,
               residual_scale: float | tuple[float, float] = 1.0,
               residual_alpha: float | tuple[float, float] = 1.0, norm_residual: bool = False,
               rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    if short_conv < 0 or short_conv == 1:
      raise ValueError(f"short_conv must be 0 (none) or a width >= 2, got {short_conv}.")
    if mlp not in MLPS:
      raise ValueError(f"mlp must be one of {list(MLPS)}, got {mlp!r}.")
    if mixer is None and short_conv:
      raise ValueError(f"short_conv needs a mixer, got mixer=None and short_conv={short_conv}.")
    if post_norm and short_conv:
      raise ValueError(f"short_conv reads the normalised input; post_norm=True has none, got "
                       f"short_conv={short_conv}.")
    self.mixer_scale, self.mlp_scale = _pair("residual_scale", residual_scale)
    self.mixer_alpha, self.mlp_alpha = _pair("residual_alpha", residual_alpha)
    if norm_residual and (post_norm or short_conv):
      raise ValueError(f"norm_residual=True takes the residual from the pre-norm, so it needs "
                       f"post_norm=False and short_conv=0, got post_norm={post_norm} and "
                       f"short_conv={short_conv}.")
    self.norm_residual = bool(norm_residual)
    self.mixer_name = mixer
    self.post_norm = bool(post_norm)
    if norm_offset:
      norm = lambda: norm_lib.RMSNorm(d_model, eps=norm_eps, offset=norm_offset,
                                      param_dtype=param_dtype)
    else:
      norm = lambda: nnx.RMSNorm(d_model, epsilon=norm_eps, dtype=dtype, param_dtype=param_dtype,
                                 rngs=rngs)
    self.mixer_norm = norm() if mixer is not None else None
    # No activation: a linear mix of the last few tokens, which the mixer's own
    # projections then read (keys from the previous token, values from this one).
    self.pre_conv = modules.ShortConv(d_model, short_conv, activation=None, rngs=rngs,
                                   param_dtype=param_dtype) if short_conv else None
    self.mixer = None if mixer is None else registry.make_mixer(
        mixer, d_model, num_heads, rngs=rngs, dtype=dtype, param_dtype=param_dtype,
        **dict(mixer_kwargs or {}))
    hidden = mlp_hidden(d_model, mlp_ratio) if hidden is None else hidden
    if mixer is None and not hidden:
      raise ValueError("a block with mixer=None needs an MLP (hidden > 0), got hidden=0.")
    self.mlp_norm = norm() if hidden else None
    self.mlp = MLPS[mlp](d_model, hidden, rngs=rngs, dtype=dtype, param_dtype=param_dtype,
                         **dict(mlp_kwargs or {})) if hidden else None

  @classmethod
  def from_spec(cls, d_model: int, spec: LayerSpec, *, rngs: nnx.Rngs, dtype=None,
                param_dtype=jnp.float32) -> "Block":
    """The block of one :class:`LayerSpec`."""
    return cls(d_model, spec.mixer, spec.num_heads, mixer_kwargs=spec.mixer_kwargs,
               norm_eps=spec.norm_eps, mlp=spec.mlp or "swiglu",
               hidden=spec.mlp_hidden if spec.mlp else 0, mlp_kwargs=spec.mlp_kwargs,
               norm_offset=spec.norm_offset, post_norm=spec.post_norm,
               residual_scale=spec.residual_scale, residual_alpha=spec.residual_alpha,
               norm_residual=spec.norm_residual, rngs=rngs, dtype=dtype,
               param_dtype=param_dtype)

  @staticmethod
  def _add(residual, alpha, y, scale):
    """``residual * alpha + y * scale``, skipping the multiplications by 1."""
    return (residual if alpha == 1.0 else residual * alpha) + (y if scale == 1.0 else y * scale)

  def _mixed(self, x, h, y):
    """The mixer's residual add: ``y`` the mixer's output on ``h = RMSNorm(x)``."""
    return self._add(h if self.norm_residual else x, self.mixer_alpha, y, self.mixer_scale)

  def _mlp(self, x):
    if self.mlp is None:
      return x
    if self.post_norm:
      return self._add(x, self.mlp_alpha, self.mlp_norm(self.mlp(x)), self.mlp_scale)
    h = self.mlp_norm(x)
    return self._add(h if self.norm_residual else x, self.mlp_alpha, self.mlp(h), self.mlp_scale)

  def __call__(self, x: Array, segment_ids: Array | None = None, *,
               remat_mixer: bool = False) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``.

    ``remat_mixer``: recompute the mixer in the backward pass instead of keeping its
    intermediates (``model.remat="mixer_only"``); the values are the same.
    """
    if self.mixer is None:
      return self._mlp(x)
    if remat_mixer:
      mix = lambda h: stack.call_checkpointed(
          self.mixer, lambda m, h, s: m(h, segment_ids=s), h, segment_ids)
    else:
      mix = lambda h: self.mixer(h, segment_ids=segment_ids)
    if self.post_norm:
      return self._mlp(self._add(x, self.mixer_alpha, self.mixer_norm(mix(x)), self.mixer_scale))
    h = self.mixer_norm(x)
    if self.pre_conv is not None:
      h = self.pre_conv(h, segment_ids=segment_ids)
    return self._mlp(self._mixed(x, h, mix(h)))

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32):
    """The mixer's cache (with ``short_conv``: ``{"mixer": ..., "conv": [B, W-1, D]}``)."""
    if self.mixer is None:
      return None
    cache = self.mixer.init_cache(batch, max_len, dtype)
    if self.pre_conv is None:
      return cache
    return {"mixer": cache, "conv": self.pre_conv.init_state(batch)}

  def decode_step(self, x: Array, cache) -> tuple[Array, Any]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    if self.mixer is None:
      return self._mlp(x), cache
    if self.post_norm:
      y, cache = self.mixer.decode_step(x, cache)
      return self._mlp(self._add(x, self.mixer_alpha, self.mixer_norm(y), self.mixer_scale)), cache
    h = self.mixer_norm(x)
    if self.pre_conv is None:
      y, cache = self.mixer.decode_step(h, cache)
      return self._mlp(self._mixed(x, h, y)), cache
    h, conv = self.pre_conv.step(h, cache["conv"])
    y, mixer_cache = self.mixer.decode_step(h, cache["mixer"])
    return self._mlp(self._mixed(x, h, y)), {"mixer": mixer_cache, "conv": conv}
