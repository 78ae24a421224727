"""Delta-rule layers: DeltaNet, Gated DeltaNet, Kimi Delta Attention, Gated
DeltaProduct, and RWKV-7's time mixing (the last three on the DPLR engine,
:mod:`linear_attention.ops.dplr`).

``x [B, T, D] -> [B, T, D]``. In the DeltaNet family ``q, k, v`` go through
short causal convolutions (silu) and ``q, k`` are L2-normalised per head (the
delta rule needs unit keys); the write strength is ``beta = sigmoid(W_b x)``
(times 2 with ``allow_neg_eigval``: eigenvalues of ``I - beta k k^T`` in
``[-1, 1]``). Decoding state: the conv window ``[B, W-1, (1 + 2 n) D]`` (``n``
keys and values per token: 1, or DeltaProduct's Householder steps) and the
state ``[B, H, Dh, Dh]``, both float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from linear_attention.nn import context_parallel as cp
from linear_attention.nn import mixer, modules
from linear_attention.ops import delta as delta_ops
from linear_attention.ops import dplr as dplr_ops

Array = jax.Array


class DeltaNet(mixer.Mixer):
  """DeltaNet (Schlag et al. 2021; chunkwise training of Yang et al. 2024).

  ``o = W_o(RMSNorm(deltanet(q, k, v, beta)) * swish(W_g x))`` (the output gate
  with ``use_gate``, else just the norm).
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, conv_width: int = 4,
               use_short_conv: bool = True, use_gate: bool = True, allow_neg_eigval: bool = False,
               chunk_size: int = 64, norm_eps: float = 1e-5, rngs: nnx.Rngs, dtype=None,
               param_dtype=jnp.float32):
    self._build(d_model, num_heads, 1, conv_width=conv_width, use_short_conv=use_short_conv,
                use_gate=use_gate, allow_neg_eigval=allow_neg_eigval, chunk_size=chunk_size,
                norm_eps=norm_eps, rngs=rngs, dtype=dtype, param_dtype=param_dtype)

  def _build(self, d_model, num_heads, steps, *, conv_width, use_short_conv, use_gate,
             allow_neg_eigval, chunk_size, norm_eps, rngs, dtype, param_dtype,
             num_v_heads=None, head_k_dim=None, head_v_dim=None):
    """The parameters of the family; ``steps`` keys, values and betas per token.

    ``num_heads`` q/k heads of ``head_k_dim`` channels and ``num_v_heads`` value heads of
    ``head_v_dim`` (defaults: ``num_heads`` and ``d_model // num_heads``); each q/k head
    serves ``num_v_heads // num_heads`` consecutive value heads."""
    num_v_heads = num_heads if num_v_heads is None else num_v_heads
    mixer.check_positive("num_v_heads", num_v_heads)
    mixer.check_divisible("num_v_heads", num_v_heads, "num_heads", num_heads)
    if head_k_dim is None or head_v_dim is None:
      mixer.check_divisible("d_model", d_model, "num_heads", num_heads)
    head_k_dim = d_model // num_heads if head_k_dim is None else head_k_dim
    head_v_dim = d_model // num_heads if head_v_dim is None else head_v_dim
    mixer.check_positive("head_k_dim", head_k_dim)
    mixer.check_positive("head_v_dim", head_v_dim)
    if steps > 1 and (num_v_heads != num_heads or head_k_dim != head_v_dim):
      raise ValueError("several steps per token need num_v_heads == num_heads and head_k_dim "
                       f"== head_v_dim, got {num_v_heads}, {num_heads}, {head_k_dim}, "
                       f"{head_v_dim}.")
    self.d_model, self.num_heads, self.num_v_heads = d_model, num_heads, num_v_heads
    self.head_k_dim, self.head_v_dim = head_k_dim, head_v_dim
    self.head_dim = head_v_dim
    self.key_dim, self.value_dim = num_heads * head_k_dim, num_v_heads * head_v_dim
    self.allow_neg_eigval, self.chunk_size, self.use_gate = allow_neg_eigval, chunk_size, use_gate
    self.steps = steps
    # q, then the steps' keys, then their values
    width = (1 + steps) * self.key_dim + steps * self.value_dim
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.qkv_proj = modules.dense(d_model, width, **kw)
    self.conv = (modules.ShortConv(width, conv_width, use_bias=False, rngs=rngs,
                                param_dtype=param_dtype) if use_short_conv else None)
    self.b_proj = modules.dense(d_model, steps * num_v_heads, **kw)
    self.g_proj = modules.dense(d_model, self.value_dim, **kw) if use_gate else None
    self.o_norm = modules.HeadNorm(head_v_dim, eps=norm_eps, rngs=rngs, param_dtype=param_dtype)
    self.o_proj = modules.dense(self.value_dim, d_model, **kw)

  def _heads(self, qkv, x):
    dk, h, n = self.key_dim, self.num_heads, self.steps
    q = modules.split_heads(qkv[..., :dk], h)
    k, v = qkv[..., dk:(1 + n) * dk], qkv[..., (1 + n) * dk:]
    beta = jax.nn.sigmoid(self.b_proj(x).astype(jnp.float32))
    if self.allow_neg_eigval:
      beta = 2.0 * beta
    if n == 1:
      # Grouped value heads: the delta-rule ops read q/k head h // (Hv // H) themselves.
      return (q, modules.split_heads(k, h), modules.split_heads(v, self.num_v_heads),
              beta.astype(x.dtype))
    # [..., n * D] -> [..., H, n, Dh]: step j of head i reads columns (j, i).
    steps = lambda z, w: jnp.swapaxes(z.reshape(z.shape[:-1] + (n, h, w)), -3, -2)
    beta = jnp.swapaxes(beta.reshape(beta.shape[:-1] + (n, h)), -2, -1)
    return q, steps(k, self.head_k_dim), steps(v, self.head_v_dim), beta.astype(x.dtype)

  def _qkv(self, x, segment_ids):
    qkv = self.qkv_proj(x)
    qkv = jax.nn.silu(qkv) if self.conv is None else self.conv(qkv, segment_ids)
    return self._heads(qkv, x)

  def _qkv_step(self, x, conv_state):
    qkv = self.qkv_proj(x)
    if self.conv is None:
      return self._heads(jax.nn.silu(qkv), x), conv_state
    qkv, conv_state = self.conv.step(qkv, conv_state)
    return self._heads(qkv, x), conv_state

  def _out(self, o, x):
    o = self.o_norm(o.astype(x.dtype))
    if self.g_proj is not None:
      o = o * jax.nn.silu(modules.split_heads(self.g_proj(x), self.num_v_heads))
    return self.o_proj(modules.merge_heads(o))

  def _log_decay(self, x):
    return None

  def _mix(self, q, k, v, beta, x, segment_ids):
    """The op over the sequence: ``[B, T, H, *]`` in, ``o [B, T, H, Dh]`` out."""
    g = self._log_decay(x)
    kw = dict(chunk_size=self.chunk_size, segment_ids=segment_ids, normalize_qk=True,
              context=cp.context())
    if g is None:
      return delta_ops.deltanet(q, k, v, beta, **kw)
    return delta_ops.gated_deltanet(q, k, v, beta, g, **kw)

  def _mix_step(self, q, k, v, beta, x, state):
    """The op on one token: ``[B, H, *]`` in, ``(o [B, H, Dh], state)`` out."""
    g = self._log_decay(x)
    if g is None:
      return delta_ops.deltanet_step(state, q, k, v, beta, normalize_qk=True)
    return delta_ops.gated_deltanet_step(state, q, k, v, beta, g, normalize_qk=True)

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``."""
    q, k, v, beta = self._qkv(x, segment_ids)
    return self._out(self._mix(q, k, v, beta, x, segment_ids), x)

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"conv": [B, W-1, (1 + n) H Dk + n Hv Dv] (or None), "state": [B, Hv, Dk, Dv]}``,
    float32."""
    return {"conv": None if self.conv is None else self.conv.init_state(batch),
            "state": jnp.zeros((batch, self.num_v_heads, self.head_k_dim, self.head_v_dim),
                               jnp.float32)}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    (q, k, v, beta), conv_state = self._qkv_step(x, cache["conv"])
    o, state = self._mix_step(q, k, v, beta, x, cache["state"])
    return self._out(o, x), {"conv": conv_state, "state": state}


