"""The mLSTM block of xLSTM and log-linear Mamba-2.

* :class:`MLSTM` calls :func:`linear_attention.ops.xlstm.mlstm` (its step when decoding);
* :class:`LogLinearMamba2` is :class:`~linear_attention.nn.gated.Mamba2` with
  Fenwick levels: the same projections plus one for the level weights, and
  :func:`linear_attention.ops.loglinear.loglinear_ssd` in place of ``ssd``.

Shapes: ``x [B, T, D] -> [B, T, D]``; decoding caches are dicts of float32 arrays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from linear_attention.nn import context_parallel as cp
from linear_attention.nn import gated, mixer, modules
from linear_attention.ops import loglinear as loglinear_ops
# ops/xlstm.py: a module named mlstm was shadowed by the function ops.mlstm.
from linear_attention.ops.xlstm import FORGET_GATES, init_mlstm_state, mlstm, mlstm_step

Array = jax.Array


class BlockDiagonal(nnx.Module):
  """A block-diagonal linear map ``[..., N * S] -> [..., N * S]`` with ``N`` blocks of
  ``S x S`` (xLSTM's "headwise" q/k/v projections): ``N S^2`` weights instead of ``(N S)^2``."""

  def __init__(self, features: int, block_size: int, *, rngs: nnx.Rngs, dtype=None,
               param_dtype=jnp.float32):
    mixer.check_divisible("features", features, "block_size", block_size)
    self.block_size, self.dtype = block_size, dtype
    shape = (features // block_size, block_size, block_size)
    self.kernel = nnx.Param(
        (block_size ** -0.5 * jax.random.normal(rngs.params(), shape)).astype(param_dtype))

  def __call__(self, x: Array) -> Array:
    """``x [..., F]`` -> ``[..., F]`` (in ``dtype`` when given, else that of ``x``)."""
    dtype = x.dtype if self.dtype is None else self.dtype
    xb = x.astype(dtype).reshape(x.shape[:-1] + (-1, self.block_size))
    y = jnp.einsum("...ni,nij->...nj", xb, self.kernel[...].astype(dtype))
    return y.reshape(x.shape)


class MLSTM(mixer.Mixer):
  """The mLSTM block of xLSTM (Beck et al. 2024), pre-up-projection form.

  ``x`` goes up to ``2 * d_inner`` (``d_inner = expand * D``): a branch ``u``
  and an output gate ``z``. ``q, k`` come from the short causal convolution of
  ``u``, ``v`` from ``u`` itself; the input and forget gate pre-activations
  (one per head) from ``[q, k, v]``. Then
  ``W_down((LayerNorm_heads(mlstm(q, k, v, i~, f~)) + skip * conv(u)) * swish(z))``.
  q, k, v are block-diagonal maps with blocks of ``qkv_block_size`` (the
  paper's headwise projections; 4 as in xLSTM's configs). Forget-gate
  biases start spread over ``[3, 6]`` (slow forgetting), gate weights at zero.
  Decoding cache: ``conv [B, W-1, d_inner]`` and the mLSTM state ``C, n, m``.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, expand: int = 2, conv_width: int = 4,
               qkv_block_size: int = 4, forget_gate: str = "sigmoid", chunk_size: int = 64, norm_eps: float = 1e-5,
               rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    d_inner = expand * d_model
    mixer.check_divisible("d_inner (expand * d_model)", d_inner, "num_heads", num_heads)
    if forget_gate not in FORGET_GATES:
      raise ValueError(f"forget_gate must be one of {list(FORGET_GATES)}, "
                       f"got {forget_gate!r}.")
    self.num_heads, self.d_inner, self.head_dim = num_heads, d_inner, d_inner // num_heads
    self.forget_gate, self.chunk_size = forget_gate, chunk_size
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.up_proj = modules.dense(d_model, 2 * d_inner, **kw)
    self.conv = modules.ShortConv(d_inner, conv_width, rngs=rngs, param_dtype=param_dtype)
    self.q_proj = BlockDiagonal(d_inner, qkv_block_size, **kw)
    self.k_proj = BlockDiagonal(d_inner, qkv_block_size, **kw)
    self.v_proj = BlockDiagonal(d_inner, qkv_block_size, **kw)
    zeros = nnx.initializers.zeros_init()
    self.i_proj = modules.dense(3 * d_inner, num_heads, use_bias=True, kernel_init=zeros, **kw)
    self.f_proj = modules.dense(3 * d_inner, num_heads, use_bias=True, kernel_init=zeros, **kw)
    self.i_proj.bias.set_value(
        (0.1 * jax.random.normal(rngs.params(), (num_heads,))).astype(param_dtype))
    self.f_proj.bias.set_value(jnp.asarray(np.linspace(3.0, 6.0, num_heads), param_dtype))
    self.o_norm = modules.HeadNorm(self.head_dim, eps=norm_eps, center=True, rngs=rngs,
                                param_dtype=param_dtype)
    self.skip = modules.param(jnp.ones((d_inner,)), param_dtype)
    self.down_proj = modules.dense(d_inner, d_model, **kw)

  def _inputs(self, u, u_conv):
    h = self.num_heads
    q, k, v = self.q_proj(u_conv), self.k_proj(u_conv), self.v_proj(u)
    qkv = jnp.concatenate([q, k, v], axis=-1)
    gates = (self.i_proj(qkv).astype(jnp.float32), self.f_proj(qkv).astype(jnp.float32))
    return tuple(modules.split_heads(a, h) for a in (q, k, v)) + gates

  def _out(self, o, u_conv, z):
    o = modules.merge_heads(self.o_norm(o.astype(z.dtype)))
    o = (o + self.skip[...].astype(z.dtype) * u_conv) * jax.nn.silu(z)
    return self.down_proj(o)

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``."""
    u, z = jnp.split(self.up_proj(x), 2, axis=-1)
    u_conv = self.conv(u, segment_ids)
    q, k, v, ig, fg = self._inputs(u, u_conv)
    o = mlstm(q, k, v, ig, fg, forget_gate=self.forget_gate, chunk_size=self.chunk_size,
              segment_ids=segment_ids, context=cp.context())
    return self._out(o, u_conv, z)

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"conv": [B, W-1, d_inner], "C": [B, H, Dh, Dh], "n": [B, H, Dh], "m": [B, H]}``,
    float32 (a fresh memory: ``m = -inf``, see :mod:`linear_attention.ops.xlstm`)."""
    c, n, m = init_mlstm_state(batch, self.num_heads, self.head_dim, self.head_dim)
    return {"conv": self.conv.init_state(batch), "C": c, "n": n, "m": m}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    u, z = jnp.split(self.up_proj(x), 2, axis=-1)
    u_conv, conv = self.conv.step(u, cache["conv"])
    q, k, v, ig, fg = self._inputs(u, u_conv)
    o, (c, n, m) = mlstm_step(q, k, v, ig, fg, (cache["C"], cache["n"], cache["m"]),
                              forget_gate=self.forget_gate)
    return self._out(o, u_conv, z), {"conv": conv, "C": c, "n": n, "m": m}


class LogLinearMamba2(gated.Mamba2):
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
    xs, b, c = self._ssd_args(self.conv(xbc, segment_ids))
    a, d, dt_bias = self._params()
    y = loglinear_ops.loglinear_ssd(xs, dt.astype(jnp.float32), a, b, c, self._levels(x), d,
                                    dt_bias=dt_bias, dt_softplus=True,
                                    chunk_size=self.chunk_size, segment_ids=segment_ids)
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
    xs, b, c = self._ssd_args(xbc)
    a, d, dt_bias = self._params()
    y, (s, pos) = loglinear_ops.loglinear_ssd_step(
        xs, dt.astype(jnp.float32), a, b, c, self._levels(x), (cache["state"], cache["pos"]), d,
        dt_bias=dt_bias, dt_softplus=True)
    return self._out(y, z), {"conv": conv_state, "state": s, "pos": pos}
