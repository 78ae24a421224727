"""The mLSTM layers of xLSTM.

:class:`MLSTM` (the paper's pre-up-projection block) and :class:`MLSTMLayer` (xLSTM-7B's
layer) call :func:`linear_attention.ops.xlstm.mlstm` (its step when decoding).

Shapes: ``x [B, T, D] -> [B, T, D]``; decoding caches are dicts of float32 arrays.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from linear_attention.nn import context_parallel as cp
from linear_attention.nn import mixer, modules
# ops/xlstm.py: a module named mlstm was shadowed by the function ops.mlstm.
from linear_attention.ops.xlstm import (FORGET_GATES, check_mlstm_options, init_mlstm_state,
                                        mlstm, mlstm_step)

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
  ``eps`` and ``initial_m`` are the op's (see :mod:`linear_attention.ops.xlstm`).
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, expand: int = 2, conv_width: int = 4,
               qkv_block_size: int = 4, forget_gate: str = "sigmoid", chunk_size: int = 64,
               norm_eps: float = 1e-5, eps: float = 0.0, initial_m: float = -np.inf,
               rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    d_inner = expand * d_model
    mixer.check_divisible("d_inner (expand * d_model)", d_inner, "num_heads", num_heads)
    if forget_gate not in FORGET_GATES:
      raise ValueError(f"forget_gate must be one of {list(FORGET_GATES)}, "
                       f"got {forget_gate!r}.")
    self.num_heads, self.d_inner, self.head_dim = num_heads, d_inner, d_inner // num_heads
    self.forget_gate, self.chunk_size = forget_gate, chunk_size
    check_mlstm_options(eps, initial_m)
    self.eps, self.initial_m = float(eps), float(initial_m)
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
              segment_ids=segment_ids, context=cp.context(), eps=self.eps,
              initial_m=self.initial_m)
    return self._out(o, u_conv, z)

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"conv": [B, W-1, d_inner], "C": [B, H, Dh, Dh], "n": [B, H, Dh], "m": [B, H]}``,
    float32 (a fresh memory: ``m = initial_m``, see :mod:`linear_attention.ops.xlstm`)."""
    c, n, m = init_mlstm_state(batch, self.num_heads, self.head_dim, self.head_dim,
                               self.initial_m)
    return {"conv": self.conv.init_state(batch), "C": c, "n": n, "m": m}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    u, z = jnp.split(self.up_proj(x), 2, axis=-1)
    u_conv, conv = self.conv.step(u, cache["conv"])
    q, k, v, ig, fg = self._inputs(u, u_conv)
    o, (c, n, m) = mlstm_step((cache["C"], cache["n"], cache["m"]), q, k, v, ig, fg,
                              forget_gate=self.forget_gate, eps=self.eps)
    return self._out(o, u_conv, z), {"conv": conv, "C": c, "n": n, "m": m}