class GatedDeltaNet(DeltaNet):
  """Gated DeltaNet (Yang, Kautz and Hatamizadeh 2024): DeltaNet with a Mamba-2 style decay.

  ``log_decay = -exp(A_log) * softplus(W_a x + dt_bias)`` per head and token,
  with ``exp(A_log)`` uniform in ``a_init_range`` (default ``[1, 16]``) and
  ``softplus(dt_bias)`` log-uniform in ``[dt_min, dt_max]`` (floored at
  ``dt_init_floor``) at init, as Mamba-2.

  Head sizes (Qwen3-Next, OLMo-Hybrid): ``num_heads`` q/k heads of ``head_k_dim``
  channels and ``num_v_heads`` value heads of ``head_v_dim`` (defaults ``num_heads`` and
  ``d_model // num_heads``); the gate, ``beta`` and the state are per value head. With more
  value heads than q/k heads, value head ``h`` reads q/k head ``h // (num_v_heads //
  num_heads)`` inside the op (grouped value heads), which does not repeat q and k.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, num_v_heads: int | None = None,
               head_k_dim: int | None = None, head_v_dim: int | None = None,
               conv_width: int = 4,
               use_short_conv: bool = True, use_gate: bool = True, allow_neg_eigval: bool = False,
               dt_min: float = 1e-3, dt_max: float = 1e-1, dt_init_floor: float = 1e-4,
               a_init_range: tuple[float, float] = (1.0, 16.0), chunk_size: int = 64,
               norm_eps: float = 1e-5, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    self._build(d_model, num_heads, 1, conv_width=conv_width, use_short_conv=use_short_conv,
                use_gate=use_gate, allow_neg_eigval=allow_neg_eigval, chunk_size=chunk_size,
                norm_eps=norm_eps, rngs=rngs, dtype=dtype, param_dtype=param_dtype,
                num_v_heads=num_v_heads, head_k_dim=head_k_dim, head_v_dim=head_v_dim)
    _scalar_gate(self, d_model, self.num_v_heads, dict(dt_min=dt_min, dt_max=dt_max,
                                                dt_init_floor=dt_init_floor,
                                                a_init_range=a_init_range),
                 rngs, dtype, param_dtype)

  def _log_decay(self, x):
    return _scalar_log_decay(self, x)


def _scalar_gate(layer, d_model, num_heads, init, rngs, dtype, param_dtype):
  """Mamba-2's gate parameters: ``a_proj``, ``A_log`` (``exp`` uniform in
  ``init["a_init_range"]``) and ``dt_bias`` (``softplus`` log-uniform in ``[dt_min, dt_max]``,
  floored at ``dt_init_floor``), one per head."""
  modules.check_decay_init(**init)
  layer.a_proj = modules.dense(d_model, num_heads, rngs=rngs, dtype=dtype, param_dtype=param_dtype)
  layer.A_log = modules.param(modules.a_log_init(rngs.params(), (num_heads,),
                                                 init["a_init_range"]), param_dtype)
  layer.dt_bias = modules.param(modules.dt_bias_init(
      rngs.params(), (num_heads,), init["dt_min"], init["dt_max"], init["dt_init_floor"]),
      param_dtype)


def _scalar_log_decay(layer, x):
  """``-exp(A_log) * softplus(W_a x + dt_bias)``, ``[..., H]`` float32."""
  a = layer.a_proj(x).astype(jnp.float32) + layer.dt_bias[...].astype(jnp.float32)
  return -jnp.exp(layer.A_log[...].astype(jnp.float32)) * jax.nn.softplus(a)


class KimiDeltaAttention(DeltaNet):
  """Kimi Delta Attention (Kimi Team 2025, "Kimi Linear"): the gated delta rule with a
  per-channel decay, ``S_t = (I - beta_t k_t k_t^T) diag(alpha_t) S_{t-1} + beta_t k_t v_t^T``.

  ``log alpha = -exp(A_log) * softplus(W_up W_down x + dt_bias)``: a low-rank
  projection per channel, ``exp(A_log)`` per head uniform in ``a_init_range``
  (default ``[1, 16]``) and ``softplus(dt_bias)`` per channel log-uniform in
  ``[dt_min, dt_max]`` (floored at ``dt_init_floor``) at init. Output:
  ``W_o(RMSNorm(o) * sigmoid(G_up G_down x))`` (a low-rank output gate). ``head_dim``
  (default ``d_model // num_heads``) is the size of every q, k and v head (Kimi Linear's
  ``linear_head_dim``), independent of ``d_model``.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, head_dim: int | None = None,
               conv_width: int = 4,
               use_short_conv: bool = True, allow_neg_eigval: bool = False,
               gate_low_rank: int | None = None, dt_min: float = 1e-3, dt_max: float = 1e-1,
               dt_init_floor: float = 1e-4, a_init_range: tuple[float, float] = (1.0, 16.0),
               chunk_size: int | None = None, norm_eps: float = 1e-5, rngs: nnx.Rngs, dtype=None,
               param_dtype=jnp.float32):
    modules.check_decay_init(dt_min=dt_min, dt_max=dt_max, dt_init_floor=dt_init_floor,
                             a_init_range=a_init_range)
    self._build(d_model, num_heads, 1, conv_width=conv_width, use_short_conv=use_short_conv,
                use_gate=False, allow_neg_eigval=allow_neg_eigval, chunk_size=chunk_size,
                norm_eps=norm_eps, rngs=rngs, dtype=dtype, param_dtype=param_dtype,
                head_k_dim=head_dim, head_v_dim=head_dim)
    rank = self.head_dim if gate_low_rank is None else gate_low_rank
    mixer.check_positive("gate_low_rank", rank)
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    width = self.key_dim
    self.f_down, self.f_up = modules.dense(d_model, rank, **kw), modules.dense(rank, width, **kw)
    self.A_log = modules.param(modules.a_log_init(rngs.params(), (num_heads,), a_init_range),
                               param_dtype)
    self.dt_bias = modules.param(modules.dt_bias_init(rngs.params(), (width,), dt_min, dt_max,
                                                      dt_init_floor), param_dtype)
    self.out_down, self.out_up = modules.dense(d_model, rank, **kw), modules.dense(rank, width, **kw)

  def _log_decay(self, x):
    f = self.f_up(self.f_down(x)).astype(jnp.float32) + self.dt_bias[...].astype(jnp.float32)
    rate = jnp.exp(self.A_log[...].astype(jnp.float32))[:, None]  # [H, 1]
    return -rate * jax.nn.softplus(modules.split_heads(f, self.num_heads))  # [..., H, Dh]

  def _out(self, o, x):
    o = self.o_norm(o.astype(x.dtype))
    gate = jax.nn.sigmoid(self.out_up(self.out_down(x)))
    return self.o_proj(modules.merge_heads(o) * gate)

  def _mix(self, q, k, v, beta, x, segment_ids):
    return dplr_ops.kda(q, k, v, beta, self._log_decay(x), chunk_size=self.chunk_size,
                        segment_ids=segment_ids, normalize_qk=True, context=cp.context())

  def _mix_step(self, q, k, v, beta, x, state):
    return dplr_ops.kda_step(state, q, k, v, beta, self._log_decay(x), normalize_qk=True)


