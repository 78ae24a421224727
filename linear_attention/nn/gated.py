"""Gated and decayed linear-attention layers: GLA, RetNet, HGRN2, RWKV-6, Mamba-2 and
log-linear Mamba-2.

Each owns its projections and gates and calls one op of
:mod:`linear_attention.ops.gated` (its ``*_step`` twin when decoding);
:class:`LogLinearMamba2` is :class:`Mamba2` with Fenwick levels (one more projection, for
the level weights) and :func:`linear_attention.ops.loglinear_variants.loglinear_ssd` in place of
``ssd``.
Shapes: ``x [B, T, D] -> [B, T, D]``; decoding states ``[B, H, K, V]`` float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from linear_attention.nn import context_parallel as cp
from linear_attention.nn import mixer, modules
from linear_attention.ops import decay as decay_ops
from linear_attention.ops import gated as gated_ops
from linear_attention.ops import loglinear as loglinear_ops
from linear_attention.ops import loglinear_variants

Array = jax.Array


def _f32(x: Array) -> Array:
  return x.astype(jnp.float32)


class GatedLinearAttention(mixer.Mixer):
  """GLA (Yang et al. 2023): linear attention with a data-dependent per-channel forget gate.

  ``log_g = logsigmoid(W2 W1 x + b) / gate_logit_normalizer`` (a low-rank gate;
  the normaliser 16 keeps early training close to no decay), then
  ``o = W_o(RMSNorm(gla(q, k, v, log_g)) * swish(W_g x))``. Key width
  ``expand_k * D``, value width ``expand_v * D``, split over ``num_heads``.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, expand_k: float = 0.5,
               expand_v: float = 1.0, gate_low_rank: int = 16,
               gate_logit_normalizer: float = 16.0, chunk_size: int = 64, norm_eps: float = 1e-5,
               rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    key_dim, value_dim = int(d_model * expand_k), int(d_model * expand_v)
    mixer.check_divisible("key_dim (expand_k * d_model)", key_dim, "num_heads", num_heads)
    mixer.check_divisible("value_dim (expand_v * d_model)", value_dim, "num_heads", num_heads)
    self.num_heads, self.chunk_size = num_heads, chunk_size
    self.key_dim, self.value_dim = key_dim, value_dim
    self.gate_logit_normalizer = gate_logit_normalizer
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.q_proj = modules.dense(d_model, key_dim, **kw)
    self.k_proj = modules.dense(d_model, key_dim, **kw)
    self.v_proj = modules.dense(d_model, value_dim, **kw)
    self.g_proj = modules.dense(d_model, value_dim, **kw)
    self.gk_down = modules.dense(d_model, gate_low_rank, **kw)
    self.gk_up = modules.dense(gate_low_rank, key_dim, use_bias=True, **kw)
    self.o_norm = modules.HeadNorm(value_dim // num_heads, eps=norm_eps, rngs=rngs,
                                param_dtype=param_dtype)
    self.o_proj = modules.dense(value_dim, d_model, **kw)

  def _inputs(self, x):
    h = self.num_heads
    q, k, v = (modules.split_heads(p(x), h) for p in (self.q_proj, self.k_proj, self.v_proj))
    log_g = jax.nn.log_sigmoid(_f32(self.gk_up(self.gk_down(x)))) / self.gate_logit_normalizer
    return q, k, v, modules.split_heads(log_g, h)

  def _out(self, o, x):
    g = modules.split_heads(self.g_proj(x), self.num_heads)
    o = self.o_norm(o.astype(x.dtype)) * jax.nn.silu(g)
    return self.o_proj(modules.merge_heads(o))

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``."""
    q, k, v, log_g = self._inputs(x)
    o = gated_ops.gla(q, k, v, log_g, chunk_size=self.chunk_size, segment_ids=segment_ids,
                      context=cp.context())
    return self._out(o, x)

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"state": [B, H, K/H, V/H] float32}``."""
    h = self.num_heads
    return {"state": jnp.zeros((batch, h, self.key_dim // h, self.value_dim // h), jnp.float32)}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    q, k, v, log_g = self._inputs(x)
    o, state = gated_ops.gla_step(cache["state"], q, k, v, log_g)
    return self._out(o, x), {"state": state}


class MultiScaleRetention(mixer.Mixer):
  """RetNet multi-scale retention (Sun et al. 2023).

  A fixed decay ``gamma_h = 1 - 2^(-5-h)`` per head, rotary positions on
  ``q, k`` (the rotation of xPos), a group norm per head and a swish gate:
  ``o = W_o(GroupNorm(retention(q, k, v)) * swish(W_g x))``. Value width
  ``expand_v * D``.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, expand_v: float = 2.0,
               use_rope: bool = True, chunk_size: int = 64, norm_eps: float = 1e-5,
               rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    value_dim = int(d_model * expand_v)
    mixer.check_divisible("d_model", d_model, "num_heads", num_heads)
    mixer.check_divisible("value_dim (expand_v * d_model)", value_dim, "num_heads", num_heads)
    self.num_heads, self.chunk_size, self.use_rope = num_heads, chunk_size, use_rope
    self.key_dim, self.value_dim = d_model, value_dim
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.q_proj = modules.dense(d_model, d_model, **kw)
    self.k_proj = modules.dense(d_model, d_model, **kw)
    self.v_proj = modules.dense(d_model, value_dim, **kw)
    self.g_proj = modules.dense(d_model, value_dim, **kw)
    self.o_norm = modules.HeadNorm(value_dim // num_heads, eps=norm_eps, center=True, rngs=rngs,
                                param_dtype=param_dtype)
    self.o_proj = modules.dense(value_dim, d_model, **kw)

  def _inputs(self, x, positions):
    h = self.num_heads
    q, k, v = (modules.split_heads(p(x), h) for p in (self.q_proj, self.k_proj, self.v_proj))
    if self.use_rope:
      q, k = modules.rope(q, positions), modules.rope(k, positions)
    return q, k, v

  def _out(self, o, x):
    g = modules.split_heads(self.g_proj(x), self.num_heads)
    return self.o_proj(modules.merge_heads(self.o_norm(o.astype(x.dtype)) * jax.nn.silu(g)))

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``."""
    b, t, _ = x.shape
    q, k, v = self._inputs(x, modules.positions_of(b, t, segment_ids))
    o = gated_ops.retention(q, k, v, chunk_size=self.chunk_size, segment_ids=segment_ids,
                            context=cp.context())
    return self._out(o, x)

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"state": [B, H, K, V] float32, "pos": int32}`` (the position drives the rotation)."""
    h = self.num_heads
    return {"state": jnp.zeros((batch, h, self.key_dim // h, self.value_dim // h), jnp.float32),
            "pos": jnp.zeros((), jnp.int32)}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    pos = jnp.full((x.shape[0], 1), cache["pos"], jnp.int32)
    q, k, v = (a[:, 0] for a in self._inputs(x[:, None], pos))
    o, state = gated_ops.retention_step(cache["state"], q, k, v)
    return self._out(o, x), {"state": state, "pos": cache["pos"] + 1}


def lightning_slopes(num_heads: int, slope_scale: float = 1.0) -> np.ndarray:
  """Lightning attention's decay rates ``slope_scale * 2 ** (-8 (h + 1) / H)`` (ALiBi's
  slopes, MiniMax-01's per-layer factor): ``[H]`` float32, computed in float32 as
  transformers' MiniMax does, so that loaded checkpoints decay by the same numbers."""
  base = np.float32(1.0 / (2.0 ** (8.0 / num_heads)))
  return base ** np.arange(1, num_heads + 1, dtype=np.float32) * np.float32(slope_scale)


class LightningAttention(mixer.Mixer):
  """Lightning attention (MiniMax-01's linear layers; TransNormerLLM's decayed linear attention).

  ``q, k, v = silu(W_qkv x)`` (each head's q, k and v side by side in the fused
  projection), a fixed decay per head ``S_t = exp(-s_h) S_{t-1} + k_t v_t^T`` read with
  scale 1 (``o_t = S_t^T q_t``), then ``W_o(RMSNorm(o) * sigmoid(W_g x))`` with one RMSNorm
  over all heads' outputs together. ``s_h``: :func:`lightning_slopes`. It is
  :func:`~linear_attention.ops.retention` with ``gamma = exp(-s)``, taken in log space so
  that slopes below float32's resolution around 1 still decay.

  Shapes: ``x [B, T, D] -> [B, T, D]``; ``head_dim`` (default ``D / num_heads``) is each
  head's key and value width.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, head_dim: int | None = None,
               slope_scale: float = 1.0, chunk_size: int = 64, norm_eps: float = 1e-6,
               rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    if head_dim is None:
      mixer.check_divisible("d_model", d_model, "num_heads", num_heads)
      head_dim = d_model // num_heads
    self.num_heads, self.head_dim, self.chunk_size = num_heads, head_dim, chunk_size
    self.slope_scale = float(slope_scale)
    width = num_heads * head_dim
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.qkv_proj = modules.dense(d_model, 3 * width, **kw)
    self.g_proj = modules.dense(d_model, width, **kw)
    self.o_norm = nnx.RMSNorm(width, epsilon=norm_eps, dtype=dtype, param_dtype=param_dtype,
                              rngs=rngs)
    self.o_proj = modules.dense(width, d_model, **kw)

  def _log_decay(self, lead: tuple[int, ...]) -> Array:
    return jnp.broadcast_to(-jnp.asarray(lightning_slopes(self.num_heads, self.slope_scale)),
                            lead + (self.num_heads,))

  def _inputs(self, x):
    qkv = jax.nn.silu(self.qkv_proj(x))
    qkv = qkv.reshape(qkv.shape[:-1] + (self.num_heads, 3 * self.head_dim))
    return jnp.split(qkv, 3, axis=-1)

  def _out(self, o, x):
    o = self.o_norm(modules.merge_heads(o.astype(x.dtype)))
    return self.o_proj(o * jax.nn.sigmoid(self.g_proj(x)))

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``."""
    q, k, v = self._inputs(x)
    o = decay_ops.decay_linear_attention(
        q, k, v, self._log_decay(x.shape[:2]), scale=1.0, chunk_size=self.chunk_size,
        segment_ids=segment_ids, context=cp.context())
    return self._out(o, x)

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"state": [B, H, head_dim, head_dim] float32}``."""
    d = self.head_dim
    return {"state": jnp.zeros((batch, self.num_heads, d, d), jnp.float32)}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    q, k, v = self._inputs(x)
    o, state = decay_ops.decay_linear_attention_step(
        cache["state"], q, k, v, self._log_decay(x.shape[:1]), scale=1.0)
    return self._out(o, x), {"state": state}


class HGRN2(mixer.Mixer):
  """HGRN2 (Qin et al. 2024): gated linear RNN with state expansion; the forget gate is the key.

  ``f = lower_bound + (1 - lower_bound) sigmoid(W_f x)``, state
  ``S_t = diag(f_t) S_{t-1} + (1 - f_t) v_t^T``, read with ``q = swish(W_q x)``,
  then an RMSNorm per head and the output projection. Key and value width
  ``D / num_heads`` per head.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, lower_bound: float = 0.0,
               chunk_size: int = 64, norm_eps: float = 1e-5, rngs: nnx.Rngs, dtype=None,
               param_dtype=jnp.float32):
    mixer.check_divisible("d_model", d_model, "num_heads", num_heads)
    if not 0.0 <= lower_bound < 1.0:
      raise ValueError(f"lower_bound must lie in [0, 1), got {lower_bound}.")
    self.num_heads, self.head_dim = num_heads, d_model // num_heads
    self.lower_bound, self.chunk_size = lower_bound, chunk_size
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.q_proj = modules.dense(d_model, d_model, **kw)
    self.f_proj = modules.dense(d_model, d_model, **kw)
    self.i_proj = modules.dense(d_model, d_model, **kw)
    self.o_norm = modules.HeadNorm(self.head_dim, eps=norm_eps, rngs=rngs, param_dtype=param_dtype)
    self.o_proj = modules.dense(d_model, d_model, **kw)

  def _inputs(self, x):
    h = self.num_heads
    q = modules.split_heads(jax.nn.silu(self.q_proj(x)), h)
    f = _f32(self.f_proj(x))
    if self.lower_bound == 0.0:
      log_f = jax.nn.log_sigmoid(f)
    else:
      lb = self.lower_bound
      log_f = jnp.log(lb + (1.0 - lb) * jax.nn.sigmoid(f))
    v = modules.split_heads(self.i_proj(x), h)
    return q, modules.split_heads(log_f, h), v

  def _out(self, o, x):
    return self.o_proj(modules.merge_heads(self.o_norm(o.astype(x.dtype))))

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``."""
    q, log_f, v = self._inputs(x)
    o = gated_ops.hgrn2(q, log_f, v, chunk_size=self.chunk_size, segment_ids=segment_ids,
                        context=cp.context())
    return self._out(o, x)

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"state": [B, H, Dh, Dh] float32}``."""
    d = self.head_dim
    return {"state": jnp.zeros((batch, self.num_heads, d, d), jnp.float32)}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    q, log_f, v = self._inputs(x)
    o, state = gated_ops.hgrn2_step(cache["state"], q, log_f, v)
    return self._out(o, x), {"state": state}