class MLSTMLayer(mixer.Mixer):
  """The mLSTM layer of xLSTM-7B (Beck et al. 2025, arXiv:2503.13427; transformers'
  ``xLSTMLayer``).

  From ``x [B, T, D]``: ``q, k [B, T, H, Dqk]`` and ``v [B, T, H, Dv]`` by dense maps
  (``qk_dim = int(D * qk_dim_factor)``, ``v_dim = int(D * v_dim_factor)``), input and
  forget gate pre-activations (one per head, soft-capped at ``gate_soft_cap``) and an
  output gate ``sigmoid(W_o x) [B, T, v_dim]``. Then
  ``W_out(o_gate * LayerNorm_heads(mlstm(q, k, v, i~, f~)))``, the per-head LayerNorm
  with its own scale (and bias with ``use_bias``) per channel. The mLSTM uses the
  sigmoid forget gate, the read's ``eps`` and the fresh stabiliser ``initial_m``
  (xLSTM-7B's ``1e-6`` and ``0`` by default). Decoding cache: ``C [B, H, Dqk, Dv]``,
  ``n [B, H, Dqk]``, ``m [B, H]``, float32.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, qk_dim_factor: float = 0.5,
               v_dim_factor: float = 1.0, gate_soft_cap: float | None = 15.0,
               use_bias: bool = False, norm_eps: float = 1e-6, eps: float = 1e-6,
               initial_m: float = 0.0, chunk_size: int = 64, rngs: nnx.Rngs, dtype=None,
               param_dtype=jnp.float32):
    for name, f in (("qk_dim_factor", qk_dim_factor), ("v_dim_factor", v_dim_factor)):
      if isinstance(f, bool) or not isinstance(f, (int, float)) or not f > 0:
        raise ValueError(f"{name} must be a number > 0, got {f!r}.")
    qk_dim, v_dim = int(d_model * qk_dim_factor), int(d_model * v_dim_factor)
    mixer.check_divisible("qk_dim (int(d_model * qk_dim_factor))", qk_dim, "num_heads",
                          num_heads)
    mixer.check_divisible("v_dim (int(d_model * v_dim_factor))", v_dim, "num_heads", num_heads)
    modules.check_soft_cap("gate_soft_cap", gate_soft_cap)
    check_mlstm_options(eps, initial_m)
    self.num_heads, self.qk_dim, self.v_dim = num_heads, qk_dim, v_dim
    self.gate_soft_cap, self.chunk_size = gate_soft_cap, chunk_size
    self.eps, self.initial_m = float(eps), float(initial_m)
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.q_proj = modules.dense(d_model, qk_dim, use_bias=use_bias, **kw)
    self.k_proj = modules.dense(d_model, qk_dim, use_bias=use_bias, **kw)
    self.v_proj = modules.dense(d_model, v_dim, use_bias=use_bias, **kw)
    self.o_gate = modules.dense(d_model, v_dim, use_bias=use_bias, **kw)
    zeros = nnx.initializers.zeros_init()
    # xLSTM-7B's initialisation: gate weights zero, input bias -10, forget biases 3..6.
    self.i_gate = modules.dense(d_model, num_heads, use_bias=True, kernel_init=zeros, **kw)
    self.f_gate = modules.dense(d_model, num_heads, use_bias=True, kernel_init=zeros, **kw)
    self.i_gate.bias.set_value(jnp.full((num_heads,), -10.0, param_dtype))
    self.f_gate.bias.set_value(jnp.asarray(np.linspace(3.0, 6.0, num_heads), param_dtype))
    self.o_norm = modules.HeadNorm(v_dim // num_heads, eps=norm_eps, center=True,
                                   heads=num_heads, use_bias=use_bias, rngs=rngs,
                                   param_dtype=param_dtype)
    self.out_proj = modules.dense(v_dim, d_model, use_bias=use_bias, **kw)

  def _inputs(self, x):
    h, cap = self.num_heads, self.gate_soft_cap
    q, k, v = (modules.split_heads(p(x), h) for p in (self.q_proj, self.k_proj, self.v_proj))
    ig = modules.soft_cap(self.i_gate(x).astype(jnp.float32), cap)
    fg = modules.soft_cap(self.f_gate(x).astype(jnp.float32), cap)
    return q, k, v, ig, fg

  def _out(self, o, x):
    o = modules.merge_heads(self.o_norm(o.astype(x.dtype)))
    return self.out_proj(jax.nn.sigmoid(self.o_gate(x)) * o)

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``."""
    q, k, v, ig, fg = self._inputs(x)
    o = mlstm(q, k, v, ig, fg, chunk_size=self.chunk_size, segment_ids=segment_ids,
              context=cp.context(), eps=self.eps, initial_m=self.initial_m)
    return self._out(o, x)

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"C": [B, H, Dqk, Dv], "n": [B, H, Dqk], "m": [B, H]}`` float32, ``m = initial_m``."""
    h = self.num_heads
    c, n, m = init_mlstm_state(batch, h, self.qk_dim // h, self.v_dim // h, self.initial_m)
    return {"C": c, "n": n, "m": m}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    q, k, v, ig, fg = self._inputs(x)
    o, (c, n, m) = mlstm_step((cache["C"], cache["n"], cache["m"]), q, k, v, ig, fg,
                              eps=self.eps)
    return self._out(o, x), {"C": c, "n": n, "m": m}
