"""Elementwise-recurrence layers: Mamba (selective scan), Hawk's recurrent block
(RG-LRU) and S4D.

``x [B, T, D] -> [B, T, D]``. ``num_heads`` is accepted for a uniform
constructor; Mamba and S4D are per channel and ignore it, Hawk uses it for its
block-diagonal gate projections.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from linear_attention.nn import context_parallel as cp
from linear_attention.nn import mixer, modules
from linear_attention.ops import rglru as rglru_ops
from linear_attention.ops import ssm as ssm_ops

Array = jax.Array


def _rms(x: Array, eps: float) -> Array:
  """``x / sqrt(mean(x^2) + eps)`` over the last axis, in float32, returned in ``x``'s dtype."""
  xf = x.astype(jnp.float32)
  return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)).astype(x.dtype)


class Mamba(mixer.Mixer):
  """Mamba-1 block (Gu & Dao 2023).

  ``x, z = W_in u``; ``x = silu(conv1d(x))``; ``dt, B, C = W_x x`` (``dt`` of
  rank ``dt_rank`` lifted by ``W_dt``); ``y = selective_scan(x, dt, A, B, C, D,
  z)``; output ``W_out y``. Decoding state: conv window ``[B, W-1, d_inner]``
  and SSM state ``[B, d_inner, N]``, float32.

  Decay initialisation (the per-step decay is ``exp(-A * dt)``; the defaults are
  the reference's):
    a_init_scale: ``A = a_init_scale * (1, 2, ..., N)`` per channel (S4D-Real
      at 1.0). A smaller scale starts with a slower decay (longer memory).
    dt_min, dt_max: ``dt = softplus(dt_bias)`` is drawn log-uniformly in this
      range per channel at init (floored at ``dt_init_floor``).

  Ablations towards Mamba-2 (issue 30; off by default):
    scalar_a: one ``A`` per channel shared by its ``N`` state dimensions (Mamba-2 has one
      per head), drawn uniform in ``a_init_scale * [1, N]``; the parameter is ``[d_inner]``.
    dt_from_input: ``dt``'s rank-``dt_rank`` input is projected from the layer input ``u``
      (before the conv), as Mamba-2 does, instead of from the conv'd ``x``.
    equal_a_init: ``A`` starts as ``scalar_a`` starts (one draw per channel, the same
      values for the same seed) but stays ``[d_inner, N]``, learned per state dimension:
      ``scalar_a``'s initialisation without its sharing.

  Falcon-Mamba: ``bcdt_norm_eps`` (a float) RMS-normalises ``B``, ``C`` and ``dt``'s
  rank-``dt_rank`` input, without weights, with that epsilon; ``None`` (default) does not.
  Jamba: ``bcdt_norm_weights=True`` gives those three norms learned weights (``dt_norm``,
  ``b_norm``, ``c_norm``).
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int = 1, *, d_state: int = 16, expand: int = 2,
               conv_width: int = 4, dt_rank: int | None = None, dt_min: float = 1e-3,
               dt_max: float = 1e-1, dt_init_floor: float = 1e-4, a_init_scale: float = 1.0,
               scalar_a: bool = False, dt_from_input: bool = False, equal_a_init: bool = False,
               chunk_size: int = 64, bcdt_norm_eps: float | None = None,
               bcdt_norm_weights: bool = False, rngs: nnx.Rngs, dtype=None,
               param_dtype=jnp.float32):
    del num_heads
    if bcdt_norm_eps is not None:
      modules.check_decay_init(bcdt_norm_eps=bcdt_norm_eps)
    if bcdt_norm_weights and bcdt_norm_eps is None:
      raise ValueError("bcdt_norm_weights=True needs the norms: set bcdt_norm_eps (a float > 0), "
                       "got bcdt_norm_eps=None.")
    self.bcdt_norm_eps = bcdt_norm_eps
    if scalar_a and equal_a_init:
      raise ValueError("equal_a_init needs scalar_a=False (scalar_a's A is one value per "
                       f"channel already), got scalar_a={scalar_a}, equal_a_init={equal_a_init}.")
    modules.check_decay_init(dt_min=dt_min, dt_max=dt_max, dt_init_floor=dt_init_floor,
                             a_init_scale=a_init_scale)
    d_inner = expand * d_model
    dt_rank = math.ceil(d_model / 16) if dt_rank is None else dt_rank
    self.d_inner, self.d_state, self.dt_rank, self.chunk_size = d_inner, d_state, dt_rank, chunk_size
    self.dt_from_input = dt_from_input
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.in_proj = modules.dense(d_model, 2 * d_inner, **kw)
    self.conv = modules.ShortConv(d_inner, conv_width, rngs=rngs, param_dtype=param_dtype)
    self.x_proj = modules.dense(d_inner, (0 if dt_from_input else dt_rank) + 2 * d_state, **kw)
    self.u_proj = modules.dense(d_model, dt_rank, **kw) if dt_from_input else None
    # dt_proj's weight scaled as in Mamba (std dt_rank^-0.5); its bias is dt_bias.
    self.dt_proj = modules.dense(dt_rank, d_inner, kernel_init=nnx.initializers.uniform(
        2 * dt_rank**-0.5), **kw)
    self.dt_bias = modules.param(
        modules.dt_bias_init(rngs.params(), (d_inner,), dt_min, dt_max, dt_init_floor), param_dtype)
    if scalar_a or equal_a_init:
      a = a_init_scale * jax.random.uniform(rngs.params(), (d_inner,), minval=1.0,
                                            maxval=float(d_state))
      if equal_a_init:
        a = jnp.broadcast_to(a[:, None], (d_inner, d_state))
    else:
      a = jnp.broadcast_to(a_init_scale * jnp.arange(1, d_state + 1, dtype=jnp.float32),
                           (d_inner, d_state))
    self.A_log = modules.param(jnp.log(a), param_dtype)
    self.D = modules.param(jnp.ones((d_inner,)), param_dtype)
    self.out_proj = modules.dense(d_inner, d_model, **kw)
    ones = lambda n: modules.param(jnp.ones((n,)), param_dtype) if bcdt_norm_weights else None
    self.dt_norm, self.b_norm, self.c_norm = ones(dt_rank), ones(d_state), ones(d_state)

  def _ssm_inputs(self, x, u):
    """``dt, B, C`` from the conv'd ``x`` (``dt`` from the layer input ``u`` if asked)."""
    dbc = self.x_proj(x)
    r, n = (0 if self.dt_from_input else self.dt_rank), self.d_state
    dt_in = self.u_proj(u) if self.dt_from_input else dbc[..., :r]
    b, c = dbc[..., r:r + n], dbc[..., r + n:]
    if self.bcdt_norm_eps is not None:
      dt_in, b, c = (_rms(t, self.bcdt_norm_eps) for t in (dt_in, b, c))
      if self.dt_norm is not None:
        dt_in, b, c = (t * w[...].astype(t.dtype) for t, w in
                       ((dt_in, self.dt_norm), (b, self.b_norm), (c, self.c_norm)))
    return self.dt_proj(dt_in), b, c

  def _params(self):
    f = jnp.float32
    a = -jnp.exp(self.A_log[...].astype(f))
    if a.ndim == 1:  # scalar_a: one A per channel for all its state dimensions
      a = jnp.broadcast_to(a[:, None], (self.d_inner, self.d_state))
    return a, self.D[...].astype(f), self.dt_bias[...].astype(f)

  def __call__(self, u: Array, segment_ids: Array | None = None) -> Array:
    """``u [B, T, D]`` -> ``[B, T, D]``."""
    xz = self.in_proj(u)
    x, z = xz[..., :self.d_inner], xz[..., self.d_inner:]
    x = self.conv(x, segment_ids)
    dt, b, c = self._ssm_inputs(x, u)
    a, d, dt_bias = self._params()
    y = ssm_ops.selective_scan(x, dt, a, b, c, d, z, dt_bias=dt_bias, dt_softplus=True,
                               chunk_size=self.chunk_size, segment_ids=segment_ids,
                               context=cp.context())
    return self.out_proj(y)

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"conv": [B, W-1, d_inner], "state": [B, d_inner, N]}``, float32."""
    return {"conv": self.conv.init_state(batch),
            "state": jnp.zeros((batch, self.d_inner, self.d_state), jnp.float32)}

  def decode_step(self, u: Array, cache: dict) -> tuple[Array, dict]:
    """``u [B, D]`` -> ``(y [B, D], cache)``."""
    xz = self.in_proj(u)
    x, z = xz[..., :self.d_inner], xz[..., self.d_inner:]
    x, conv_state = self.conv.step(x, cache["conv"])
    dt, b, c = self._ssm_inputs(x, u)
    a, d, dt_bias = self._params()
    y, state = ssm_ops.selective_scan_step(cache["state"], x, dt, a, b, c, d, z,
                                           dt_bias=dt_bias, dt_softplus=True)
    return self.out_proj(y), {"conv": conv_state, "state": state}


class BlockDiagonalLinear(nnx.Module):
  """``[..., H * W] -> [..., H * W]`` with one ``[W, W]`` matrix (and bias) per head."""

  def __init__(self, width: int, num_heads: int, *, rngs: nnx.Rngs, param_dtype=jnp.float32):
    mixer.check_divisible("width", width, "num_heads", num_heads)
    self.num_heads = num_heads
    w = width // num_heads
    init = nnx.initializers.variance_scaling(1.0, "fan_in", "normal", in_axis=1, out_axis=2)
    self.w = nnx.Param(init(rngs.params(), (num_heads, w, w), jnp.float32).astype(param_dtype))
    self.b = nnx.Param(jnp.zeros((num_heads, w), param_dtype))

  def __call__(self, x: Array) -> Array:
    """Applies the per-head matrices; returns the dtype of ``x``."""
    xh = modules.split_heads(x, self.num_heads)
    y = jnp.einsum("...hi,hij->...hj", xh, self.w[...].astype(x.dtype)) + self.b[...].astype(x.dtype)
    return modules.merge_heads(y)


class HawkBlock(mixer.Mixer):
  """Hawk / Griffin recurrent block (De et al. 2024).

  Two branches of width ``lru_width``: ``gelu(W_y x)`` and ``W_x x`` through a
  short conv and the RG-LRU (gates from block-diagonal projections over
  ``num_heads`` blocks); their product goes through ``W_out``. Decoding state:
  the conv window ``[B, W-1, lru_width]``, the RG-LRU state ``[B, lru_width]``
  float32, and the position (a document's first token skips the normaliser).

  Decay initialisation (the per-step decay is ``a^(r_t)``, ``r_t`` the
  recurrence gate, about 0.5 at init; the defaults are the reference's):
    min_rad, max_rad: ``Lambda`` is drawn so that ``a = sigmoid(Lambda)^c``
      lies in ``[min_rad, max_rad]`` (``a^2`` uniform there, as recurrentgemma
      draws it). Values closer to 1 start with a slower decay.
    c: the gate's temperature (8 in Griffin).
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, lru_width: int | None = None,
               conv_width: int = 4, c: float = 8.0, min_rad: float = 0.9, max_rad: float = 0.999,
               chunk_size: int = 64, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    modules.check_decay_init(c=c, min_rad=min_rad, max_rad=max_rad)
    if not min_rad <= max_rad < 1:
      raise ValueError(f"Hawk needs 0 < min_rad <= max_rad < 1, got min_rad={min_rad!r}, "
                       f"max_rad={max_rad!r}.")
    width = d_model if lru_width is None else lru_width
    self.width, self.c, self.chunk_size = width, c, chunk_size
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.y_proj = modules.dense(d_model, width, use_bias=True, **kw)
    self.x_proj = modules.dense(d_model, width, use_bias=True, **kw)
    self.conv = modules.ShortConv(width, conv_width, activation=None, rngs=rngs,
                               param_dtype=param_dtype)
    self.gate_r = BlockDiagonalLinear(width, num_heads, rngs=rngs, param_dtype=param_dtype)
    self.gate_i = BlockDiagonalLinear(width, num_heads, rngs=rngs, param_dtype=param_dtype)
    a2 = jax.random.uniform(rngs.params(), (width,), minval=min_rad**2, maxval=max_rad**2)
    # a = sigmoid(L)^c  <=>  softplus(-L) = -log(a) / c  <=>  L = -log(expm1(-log(a) / c)).
    self.log_lambda = modules.param(-jnp.log(jnp.expm1(-0.5 * jnp.log(a2) / c)), param_dtype)
    self.out_proj = modules.dense(width, d_model, use_bias=True, **kw)

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``."""
    y = jax.nn.gelu(self.y_proj(x))
    h = self.conv(self.x_proj(x), segment_ids)
    h = rglru_ops.rg_lru(h, self.gate_r(h), self.gate_i(h), self.log_lambda[...], c=self.c,
                         chunk_size=self.chunk_size, segment_ids=segment_ids,
                         context=cp.context())
    return self.out_proj(h * y)

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"conv": [B, W-1, width], "state": [B, width]}`` float32 and ``"pos"``."""
    return {"conv": self.conv.init_state(batch),
            "state": jnp.zeros((batch, self.width), jnp.float32),
            "pos": jnp.zeros((), jnp.int32)}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    y = jax.nn.gelu(self.y_proj(x))
    h, conv_state = self.conv.step(self.x_proj(x), cache["conv"])
    args = (h, self.gate_r(h), self.gate_i(h), self.log_lambda[...])
    # Both branches are cheap; the first token of a document has no normaliser.
    h_first, s_first = rglru_ops.rg_lru_step(None, *args, c=self.c)
    h_next, s_next = rglru_ops.rg_lru_step(cache["state"], *args, c=self.c)
    first = cache["pos"] == 0
    h = jnp.where(first, h_first, h_next)
    state = jnp.where(first, s_first, s_next)
    return self.out_proj(h * y), {"conv": conv_state, "state": state, "pos": cache["pos"] + 1}


class S4DLayer(mixer.Mixer):
  """S4D (Gu et al. 2022) as a sequence mixer: one diagonal complex SSM per channel.

  ``y = GLU(W_out gelu(s4d(x)))``. ``A = -exp(log_neg_A_real) + i A_imag`` from
  ``init`` (S4D-Lin by default), ``B = 1``, ``C`` complex normal, ``log_dt``
  log-uniform in ``[dt_min, dt_max]``, skip ``D``. Training uses the FFT
  convolution; decoding the recurrence with a complex64 state ``[B, D, N]``.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int = 1, *, d_state: int = 32, init: str = "lin",
               dt_min: float = 1e-3, dt_max: float = 1e-1, form: str = "fft",
               rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    del num_heads
    self.d_model, self.d_state, self.form = d_model, d_state, form
    a_re, a_im = ssm_ops.s4d_init(init, d_state, d_model)
    self.log_neg_A_real = modules.param(jnp.log(-a_re), param_dtype)
    self.A_imag = modules.param(a_im, param_dtype)
    c = jax.random.normal(rngs.params(), (2, d_model, d_state)) * (0.5**0.5)
    self.C = modules.param(c, param_dtype)  # real and imaginary parts
    self.log_dt = modules.param(ssm_ops.s4d_log_dt_init(rngs.params(), d_model, dt_min, dt_max),
                             param_dtype)
    self.D = modules.param(jax.random.normal(rngs.params(), (d_model,)), param_dtype)
    self.out_proj = modules.dense(d_model, 2 * d_model, use_bias=True, rngs=rngs, dtype=dtype,
                               param_dtype=param_dtype)

  def _params(self):
    f = jnp.float32
    a_re = -jnp.exp(self.log_neg_A_real[...].astype(f))
    c = self.C[...].astype(f)
    b = jnp.ones((self.d_model, self.d_state), jnp.complex64)
    return (a_re, self.A_imag[...].astype(f), b, jax.lax.complex(c[0], c[1]),
            self.log_dt[...].astype(f), self.D[...].astype(f))

  def _out(self, y):
    return jax.nn.glu(self.out_proj(jax.nn.gelu(y)), axis=-1)

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``."""
    y = ssm_ops.s4d(x, *self._params(), form=self.form, segment_ids=segment_ids,
                    context=cp.context())
    return self._out(y)

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"state": [B, D, N] complex64}``."""
    return {"state": jnp.zeros((batch, self.d_model, self.d_state), jnp.complex64)}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    y, state = ssm_ops.s4d_step(cache["state"], x, *self._params())
    return self._out(y), {"state": state}


class GatedShortConv(mixer.Mixer):
  """LFM2's short-convolution block (Liquid AI 2025; transformers' ``Lfm2ShortConv``).

  ``b, c, h = W_in x`` (three ``[B, T, D]`` branches), then
  ``W_out(c * conv(b * h))`` with a depthwise causal convolution of width ``conv_width``
  and no activation: an input-gated, output-gated local mix. ``use_bias`` puts biases on
  both projections and the convolution (LFM2's ``conv_bias``). Decoding cache: the
  convolution window ``[B, W-1, D]`` float32.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int = 1, *, conv_width: int = 3,
               use_bias: bool = False, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    del num_heads
    mixer.check_positive("conv_width", conv_width)
    self.d_model = d_model
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype, use_bias=use_bias)
    self.in_proj = modules.dense(d_model, 3 * d_model, **kw)
    self.conv = modules.ShortConv(d_model, conv_width, activation=None, use_bias=use_bias,
                                  rngs=rngs, param_dtype=param_dtype)
    self.out_proj = modules.dense(d_model, d_model, **kw)

  def _branches(self, x):
    bcx = self.in_proj(x)
    d = self.d_model
    return bcx[..., :d], bcx[..., d:2 * d], bcx[..., 2 * d:]

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``."""
    b, c, h = self._branches(x)
    return self.out_proj(c * self.conv(b * h, segment_ids))

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"conv": [B, W-1, D]}`` float32."""
    return {"conv": self.conv.init_state(batch)}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    b, c, h = self._branches(x)
    y, conv = self.conv.step(b * h, cache["conv"])
    return self.out_proj(c * y), {"conv": conv}