class RWKV6TimeMix(mixer.Mixer):
  """RWKV-6 "Finch" time mixing (Peng et al. 2024).

  Data-dependent token shift: ``x`` and the previous token ``x_prev`` are mixed
  with five low-rank, input-dependent interpolations (for ``w, k, v, r, g``);
  the decay ``log_w = -exp(w0 + tanh(x_w A) B)`` is per channel and token; the
  current token enters through the bonus ``u``. Output:
  ``W_o(GroupNorm(rwkv6(r, k, v, log_w, u)) * swish(W_g x_g))``.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, mix_low_rank: int = 32,
               decay_low_rank: int = 64, chunk_size: int = 64, norm_eps: float = 64e-5,
               rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    mixer.check_divisible("d_model", d_model, "num_heads", num_heads)
    self.num_heads, self.head_dim, self.chunk_size = num_heads, d_model // num_heads, chunk_size
    self.d_model = d_model
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    ratio = jnp.arange(d_model, dtype=jnp.float32) / d_model
    # Interpolation weights start spread over [0, 1) across channels, as in RWKV.
    self.maa_x = modules.param(1.0 - ratio, param_dtype)
    self.maa_wkvrg = modules.param(jnp.stack([1.0 - ratio ** p for p in (0.5, 1.0, 0.7, 0.5, 0.3)]),
                                param_dtype)  # [5, D]
    small = lambda shape: (1e-2 * jax.random.normal(rngs.params(), shape)).astype(param_dtype)
    self.maa_w1 = nnx.Param(small((d_model, 5 * mix_low_rank)))
    self.maa_w2 = nnx.Param(small((5, mix_low_rank, d_model)))
    # Per-channel base decay from fast (-6 -> w ~ 1) to slow; log_w = -exp(w).
    self.decay_base = modules.param(-6.0 + 5.0 * ratio ** 0.7, param_dtype)
    self.decay_w1 = nnx.Param(small((d_model, decay_low_rank)))
    self.decay_w2 = nnx.Param(small((decay_low_rank, d_model)))
    self.bonus = modules.param(jnp.full((num_heads, self.head_dim), 0.5), param_dtype)
    self.r_proj = modules.dense(d_model, d_model, **kw)
    self.k_proj = modules.dense(d_model, d_model, **kw)
    self.v_proj = modules.dense(d_model, d_model, **kw)
    self.g_proj = modules.dense(d_model, d_model, **kw)
    self.o_norm = modules.HeadNorm(self.head_dim, eps=norm_eps, center=True, rngs=rngs,
                                param_dtype=param_dtype)
    self.o_proj = modules.dense(d_model, d_model, **kw)

  def _inputs(self, x, x_prev):
    dt = x.dtype
    xx = x_prev - x
    xxx = x + xx * self.maa_x[...].astype(dt)
    lr = jnp.tanh(xxx @ self.maa_w1[...].astype(dt))
    lr = lr.reshape(lr.shape[:-1] + (5, -1))  # [..., 5, R]
    mix = jnp.einsum("...fr,frd->...fd", lr, self.maa_w2[...].astype(dt))
    mix = mix + self.maa_wkvrg[...].astype(dt)
    xw, xk, xv, xr, xg = (x + xx * mix[..., i, :] for i in range(5))
    h = self.num_heads
    r, k, v = (modules.split_heads(p(z), h) for p, z in
               ((self.r_proj, xr), (self.k_proj, xk), (self.v_proj, xv)))
    w = _f32(self.decay_base[...]) + _f32(
        jnp.tanh(xw @ self.decay_w1[...].astype(dt)) @ self.decay_w2[...].astype(dt))
    log_w = modules.split_heads(-jnp.exp(w), h)
    g = jax.nn.silu(self.g_proj(xg))
    return r, k, v, log_w, g

  def _out(self, o, g, x):
    o = self.o_norm(o.astype(x.dtype))
    return self.o_proj(modules.merge_heads(o) * g)

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``."""
    r, k, v, log_w, g = self._inputs(x, modules.token_shift(x, segment_ids))
    o = gated_ops.rwkv6(r, k, v, log_w, self.bonus[...].astype(jnp.float32),
                        chunk_size=self.chunk_size, segment_ids=segment_ids,
                        context=cp.context())
    return self._out(o, g, x)

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"state": [B, H, Dh, Dh] float32, "shift": [B, D] float32}`` (the previous token)."""
    d = self.head_dim
    return {"state": jnp.zeros((batch, self.num_heads, d, d), jnp.float32),
            "shift": jnp.zeros((batch, self.d_model), jnp.float32)}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    r, k, v, log_w, g = self._inputs(x, cache["shift"].astype(x.dtype))
    o, state = gated_ops.rwkv6_step(cache["state"], r, k, v, log_w,
                                    self.bonus[...].astype(jnp.float32))
    return self._out(o, g, x), {"state": state, "shift": x.astype(jnp.float32)}


class Mamba2(mixer.Mixer):
  """Mamba-2 block (Dao & Gu 2024): in-projection, short conv, SSD, gated RMSNorm, out-projection.

  ``d_inner = expand * D`` split into ``num_heads`` heads of ``d_inner / num_heads``;
  ``B, C`` have ``ngroups`` groups of ``d_state``. Decoding state: the conv
  window ``[B, W-1, C]`` and the SSD state ``[B, H, N, P]``, both float32.

  Decay initialisation (the per-step decay is ``exp(-A * dt)`` per head; the
  defaults are the reference's):
    a_init_range: ``A = exp(A_log)`` uniform in this range per head. A smaller
      range starts with a slower decay (longer memory).
    dt_min, dt_max: ``dt = softplus(dt_bias)`` log-uniform in this range per
      head at init (floored at ``dt_init_floor``).
  ``norm=False`` drops the gated RMSNorm (the output is ``W_out(y * silu(z))``, as in
  Mamba-1); ``bc_activation=False`` applies the conv's SiLU to ``x`` only, leaving ``B, C``
  linear (signed) as Mamba-1's projections are; both for ablations.
  ``dt_from_conv=True`` projects ``dt`` from the conv'd, SiLU'd ``x`` (``W_dt silu(conv(x))``,
  ``[d_inner -> H]``, full rank) as Mamba-1 does, instead of from the layer input;
  ``bc_from_conv=True`` likewise projects ``B, C`` from it (``W_bc silu(conv(x))``; the conv
  then runs over ``x`` only), Mamba-1's layout; both for ablations (issue 30).

  Options of the released checkpoints (transformers' ``Mamba2``, Nemotron-H, Bamba):
    norm_per_channel: the gated RMSNorm has one weight per channel (``[d_inner]``, normalised
      per group of ``d_inner / ngroups``) instead of one shared by the groups.
    dt_limit: ``(low, high)``: ``dt = softplus(dt + dt_bias)`` clamped to it (transformers'
      ``time_step_limit``), in the forward pass and in decoding alike; ``None``: no clamp.
    d_inner: the inner width when it is not ``expand * d_model`` (``num_heads * head_dim``).
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, d_state: int = 16, expand: int = 2,
               ngroups: int = 1, conv_width: int = 4, dt_min: float = 1e-3,
               dt_max: float = 1e-1, dt_init_floor: float = 1e-4,
               a_init_range: tuple[float, float] = (1.0, 16.0), chunk_size: int = 64,
               norm_eps: float = 1e-5, norm: bool = True, bc_activation: bool = True,
               dt_from_conv: bool = False, bc_from_conv: bool = False,
               norm_per_channel: bool = False, dt_limit: tuple[float, float] | None = None,
               d_inner: int | None = None, rngs: nnx.Rngs, dtype=None,
               param_dtype=jnp.float32):
    modules.check_decay_init(dt_min=dt_min, dt_max=dt_max, dt_init_floor=dt_init_floor,
                             a_init_range=a_init_range)
    if dt_limit is not None:
      ok = isinstance(dt_limit, (tuple, list)) and len(dt_limit) == 2
      if not (ok and 0 <= float(dt_limit[0]) < float(dt_limit[1])):
        raise ValueError(f"dt_limit must be None or (low, high) with 0 <= low < high, got "
                         f"{dt_limit!r}.")
      dt_limit = (float(dt_limit[0]), float(dt_limit[1]))
    self.dt_limit = dt_limit
    if d_inner is None:
      d_inner = expand * d_model
    else:
      mixer.check_positive("d_inner", d_inner)
    mixer.check_divisible("d_inner (expand * d_model)", d_inner, "num_heads", num_heads)
    mixer.check_divisible("num_heads", num_heads, "ngroups", ngroups)
    self.num_heads, self.head_dim, self.d_inner = num_heads, d_inner // num_heads, d_inner
    self.d_state, self.ngroups, self.chunk_size = d_state, ngroups, chunk_size
    self.dt_from_conv, self.bc_from_conv = dt_from_conv, bc_from_conv
    gn2 = 2 * ngroups * d_state
    conv_dim = d_inner + (0 if bc_from_conv else gn2)
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.in_proj = modules.dense(d_model, d_inner + conv_dim + (0 if dt_from_conv else num_heads),
                                 **kw)
    # Mamba-1's x_proj: dt and/or B, C read from the conv'd x (ablations only).
    n_x = (num_heads if dt_from_conv else 0) + (gn2 if bc_from_conv else 0)
    self.x_proj = modules.dense(d_inner, n_x, **kw) if n_x else None
    self.bc_activation = bc_activation
    self.conv = modules.ShortConv(conv_dim, conv_width, activation="silu" if bc_activation else None,
                                  rngs=rngs, param_dtype=param_dtype)
    self.A_log = modules.param(modules.a_log_init(rngs.params(), (num_heads,), a_init_range),
                               param_dtype)
    self.dt_bias = modules.param(modules.dt_bias_init(rngs.params(), (num_heads,), dt_min,
                                                      dt_max, dt_init_floor), param_dtype)
    self.D = modules.param(jnp.ones((num_heads,)), param_dtype)
    self.norm = modules.HeadNorm(d_inner // ngroups, eps=norm_eps, rngs=rngs,
                              param_dtype=param_dtype) if norm else None
    if norm and norm_per_channel:
      # [G, d_inner / G] broadcasts against the grouped [..., G, d_inner / G] it scales.
      self.norm.scale = nnx.Param(jnp.ones((ngroups, d_inner // ngroups), param_dtype))
    self.out_proj = modules.dense(d_inner, d_model, **kw)

  def _split(self, zxbcdt):
    di, gn = self.d_inner, self.ngroups * self.d_state
    z = zxbcdt[..., :di]
    end = 2 * di + (0 if self.bc_from_conv else 2 * gn)
    xbc = zxbcdt[..., di:end]
    dt = None if self.dt_from_conv else zxbcdt[..., end:]
    return z, xbc, dt

  def _ssd_args(self, xbc, dt):
    """The conv'd ``xbc`` (and ``dt`` unless read from it) -> ``x, dt, B, C`` for ``ssd``."""
    di, gn = self.d_inner, self.ngroups * self.d_state
    x = xbc[..., :di] if self.bc_activation else jax.nn.silu(xbc[..., :di])
    bc = xbc[..., di:]
    if self.x_proj is not None:
      proj = self.x_proj(x)
      if self.bc_from_conv:
        bc, proj = proj[..., :2 * gn], proj[..., 2 * gn:]
      if self.dt_from_conv:
        dt = proj
    b = modules.split_heads(bc[..., :gn], self.ngroups)
    c = modules.split_heads(bc[..., gn:], self.ngroups)
    return modules.split_heads(x, self.num_heads), dt.astype(jnp.float32), b, c

  def _params(self):
    return (-jnp.exp(_f32(self.A_log[...])), _f32(self.D[...]), _f32(self.dt_bias[...]))

  def _dt(self, dt, dt_bias):
    """``(dt, dt_bias, dt_softplus)`` for ``ssd``: with ``dt_limit``, the clamped step."""
    if self.dt_limit is None:
      return dt, dt_bias, True
    return jnp.clip(jax.nn.softplus(dt + dt_bias), *self.dt_limit), None, False

  def _out(self, y, z):
    y = modules.merge_heads(y) * jax.nn.silu(z)
    if self.norm is not None:
      y = modules.merge_heads(self.norm(modules.split_heads(y, self.ngroups)))
    return self.out_proj(y)

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``."""
    z, xbc, dt = self._split(self.in_proj(x))
    xs, dt, b, c = self._ssd_args(self.conv(xbc, segment_ids), dt)
    a, d, dt_bias = self._params()
    dt, dt_bias, softplus = self._dt(dt, dt_bias)
    y = gated_ops.ssd(xs, dt, a, b, c, d, dt_bias=dt_bias, dt_softplus=softplus,
                      chunk_size=self.chunk_size, segment_ids=segment_ids, context=cp.context())
    return self._out(y, z)

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"conv": [B, W-1, C], "state": [B, H, N, P]}``, float32."""
    return {"conv": self.conv.init_state(batch),
            "state": jnp.zeros((batch, self.num_heads, self.d_state, self.head_dim),
                               jnp.float32)}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    z, xbc, dt = self._split(self.in_proj(x))
    xbc, conv_state = self.conv.step(xbc, cache["conv"])
    xs, dt, b, c = self._ssd_args(xbc, dt)
    a, d, dt_bias = self._params()
    dt, dt_bias, softplus = self._dt(dt, dt_bias)
    y, state = gated_ops.ssd_step(cache["state"], xs, dt, a, b, c, d,
                                  dt_bias=dt_bias, dt_softplus=softplus)
    return self._out(y, z), {"conv": conv_state, "state": state}


class LogLinearMamba2(Mamba2):
  """Log-linear Mamba-2 (Guo et al. 2025): Mamba-2 whose SSD state is split over
  ``num_levels`` Fenwick levels mixed by data-dependent weights.

  Mamba-2's projections, convolution, ``A``, ``dt`` and ``D`` unchanged (so are its
  decay-init options ``a_init_range, dt_min, dt_max, dt_init_floor``), plus
  ``level_weights = softplus(W_l x + b_l)`` ``[B, T, H, L]`` with ``b_l``
  such that every weight starts at 1: at initialisation the layer computes
  Mamba-2 exactly. Levels from ``num_levels - 1`` up share one weight (the
  paper takes ``num_levels = log2(T) + 1``). Decoding cache: the conv window,
  the levels ``[B, H, L, N, P]`` and the position ``[B]``, float32.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, num_levels: int = 12, d_state: int = 16,
               expand: int = 2, ngroups: int = 1, conv_width: int = 4, dt_min: float = 1e-3,
               dt_max: float = 1e-1, dt_init_floor: float = 1e-4,
               a_init_range: tuple[float, float] = (1.0, 16.0), chunk_size: int = 64,
               norm_eps: float = 1e-5, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    mixer.check_positive("num_levels", num_levels)
    super().__init__(d_model, num_heads, d_state=d_state, expand=expand, ngroups=ngroups,
                     conv_width=conv_width, dt_min=dt_min, dt_max=dt_max,
                     dt_init_floor=dt_init_floor, a_init_range=a_init_range, chunk_size=chunk_size,
                     norm_eps=norm_eps, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.num_levels = num_levels
    self.level_proj = modules.dense(d_model, num_heads * num_levels, use_bias=True, rngs=rngs,
                                 dtype=dtype, param_dtype=param_dtype)
    self.level_proj.bias.set_value(
        jnp.full((num_heads * num_levels,), float(np.log(np.expm1(1.0))), param_dtype))

  def _levels(self, x):
    lam = jax.nn.softplus(self.level_proj(x).astype(jnp.float32))
    return lam.reshape(lam.shape[:-1] + (self.num_heads, self.num_levels))

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``."""
    z, xbc, dt = self._split(self.in_proj(x))
    xs, dt, b, c = self._ssd_args(self.conv(xbc, segment_ids), dt)
    a, d, dt_bias = self._params()
    y = loglinear_variants.loglinear_ssd(xs, dt, a, b, c, self._levels(x), d,
                                    dt_bias=dt_bias, dt_softplus=True,
                                    chunk_size=self.chunk_size, segment_ids=segment_ids,
                                    context=cp.context())
    return self._out(y, z)

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"conv": [B, W-1, C], "state": [B, H, L, N, P], "pos": [B]}``, float32."""
    s, pos = loglinear_ops.init_loglinear_state(batch, self.num_heads, self.num_levels,
                                                self.d_state, self.head_dim)
    return {"conv": self.conv.init_state(batch), "state": s, "pos": pos}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    z, xbc, dt = self._split(self.in_proj(x))
    xbc, conv_state = self.conv.step(xbc, cache["conv"])
    xs, dt, b, c = self._ssd_args(xbc, dt)
    a, d, dt_bias = self._params()
    y, (s, pos) = loglinear_variants.loglinear_ssd_step(
        (cache["state"], cache["pos"]), xs, dt, a, b, c, self._levels(x), d,
        dt_bias=dt_bias, dt_softplus=True)
    return self._out(y, z), {"conv": conv_state, "state": s, "pos": pos}