class GatedDeltaProduct(DeltaNet):
  """Gated DeltaProduct (Siems et al. 2025): ``num_householder`` delta-rule steps per
  token, each with its own key, value and ``beta``, after one Mamba-2 style gate
  per head (as :class:`GatedDeltaNet`; ``use_forget_gate=False`` drops it).

  The projection gives ``q`` and ``n`` keys and values per token (``(1 + 2 n) D``
  columns) and ``n`` betas per head; the output is DeltaNet's.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, num_householder: int = 2,
               use_forget_gate: bool = True, conv_width: int = 4, use_short_conv: bool = True,
               use_gate: bool = True, allow_neg_eigval: bool = False, dt_min: float = 1e-3,
               dt_max: float = 1e-1, dt_init_floor: float = 1e-4,
               a_init_range: tuple[float, float] = (1.0, 16.0), chunk_size: int | None = None,
               norm_eps: float = 1e-5, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    mixer.check_positive("num_householder", num_householder)
    self._build(d_model, num_heads, num_householder, conv_width=conv_width,
                use_short_conv=use_short_conv, use_gate=use_gate,
                allow_neg_eigval=allow_neg_eigval, chunk_size=chunk_size, norm_eps=norm_eps,
                rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.use_forget_gate = use_forget_gate
    if use_forget_gate:
      _scalar_gate(self, d_model, num_heads, dict(dt_min=dt_min, dt_max=dt_max,
                                                  dt_init_floor=dt_init_floor,
                                                  a_init_range=a_init_range),
                   rngs, dtype, param_dtype)

  def _log_decay(self, x):
    return _scalar_log_decay(self, x) if self.use_forget_gate else None

  def _mix(self, q, k, v, beta, x, segment_ids):
    if self.steps == 1:  # [..., H, Dh] -> one step of [..., H, 1, Dh]
      k, v, beta = k[..., None, :], v[..., None, :], beta[..., None]
    return dplr_ops.gated_deltaproduct(q, k, v, beta, self._log_decay(x),
                                       chunk_size=self.chunk_size, segment_ids=segment_ids,
                                       normalize_qk=True, context=cp.context())

  def _mix_step(self, q, k, v, beta, x, state):
    if self.steps == 1:
      k, v, beta = k[..., None, :], v[..., None, :], beta[..., None]
    return dplr_ops.gated_deltaproduct_step(state, q, k, v, beta, self._log_decay(x),
                                            normalize_qk=True)


class RWKV7TimeMix(mixer.Mixer):
  """RWKV-7 "Goose" time mixing (Peng et al. 2025, arXiv:2503.14456).

  Token shift with one learned interpolation per branch (``r, w, k, v, a, g``);
  ``log w = -exp(-0.5) * sigmoid(w0 + tanh(x_w W1) W2)`` per channel (a decay in
  ``(0.545, 1)``); the in-context learning rate ``a = sigmoid(a0 + x_a A1 A2)``;
  the removal key ``kappa_hat = normalize(k * xi)`` per head and the
  replacement key ``k_tilde = k * (1 + (a - 1) * alpha)``; the output
  ``W_o((GroupNorm(wkv r) + (r . (rho * k_tilde)) v) * g)`` with
  ``g = sigmoid(x_g G1) G2``. The value residual across layers (``v_first``)
  is left out: a mixer sees only its own input.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, decay_low_rank: int = 64,
               a_low_rank: int = 64, gate_low_rank: int = 128, chunk_size: int | None = None,
               norm_eps: float = 64e-5, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    mixer.check_divisible("d_model", d_model, "num_heads", num_heads)
    for name, value in (("decay_low_rank", decay_low_rank), ("a_low_rank", a_low_rank),
                        ("gate_low_rank", gate_low_rank)):
      mixer.check_positive(name, value)
    self.d_model, self.num_heads, self.head_dim = d_model, num_heads, d_model // num_heads
    self.chunk_size = chunk_size
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    ratio = jnp.arange(d_model, dtype=jnp.float32) / d_model
    # Token-shift interpolations for r, w, k, v, a, g, spread over [0, 1) across channels.
    self.mix = modules.param(jnp.stack([1.0 - ratio ** p for p in (0.2, 0.9, 0.7, 0.7, 0.9, 0.2)]),
                          param_dtype)
    small = lambda shape: (1e-2 * jax.random.normal(rngs.params(), shape)).astype(param_dtype)
    # Decay from slow (sigmoid(-6): log w ~ -0.0015) to fast (sigmoid(0.5): log w ~ -0.38).
    self.w0 = modules.param(-6.0 + 6.5 * ratio ** 0.7, param_dtype)
    self.w1, self.w2 = nnx.Param(small((d_model, decay_low_rank))), nnx.Param(
        small((decay_low_rank, d_model)))
    self.a0 = modules.param(jnp.zeros((d_model,)), param_dtype)
    self.a1, self.a2 = nnx.Param(small((d_model, a_low_rank))), nnx.Param(
        small((a_low_rank, d_model)))
    self.g1, self.g2 = nnx.Param(small((d_model, gate_low_rank))), nnx.Param(
        small((gate_low_rank, d_model)))
    self.removal_scale = modules.param(jnp.full((d_model,), 0.85), param_dtype)  # xi
    self.replacement_mix = modules.param(jnp.ones((d_model,)), param_dtype)  # alpha
    self.bonus = modules.param(jnp.full((num_heads, self.head_dim), 0.5), param_dtype)  # rho
    self.r_proj = modules.dense(d_model, d_model, **kw)
    self.k_proj = modules.dense(d_model, d_model, **kw)
    self.v_proj = modules.dense(d_model, d_model, **kw)
    self.o_norm = modules.HeadNorm(self.head_dim, eps=norm_eps, center=True, rngs=rngs,
                                param_dtype=param_dtype)
    self.o_proj = modules.dense(d_model, d_model, **kw)

  def _inputs(self, x, x_prev):
    dt, h, f32 = x.dtype, self.num_heads, jnp.float32
    p = lambda w: w[...].astype(dt)
    xx = x_prev - x
    mix = p(self.mix)
    xr, xw, xk, xv, xa, xg = (x + xx * mix[i] for i in range(6))
    r, k, v = (modules.split_heads(proj(z), h) for proj, z in
               ((self.r_proj, xr), (self.k_proj, xk), (self.v_proj, xv)))
    d = self.w0[...].astype(f32) + (jnp.tanh(xw @ p(self.w1)) @ p(self.w2)).astype(f32)
    log_w = modules.split_heads(-jnp.exp(-0.5) * jax.nn.sigmoid(d), h)
    a = jax.nn.sigmoid(self.a0[...].astype(f32) + ((xa @ p(self.a1)) @ p(self.a2)).astype(f32))
    a = modules.split_heads(a, h)
    g = jax.nn.sigmoid(xg @ p(self.g1)) @ p(self.g2)
    kf = k.astype(f32)
    kappa = kf * modules.split_heads(self.removal_scale[...].astype(f32), h)
    kappa = kappa * jax.lax.rsqrt(jnp.sum(kappa * kappa, axis=-1, keepdims=True) + 1e-12)
    alpha = modules.split_heads(self.replacement_mix[...].astype(f32), h)
    k_tilde = (kf * (1.0 + (a - 1.0) * alpha)).astype(dt)  # the op wants r, k, v in one dtype
    return r, k_tilde, v, log_w, kappa, a, g

  def _out(self, o, r, k, v, g, x):
    o = self.o_norm(o.astype(x.dtype)).astype(jnp.float32)
    o = o + dplr_ops.rwkv7_bonus(r, k, v, self.bonus[...])  # after the norm, as in RWKV-7
    return self.o_proj(modules.merge_heads(o).astype(x.dtype) * g)

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``."""
    r, k, v, log_w, kappa, a, g = self._inputs(x, modules.token_shift(x, segment_ids))
    o = dplr_ops.rwkv7(r, k, v, log_w, kappa, a, chunk_size=self.chunk_size,
                       segment_ids=segment_ids, context=cp.context())
    return self._out(o, r, k, v, g, x)

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"state": [B, H, Dh, Dh] float32 (wkv^T), "shift": [B, D] float32}`` (the
    previous token)."""
    d = self.head_dim
    return {"state": jnp.zeros((batch, self.num_heads, d, d), jnp.float32),
            "shift": jnp.zeros((batch, self.d_model), jnp.float32)}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``."""
    r, k, v, log_w, kappa, a, g = self._inputs(x, cache["shift"].astype(x.dtype))
    o, state = dplr_ops.rwkv7_step(cache["state"], r, k, v, log_w, kappa, a)
    return self._out(o, r, k, v, g, x), {"state": state, "shift": x.astype(jnp.float32)}
