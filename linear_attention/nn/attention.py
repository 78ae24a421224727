"""Softmax-attention layers: exact (multi-head, grouped-query, RoPE), with a forget
gate (Forgetting Transformer), local (sliding window, Griffin's local attention),
Longformer, BigBird and Linformer.

Shapes: ``x [B, T, D] -> [B, T, D]``; heads ``H``, key/value heads ``Hkv``
(``H % Hkv == 0``), head dimension ``Dh``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax import lax

from linear_attention.nn import context_parallel as cp
from linear_attention.nn import mixer, modules
from linear_attention.nn import norm as norm_lib
from linear_attention.nn.mixer import check_positive
from linear_attention import common as common_ops
from linear_attention.ops import lowrank as lowrank_ops
from linear_attention.ops import softmax as softmax_ops
from linear_attention.ops import sparse as sparse_ops

Array = jax.Array


class SoftmaxAttention(mixer.Mixer):
  """Multi-head softmax attention with RoPE and grouped-query heads.

  Keys and values have ``num_kv_heads`` heads (1: multi-query; ``num_heads``:
  ordinary multi-head), repeated to ``num_heads`` inside the layer, so the KV
  cache stores only ``num_kv_heads``. Decoding keeps a ``[B, max_len, Hkv, Dh]``
  key and value cache (keys stored after the rotation). With the sequence sharded
  (``config.mesh.seq``) it runs all-gather attention (see
  :mod:`~linear_attention.nn.context_parallel`).

  The options of the 2025 checkpoints (all off by default):

  - ``qk_norm="head"``: RMSNorm of each q and k head over ``Dh`` (one scale ``[Dh]`` each
    for q and k, Qwen3); ``"full"``: over the whole projection (``[H * Dh]`` and
    ``[Hkv * Dh]``, OLMo). Applied before the rotation, with ``qk_norm_eps`` and
    ``norm_offset`` (1: a zero-centred ``1 + scale``, Qwen3-Next).
  - ``output_gate=True``: ``o_proj(o * sigmoid(g_proj(x)))``, one gate per channel
    (Qwen3-Next's gated attention).
  - ``rotary_dim``: rotate only the first ``rotary_dim`` channels of each head (partial
    RoPE; frequencies ``rope_base ** (-2i / rotary_dim)``), default ``head_dim``.
  - ``use_bias``: biases on the four projections; ``out_bias`` overrides it for ``o_proj``
    alone (RecurrentGemma: none on q, k, v, one on the output); ``scale``: the logit scale
    (default ``head_dim ** -0.5``).
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, num_kv_heads: int | None = None,
               head_dim: int | None = None, causal: bool = True, use_rope: bool = True,
               rope_base: float = 10000.0, rotary_dim: int | None = None,
               qk_norm: str | None = None, qk_norm_eps: float = 1e-6, norm_offset: float = 0.0,
               output_gate: bool = False, use_bias: bool = False, out_bias: bool | None = None,
               scale: float | None = None, implementation: str | None = None,
               rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
    mixer.check_positive("num_kv_heads", num_kv_heads)
    mixer.check_divisible("num_heads", num_heads, "num_kv_heads", num_kv_heads)
    if head_dim is None:
      mixer.check_divisible("d_model", d_model, "num_heads", num_heads)
      head_dim = d_model // num_heads
    mixer.check_positive("head_dim", head_dim)
    if use_rope and head_dim % 2:
      raise ValueError(f"head_dim must be even for RoPE, got {head_dim}.")
    if rotary_dim is not None and not (isinstance(rotary_dim, int) and 0 < rotary_dim <= head_dim
                                       and rotary_dim % 2 == 0):
      raise ValueError(f"rotary_dim must be None or an even int in 2..head_dim={head_dim}, got "
                       f"{rotary_dim!r}.")
    rotary_dim = head_dim if rotary_dim is None else rotary_dim
    if qk_norm not in (None, "head", "full"):
      raise ValueError(f"qk_norm must be None, 'head' or 'full', got {qk_norm!r}.")
    if scale is not None and not (isinstance(scale, (int, float)) and scale > 0):
      raise ValueError(f"scale must be None or a number > 0, got {scale!r}.")
    self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
    self.causal, self.use_rope, self.rope_base = causal, use_rope, rope_base
    self.rotary_dim, self.qk_norm = rotary_dim, qk_norm
    self.scale = head_dim**-0.5 if scale is None else float(scale)
    self.implementation = implementation
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype, use_bias=use_bias)
    self.q_proj = modules.dense(d_model, num_heads * head_dim, **kw)
    self.k_proj = modules.dense(d_model, num_kv_heads * head_dim, **kw)
    self.v_proj = modules.dense(d_model, num_kv_heads * head_dim, **kw)
    self.o_proj = modules.dense(num_heads * head_dim, d_model, **{
        **kw, "use_bias": use_bias if out_bias is None else out_bias})
    self.g_proj = modules.dense(d_model, num_heads * head_dim, **kw) if output_gate else None
    if norm_offset not in (0, 1):  # checked even without a q/k norm: a typo never passes
      raise ValueError(f"norm_offset must be 0 or 1, got {norm_offset!r}.")
    norm = lambda dim: norm_lib.RMSNorm(dim, eps=qk_norm_eps, offset=norm_offset,
                                        param_dtype=param_dtype)
    if qk_norm == "head":
      self.q_norm, self.k_norm = norm(head_dim), norm(head_dim)
    elif qk_norm == "full":
      self.q_norm, self.k_norm = norm(num_heads * head_dim), norm(num_kv_heads * head_dim)
    else:
      self.q_norm = self.k_norm = None

  @property
  def groups(self) -> int:
    """Query heads per key/value head."""
    return self.num_heads // self.num_kv_heads

  def _qkv(self, x: Array, positions: Array):
    """``x [B, T, D]`` -> rotated ``q [B,T,H,Dh]``, ``k [B,T,Hkv,Dh]``, ``v [B,T,Hkv,Dh]``."""
    q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
    if self.qk_norm == "full":
      q, k = self.q_norm(q), self.k_norm(k)
    q = modules.split_heads(q, self.num_heads)
    k = modules.split_heads(k, self.num_kv_heads)
    v = modules.split_heads(v, self.num_kv_heads)
    if self.qk_norm == "head":
      q, k = self.q_norm(q), self.k_norm(k)
    if self.use_rope:
      q, k = self._rotate(q, positions), self._rotate(k, positions)
    return q, k, v

  def _rotate(self, x: Array, positions: Array) -> Array:
    r = self.rotary_dim
    if r == x.shape[-1]:
      return modules.rope(x, positions, self.rope_base)
    return jnp.concatenate([modules.rope(x[..., :r], positions, self.rope_base), x[..., r:]], -1)

  def _out(self, o: Array, x: Array) -> Array:
    """Attention output ``o [..., H, Dh]`` and the layer input ``x [..., D]`` -> ``[..., D]``."""
    o = modules.merge_heads(o.astype(x.dtype))
    if self.g_proj is not None:
      o = o * jax.nn.sigmoid(self.g_proj(x))
    return self.o_proj(o)

  def _attend(self, q, k, v, segment_ids):
    return softmax_ops.softmax_attention(
        q, k, v, causal=self.causal, scale=self.scale, segment_ids=segment_ids,
        implementation=self.implementation, context=cp.context())

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``; ``segment_ids [B, T]`` packs sequences."""
    b, t, _ = x.shape
    q, k, v = self._qkv(x, modules.positions_of(b, t, segment_ids))
    o = self._attend(q, modules.repeat_kv(k, self.groups), modules.repeat_kv(v, self.groups),
                     segment_ids)
    return self._out(o, x)

  def attention_weights(self, x: Array, segment_ids: Array | None = None) -> Array:
    """The softmax weights of ``x [B, T, D]``: ``[B, H, T, T]`` float32, row ``t`` over keys.

    With the layer's values ``v`` repeated to ``H`` heads, ``einsum("bhts,bshd->bthd", w, v)``
    is the attention the layer computes before ``o_proj``. Builds ``T x T`` per head: for
    inspecting a trained model, not for training.

    Raises:
      ValueError: ``x`` or ``segment_ids`` of the wrong shape.
      NotImplementedError: a subclass whose attention is not this one (local, sparse,
        low-rank, forgetting).
    """
    cls = type(self)
    if cls._attend is not SoftmaxAttention._attend or cls.__call__ is not SoftmaxAttention.__call__:
      raise NotImplementedError(f"{cls.__name__}.attention_weights: only plain softmax "
                                "attention (SoftmaxAttention) returns its weights.")
    mixer.check_features("x", x, self.d_model, 3, "[batch, seq, d_model]")
    b, t, _ = x.shape
    common_ops.check_segment_ids(segment_ids, b, t)
    q, k, _ = self._qkv(x, modules.positions_of(b, t, segment_ids))
    k = modules.repeat_kv(k, self.groups)
    seg = softmax_ops.segment_or_zeros(segment_ids, b, t)
    visible = seg[:, None, :, None] == seg[:, None, None, :]  # [B, 1, T, T]
    if self.causal:
      visible &= jnp.tril(jnp.ones((t, t), bool))
    # The layer's scale on q in float32, as the op applies it.
    s = jnp.einsum("bthd,bshd->bhts", q.astype(jnp.float32) * self.scale,
                   k.astype(jnp.float32))
    return jax.nn.softmax(jnp.where(visible, s, softmax_ops.MASK_VALUE), axis=-1)

  def _cache_len(self, max_len: int) -> int:
    return max_len

  def _cache_limit(self, max_len: int) -> int:
    """The first position the cache cannot hold exactly."""
    return max_len

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"k", "v": [B, L, Hkv, Dh] in dtype, "pos", "limit": int32, "overflow": bool}``.

    Decoding more than ``max_len`` tokens is an error where the position is concrete
    (eager calls). Under ``jit`` it cannot raise: a token past the limit then overwrites the
    newest slot (the outputs stay finite but no longer equal the full attention) and the
    cache's ``"overflow"`` flag turns True for good; read it with :func:`cache_overflowed`.
    """
    if not self.causal:
      return super().init_cache(batch, max_len, dtype)
    check_positive("batch", batch)
    check_positive("max_len", max_len)
    shape = (batch, self._cache_len(max_len), self.num_kv_heads, self.head_dim)
    return {"k": jnp.zeros(shape, dtype), "v": jnp.zeros(shape, dtype),
            "pos": jnp.zeros((), jnp.int32),
            "limit": jnp.asarray(self._cache_limit(max_len), jnp.int32),
            "overflow": jnp.zeros((), bool)}

  def _slot_and_visible(self, pos: Array, length: int):
    # Full cache: token t lives in slot t; slots up to pos are filled.
    return pos, jnp.arange(length) <= pos

  def _decode_bias(self, x: Array, cache: dict, slot: Array) -> tuple[Array | None, dict]:
    """A decoding step's logit bias ``[B, 1, H, L]`` (or None) and the cache entries it
    updates; plain attention has none."""
    del x, cache, slot
    return None, {}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``: append ``k, v`` and attend over the cache."""
    if not self.causal:
      return super().decode_step(x, cache)
    b = x.shape[0]
    pos = cache["pos"]
    limit = cache.get("limit")  # absent in caches made before the limit was recorded
    if (limit is not None and not isinstance(pos, jax.core.Tracer)
        and not isinstance(limit, jax.core.Tracer) and int(pos) >= int(limit)):
      raise ValueError(f"decode_step at position {int(pos)}, but the cache was made by "
                       f"init_cache(max_len={int(limit)}); make it with a larger max_len.")
    q, k, v = self._qkv(x[:, None], jnp.full((b, 1), pos, jnp.int32))
    length = cache["k"].shape[1]
    slot, visible = self._slot_and_visible(pos, length)
    keys = lax.dynamic_update_slice_in_dim(cache["k"], k.astype(cache["k"].dtype), slot, 1)
    values = lax.dynamic_update_slice_in_dim(cache["v"], v.astype(cache["v"].dtype), slot, 1)
    bias, extra = self._decode_bias(x, cache, slot)
    o, _ = softmax_ops.dense_attention_stats(
        q, modules.repeat_kv(keys, self.groups).astype(q.dtype),
        modules.repeat_kv(values, self.groups).astype(q.dtype), visible[None, None, :],
        self.scale, bias)
    y = self._out(o[:, 0], x)
    new = {**cache, **extra, "k": keys, "v": values, "pos": pos + 1}
    if limit is not None:
      new["overflow"] = cache["overflow"] | (pos >= limit)
    return y, new


class ForgettingAttention(SoftmaxAttention):
  """Forgetting Attention (FoX, Lin et al. 2025): causal softmax attention with a forget gate.

  Each head has a data-dependent forget gate ``f_t = sigmoid(w_h . x_t + b_h)``
  (``fgate_proj``, with a bias); the logit of key ``j`` for query ``i`` gets
  ``sum_{j < s <= i} log f_s``. No RoPE by default (the paper's FoX needs no
  position embedding). The KV cache also stores each token's cumulative log
  forget (``"log_forget" [B, L, H]``) and the running sum (``"total" [B, H]``),
  both float32. This is the basic FoX layer (no output gate, QK-norm or
  key/value shift of the "Pro" block). With the sequence sharded it runs all-gather
  attention, each device's ``D`` offset by the gates of the devices before it.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, num_kv_heads: int | None = None,
               head_dim: int | None = None, use_rope: bool = False,
               rope_base: float = 10000.0, algorithm: str | None = None,
               block_size: int = 128, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    super().__init__(d_model, num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                     causal=True, use_rope=use_rope, rope_base=rope_base, rngs=rngs,
                     dtype=dtype, param_dtype=param_dtype)
    softmax_ops.check_implementation(None, algorithm)
    check_positive("block_size", block_size)
    self.algorithm, self.block_size = algorithm, block_size
    self.fgate_proj = modules.dense(d_model, num_heads, use_bias=True, rngs=rngs, dtype=dtype,
                                 param_dtype=param_dtype)

  def _log_fgate(self, x: Array) -> Array:
    """``x [..., D]`` -> ``log f [..., H]`` float32."""
    return jax.nn.log_sigmoid(self.fgate_proj(x).astype(jnp.float32))

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``; ``segment_ids [B, T]`` packs sequences."""
    b, t, _ = x.shape
    q, k, v = self._qkv(x, modules.positions_of(b, t, segment_ids))
    o = softmax_ops.forgetting_attention(
        q, modules.repeat_kv(k, self.groups), modules.repeat_kv(v, self.groups), self._log_fgate(x),
        segment_ids=segment_ids, algorithm=self.algorithm, block_size=self.block_size,
        context=cp.context())
    return self.o_proj(modules.merge_heads(o.astype(x.dtype)))

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """:meth:`SoftmaxAttention.init_cache` plus ``"log_forget" [B, L, H]`` and
    ``"total" [B, H]``, float32 zeros."""
    cache = super().init_cache(batch, max_len, dtype)
    cache["log_forget"] = jnp.zeros((batch, max_len, self.num_heads), jnp.float32)
    cache["total"] = jnp.zeros((batch, self.num_heads), jnp.float32)
    return cache

  def _decode_bias(self, x: Array, cache: dict, slot: Array) -> tuple[Array, dict]:
    # The same floor as the sequence op, so a hard reset decodes as it trains.
    total = cache["total"] + common_ops.floor_log_decay(self._log_fgate(x))
    log_forget = lax.dynamic_update_index_in_dim(cache["log_forget"], total, slot, 1)
    bias = softmax_ops.forgetting_step_bias(total, log_forget)
    return bias, {"total": total, "log_forget": log_forget}


class LocalAttention(SoftmaxAttention):
  """Causal sliding-window attention (Griffin's local attention; Mistral's window).

  Query ``i`` sees keys ``i - window + 1 .. i``. Decoding keeps a rolling cache
  of ``min(window, max_len)`` tokens (slot ``t % window``), so memory stays
  ``O(window)`` however long the generation. ``num_kv_heads=1`` gives Griffin's
  multi-query attention. With the sequence sharded each device gets the ``window - 1``
  keys and values before its slice from the previous one (the window must fit in a slice).
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, window: int = 64,
               num_kv_heads: int | None = None, head_dim: int | None = None,
               causal: bool = True, use_rope: bool = True, rope_base: float = 10000.0,
               rotary_dim: int | None = None, use_bias: bool = False,
               out_bias: bool | None = None, block_size: int | None = None, rngs: nnx.Rngs,
               dtype=None, param_dtype=jnp.float32):
    super().__init__(d_model, num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                     causal=causal, use_rope=use_rope, rope_base=rope_base,
                     rotary_dim=rotary_dim, use_bias=use_bias, out_bias=out_bias, rngs=rngs,
                     dtype=dtype, param_dtype=param_dtype)
    if window < 1:
      raise ValueError(f"window must be >= 1, got {window}.")
    self.window = window
    self.block_size = block_size

  def _attend(self, q, k, v, segment_ids):
    return sparse_ops.sliding_window_attention(q, k, v, window=self.window, causal=self.causal,
                                               segment_ids=segment_ids,
                                               block_size=self.block_size, context=cp.context())

  def _cache_len(self, max_len: int) -> int:
    return min(self.window, max_len)

  def _cache_limit(self, max_len: int) -> int:
    # A rolling cache of the whole window decodes forever; a shorter one (max_len < window)
    # would silently narrow the window past max_len tokens.
    return max_len if max_len < self.window else np.iinfo(np.int32).max

  def _slot_and_visible(self, pos: Array, length: int):
    # Rolling cache: token t lives in slot t % length; every filled slot is in
    # the window because the cache holds at most `window` tokens.
    return pos % length, jnp.arange(length) < jnp.minimum(pos + 1, length)


class LongformerAttention(SoftmaxAttention):
  """Longformer attention: a sliding window plus the first ``num_global`` tokens as globals.

  Bidirectional by default (an encoder mixer, e.g. for classification with a
  CLS token at position 0); no decoding cache.
  """

  def __init__(self, d_model: int, num_heads: int, *, window: int = 64, num_global: int = 1,
               causal: bool = False, head_dim: int | None = None, use_rope: bool = True,
               block_size: int | None = None, rngs: nnx.Rngs, dtype=None,
               param_dtype=jnp.float32):
    super().__init__(d_model, num_heads, head_dim=head_dim, causal=causal, use_rope=use_rope,
                     rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.window, self.num_global, self.block_size = window, num_global, block_size

  def _attend(self, q, k, v, segment_ids):
    b, t = q.shape[:2]
    n = min(self.num_global, t)
    global_mask = jnp.broadcast_to(jnp.arange(t) < n, (b, t))
    return sparse_ops.longformer_attention(
        q, k, v, global_mask, window=self.window, causal=self.causal, max_globals=max(n, 1),
        segment_ids=segment_ids, block_size=self.block_size)

  def init_cache(self, batch, max_len, dtype=jnp.float32):
    """Not supported: Longformer is an encoder mixer here."""
    return mixer.Mixer.init_cache(self, batch, max_len, dtype)

  def decode_step(self, x, cache):
    """Not supported: Longformer is an encoder mixer here."""
    return mixer.Mixer.decode_step(self, x, cache)


class BigBirdAttention(SoftmaxAttention):
  """BigBird block-sparse attention (window + random + global blocks); encoder only.

  The random blocks are drawn from ``PRNGKey(seed)``: a fixed pattern per layer.
  The sequence must have at least ``num_global_blocks + num_window_blocks +
  num_random_blocks`` blocks of ``block_size`` tokens.
  """

  def __init__(self, d_model: int, num_heads: int, *, block_size: int = 16,
               num_window_blocks: int = 3, num_random_blocks: int = 2,
               num_global_blocks: int = 2, seed: int = 0, head_dim: int | None = None,
               use_rope: bool = True, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    super().__init__(d_model, num_heads, head_dim=head_dim, causal=False, use_rope=use_rope,
                     rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.block_size, self.seed = block_size, seed
    self.num_window_blocks, self.num_random_blocks = num_window_blocks, num_random_blocks
    self.num_global_blocks = num_global_blocks

  def _attend(self, q, k, v, segment_ids):
    return sparse_ops.bigbird_attention(
        q, k, v, block_size=self.block_size, key=jax.random.PRNGKey(self.seed),
        num_window_blocks=self.num_window_blocks, num_random_blocks=self.num_random_blocks,
        num_global_blocks=self.num_global_blocks, segment_ids=segment_ids)


class LinformerAttention(SoftmaxAttention):
  """Linformer: keys and values projected along the sequence to ``proj_len`` rows.

  ``E, F`` are ``[proj_len, max_len]`` parameters; a sequence of length ``T <=
  max_len`` uses their first ``T`` columns. Bidirectional only (the op cannot
  be causal) and no ``segment_ids``. With the sequence sharded the projections over
  ``T`` are matmuls that XLA's partitioner splits (each device projects its slice, one
  ``psum`` of the ``[proj_len, ...]`` results): nothing is gathered.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, max_len: int = 512, proj_len: int = 64,
               head_dim: int | None = None, use_rope: bool = False, rngs: nnx.Rngs,
               dtype=None, param_dtype=jnp.float32):
    super().__init__(d_model, num_heads, head_dim=head_dim, causal=False, use_rope=use_rope,
                     rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    self.max_len, self.proj_len = max_len, proj_len
    std = max_len**-0.5
    self.E = nnx.Param((std * jax.random.normal(rngs.params(), (proj_len, max_len))).astype(param_dtype))
    self.F = nnx.Param((std * jax.random.normal(rngs.params(), (proj_len, max_len))).astype(param_dtype))

  def _attend(self, q, k, v, segment_ids):
    t = q.shape[1]
    if t > self.max_len:
      raise ValueError(f"sequence length {t} exceeds the Linformer max_len={self.max_len}.")
    return lowrank_ops.linformer_attention(
        q, k, v, self.E[...][:, :t].astype(q.dtype), self.F[...][:, :t].astype(q.dtype),
        segment_ids=segment_ids)


class MultiHeadLatentAttention(mixer.Mixer):
  """Multi-head latent attention (MLA; DeepSeek-V2, Kimi Linear's attention layers).

  Keys and values come from a shared latent ``c = RMSNorm(x W_kv_a[:r])`` of ``r =
  kv_lora_rank`` channels: ``[k_nope | v] = c W_kv_b`` per head, and every head's key
  ends with the same ``k_rope = x W_kv_a[r:]`` (``qk_rope_head_dim`` channels, one for all
  heads). Queries are ``x W_q`` (or ``RMSNorm(x W_q_a) W_q_b`` with ``q_lora_rank``), split
  per head into ``[q_nope | q_rope]``. The logit scale is ``(qk_nope_head_dim +
  qk_rope_head_dim) ** -0.5``. With ``use_rope`` (DeepSeek) ``q_rope`` and ``k_rope`` are
  rotated (half-split layout); Kimi Linear uses none (NoPE), its default here.

  Decoding caches only the latent ``[B, L, r]`` and ``k_rope [B, L, dr]`` and attends in the
  latent space (``W_kv_b`` absorbed into the query and the output), which is MLA's point:
  the cache is ``r + dr`` numbers per token instead of ``H (dn + dr + dv)``.
  """

  context_parallel = True

  def __init__(self, d_model: int, num_heads: int, *, kv_lora_rank: int | None = None,
               q_lora_rank: int | None = None, qk_nope_head_dim: int | None = None,
               qk_rope_head_dim: int | None = None, v_head_dim: int | None = None,
               use_rope: bool = False, rope_base: float = 10000.0, latent_norm_eps: float = 1e-6,
               use_bias: bool = False, implementation: str | None = None, rngs: nnx.Rngs,
               dtype=None, param_dtype=jnp.float32):
    base = max(d_model // num_heads, 2)
    dn = base if qk_nope_head_dim is None else qk_nope_head_dim
    dr = max(2, base // 4 * 2) if qk_rope_head_dim is None else qk_rope_head_dim  # even
    dv = base if v_head_dim is None else v_head_dim
    r = max(d_model // 2, 1) if kv_lora_rank is None else kv_lora_rank
    for name, value in (("qk_nope_head_dim", dn), ("qk_rope_head_dim", dr), ("v_head_dim", dv),
                        ("kv_lora_rank", r)):
      mixer.check_positive(name, value)
    if q_lora_rank is not None:
      mixer.check_positive("q_lora_rank", q_lora_rank)
    if use_rope and dr % 2:
      raise ValueError(f"qk_rope_head_dim must be even for RoPE, got {dr}.")
    self.num_heads, self.kv_lora_rank, self.q_lora_rank = num_heads, r, q_lora_rank
    self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = dn, dr, dv
    self.use_rope, self.rope_base, self.implementation = use_rope, rope_base, implementation
    self.causal = True
    self.scale = (dn + dr) ** -0.5
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype)
    norm = lambda dim: norm_lib.RMSNorm(dim, eps=latent_norm_eps, param_dtype=param_dtype)
    if q_lora_rank is None:
      self.q_proj = modules.dense(d_model, num_heads * (dn + dr), **kw)
      self.q_a_proj = self.q_a_norm = self.q_b_proj = None
    else:
      self.q_proj = None
      self.q_a_proj = modules.dense(d_model, q_lora_rank, use_bias=use_bias, **kw)
      self.q_a_norm = norm(q_lora_rank)
      self.q_b_proj = modules.dense(q_lora_rank, num_heads * (dn + dr), **kw)
    self.kv_a_proj = modules.dense(d_model, r + dr, use_bias=use_bias, **kw)
    self.kv_a_norm = norm(r)
    self.kv_b_proj = modules.dense(r, num_heads * (dn + dv), **kw)
    self.o_proj = modules.dense(num_heads * dv, d_model, use_bias=use_bias, **kw)

  def _queries(self, x: Array, positions: Array) -> Array:
    """``[B, T, H, dn + dr]``, the rope part rotated when ``use_rope``."""
    q = self.q_proj(x) if self.q_proj is not None else self.q_b_proj(self.q_a_norm(self.q_a_proj(x)))
    q = modules.split_heads(q, self.num_heads)
    if self.use_rope:
      dn = self.qk_nope_head_dim
      q = jnp.concatenate([q[..., :dn], modules.rope(q[..., dn:], positions, self.rope_base)], -1)
    return q

  def _latent(self, x: Array, positions: Array) -> tuple[Array, Array]:
    """``(c [B, T, r], k_rope [B, T, dr])``: the normed latent and the shared rope key."""
    kv = self.kv_a_proj(x)
    c, k_rope = self.kv_a_norm(kv[..., :self.kv_lora_rank]), kv[..., self.kv_lora_rank:]
    if self.use_rope:
      k_rope = modules.rope(k_rope[..., None, :], positions, self.rope_base)[..., 0, :]
    return c, k_rope

  def __call__(self, x: Array, segment_ids: Array | None = None) -> Array:
    """``x [B, T, D]`` -> ``[B, T, D]``; ``segment_ids [B, T]`` packs sequences."""
    b, t, _ = x.shape
    positions = modules.positions_of(b, t, segment_ids)
    q = self._queries(x, positions)
    c, k_rope = self._latent(x, positions)
    kv = modules.split_heads(self.kv_b_proj(c), self.num_heads)  # [B, T, H, dn + dv]
    dn, h = self.qk_nope_head_dim, self.num_heads
    k_rope = jnp.broadcast_to(k_rope[:, :, None, :], (b, t, h, self.qk_rope_head_dim))
    k = jnp.concatenate([kv[..., :dn], k_rope.astype(kv.dtype)], axis=-1)
    o = softmax_ops.softmax_attention(q, k, kv[..., dn:], causal=True, scale=self.scale,
                                      segment_ids=segment_ids,
                                      implementation=self.implementation, context=cp.context())
    return self.o_proj(modules.merge_heads(o.astype(x.dtype)))

  def init_cache(self, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    """``{"latent": [B, L, r], "k_rope": [B, L, dr]`` in ``dtype``, ``"pos", "limit"`` int32,
    ``"overflow"`` bool``}`` (see :meth:`SoftmaxAttention.init_cache` for the limit)."""
    check_positive("batch", batch)
    check_positive("max_len", max_len)
    return {"latent": jnp.zeros((batch, max_len, self.kv_lora_rank), dtype),
            "k_rope": jnp.zeros((batch, max_len, self.qk_rope_head_dim), dtype),
            "pos": jnp.zeros((), jnp.int32), "limit": jnp.asarray(max_len, jnp.int32),
            "overflow": jnp.zeros((), bool)}

  def decode_step(self, x: Array, cache: dict) -> tuple[Array, dict]:
    """``x [B, D]`` -> ``(y [B, D], cache)``: attention over the cached latents, float32."""
    b = x.shape[0]
    pos, limit = cache["pos"], cache["limit"]
    if (not isinstance(pos, jax.core.Tracer) and not isinstance(limit, jax.core.Tracer)
        and int(pos) >= int(limit)):
      raise ValueError(f"decode_step at position {int(pos)}, but the cache was made by "
                       f"init_cache(max_len={int(limit)}); make it with a larger max_len.")
    positions = jnp.full((b, 1), pos, jnp.int32)
    q = self._queries(x[:, None], positions)[:, 0].astype(jnp.float32)  # [B, H, dn + dr]
    c, k_rope = self._latent(x[:, None], positions)
    slot = jnp.minimum(pos, cache["latent"].shape[1] - 1)
    latent = lax.dynamic_update_slice_in_dim(cache["latent"], c.astype(cache["latent"].dtype),
                                             slot, 1)
    rope_keys = lax.dynamic_update_slice_in_dim(cache["k_rope"],
                                                k_rope.astype(cache["k_rope"].dtype), slot, 1)
    dn, f32 = self.qk_nope_head_dim, jnp.float32
    w = self.kv_b_proj.kernel[...].astype(f32).reshape(self.kv_lora_rank, self.num_heads, -1)
    q_latent = jnp.einsum("bhn,rhn->bhr", q[..., :dn], w[..., :dn])
    s = (jnp.einsum("bhr,blr->bhl", q_latent, latent.astype(f32))
         + jnp.einsum("bhd,bld->bhl", q[..., dn:], rope_keys.astype(f32))) * self.scale
    visible = jnp.arange(latent.shape[1]) <= pos
    p = jax.nn.softmax(jnp.where(visible, s, softmax_ops.MASK_VALUE), axis=-1)
    o = jnp.einsum("bhr,rhv->bhv", jnp.einsum("bhl,blr->bhr", p, latent.astype(f32)), w[..., dn:])
    y = self.o_proj(modules.merge_heads(o.astype(x.dtype)))
    return y, {"latent": latent, "k_rope": rope_keys, "pos": pos + 1, "limit": limit,
               "overflow": cache["overflow"] | (pos >= limit)}
