"""Exact softmax attention as Pallas kernels: FlashAttention-2 for GPU and TPU.

The plain-JAX twin is ``ops.softmax_attention`` (``naive`` and ``blockwise``)
and ``ops.sliding_window_attention``; this module computes the same function:

    o_i = sum_j softmax_j(scale * q_i . k_j) v_j     over the keys j visible to i,

where ``j`` is visible to ``i`` when both are in one segment, ``j <= i`` if
``causal``, and ``i - j < window`` (causal) or ``|i - j| < window`` (not causal)
if ``window`` is set.

Algorithm (FlashAttention-2, Dao 2023):

* forward: one program per query block keeps a running maximum ``m``, a
  running normaliser ``l`` and an unnormalised float32 output over the key
  blocks it can see, and writes ``o`` and the log-sum-exp ``lse``;
* backward: ``delta_i = do_i . o_i`` (minus the ``lse`` cotangent) in XLA,
  then one kernel per key block accumulating ``dk, dv`` over query blocks and
  one per query block accumulating ``dq`` over key blocks, both recomputing
  the probabilities from the saved ``lse``. Nothing ``T x T`` is stored.

Key blocks that no query of a block can see (above the diagonal when causal,
outside the band when windowed) are skipped; blocks that every query of a
block fully sees are computed without building a mask. Logits are handled in
base 2 (``exp2``, with ``log2(e)`` folded into the scale), as Triton's own
attention kernels do.

Layout of this package: ``__init__`` (this file: the API, padding and the
``custom_vjp``), ``blocks.py`` (tiling, static config and the block logic:
``visible``, ``softmax_step``, ``finalize``, ``bwd_probs``, ``bwd_dscores``
and the block ranges) and two thin entry points that share it:

* ``triton.py``, ``platform="gpu"``: ``pallas_call`` lowered through Triton (a Triton
  ``CompilerParams`` is always passed: without compiler params jax 0.10.2
  lowers GPU ``pallas_call`` through Mosaic GPU instead). Layout
  ``[B, T, H, D]`` as given; the program for a query block holds the whole key
  sequence of its head as a ref and loops over key blocks with ``fori_loop``.
  Block sizes are powers of two >= 16 and head dims are zero-padded to one.
* ``mosaic_tpu.py``, ``platform="tpu"``: ``pallas_call`` for Mosaic. Layout ``[B, H, T, D]``
  (transposed inside, so blocks obey the ``(8, 128)`` tiling), the key block
  is the innermost ("arbitrary") grid axis with VMEM scratch accumulators, and
  the index maps clamp skipped blocks onto visited ones so they cost no DMA.

Any ``T`` works: the sequence is padded to a multiple of the block sizes and
the padding is masked (padded keys are never visible; padded queries are
sliced off and get a zero cotangent). GQA: ``k, v`` may have fewer heads than
``q`` (``H % H_kv == 0``; query head ``h`` reads key head ``h // (H // H_kv)``).

Notation: B batch, T sequence, H query heads, H_kv key/value heads, K key dim,
V value dim.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from linear_attention.engines import dispatch
from linear_attention.engines.softmax.pallas import mosaic_tpu, triton
from linear_attention.engines.softmax.pallas.blocks import (
    PAD_KEY_SEG,
    PAD_QUERY_SEG,
    FlashBlockSizes,
    KernelConfig,
)
from linear_attention import common

Array = jax.Array

# ---------------------------------------------------------------------------
# custom_vjp over the padded, backend-native layout.


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(cfg: KernelConfig, q, k, v, q_seg, k_seg):
  fwd = dispatch.lowering(cfg.platform, triton=triton, mosaic_tpu=mosaic_tpu).forward
  return tuple(fwd(cfg, q, k, v, q_seg, k_seg))


def _attention_fwd(cfg: KernelConfig, q, k, v, q_seg, k_seg):
  o, lse = _attention(cfg, q, k, v, q_seg, k_seg)
  return (o, lse), (q, k, v, q_seg, k_seg, o, lse)


def _attention_bwd(cfg: KernelConfig, res, cotangents):
  q, k, v, q_seg, k_seg, o, lse = res
  do, dlse = cotangents
  do = do.astype(q.dtype)
  # d lse_i / d s_ij = p_ij, so an lse cotangent only shifts the row term delta.
  delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)
  if cfg.platform == "gpu":
    delta = jnp.swapaxes(delta, 1, 2) - dlse  # [B, H, Tp]
  else:
    delta = delta[..., None] - dlse  # [B, H, Tp, 1]
  g = cfg.groups
  kv_dtype = k.dtype if g == 1 else jnp.float32
  bwd = dispatch.lowering(cfg.platform, triton=triton, mosaic_tpu=mosaic_tpu).backward
  dq, dk, dv = bwd(cfg, q, k, v, q_seg, k_seg, do, lse, delta, kv_dtype)
  if g > 1:
    # Per-query-head gradients summed over each key head's group.
    head = 2 if cfg.platform == "gpu" else 1
    fold = lambda x: x.reshape(x.shape[:head] + (x.shape[head] // g, g) + x.shape[head + 1:])
    dk = fold(dk).sum(head + 1).astype(k.dtype)
    dv = fold(dv).sum(head + 1).astype(v.dtype)
  return dq, dk, dv, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


# ---------------------------------------------------------------------------
# Public API.


def unsupported_arguments(q: Array) -> dict[str, str]:
  """``{argument: why}`` for the arguments the kernel cannot take (empty: all fine)."""
  return dispatch.unsupported_dtypes(q=q)


def _check_inputs(q, k, v, segment_ids, window):
  for name, x in (("q", q), ("k", k), ("v", v)):
    common.check_rank(name, x, 4)
    common.check_float(name, x)
  common.check_same_dtype(q=q, k=k, v=v)
  if jnp.dtype(q.dtype) not in dispatch.SUPPORTED_DTYPES:
    raise ValueError(
        f"q must be float32, bfloat16 or float16 for the Pallas kernel, got dtype {q.dtype}."
    )
  b, t, h, dk = q.shape
  common.check_shape("k", k, (b, t, None, dk), "batch, seq and key dim of q")
  hkv = k.shape[2]
  if h % hkv:
    raise ValueError(
        f"k must have a number of heads dividing q's {h} (grouped-query attention), got {hkv}."
    )
  common.check_shape("v", v, (b, t, hkv, None), "batch, seq and heads of k")
  common.check_segment_ids(segment_ids, b, t)
  if window is not None:
    common.check_positive_int("window", window)
  return b, t, h, hkv, dk, v.shape[-1]



def flash_attention(
    q: Array,
    k: Array,
    v: Array,
    *,
    causal: bool = False,
    scale: float | None = None,
    segment_ids: Array | None = None,
    window: int | None = None,
    block_sizes: FlashBlockSizes | None = None,
    platform: str | None = None,
    interpret: Any = None,
    return_lse: bool = False,
):
  """Exact softmax attention with the FlashAttention-2 Pallas kernels.

  Args:
    q: ``[B, T, H, K]`` queries (float32, bfloat16 or float16).
    k: ``[B, T, H_kv, K]`` keys, ``H % H_kv == 0`` (GQA when ``H_kv < H``).
    v: ``[B, T, H_kv, V]`` values.
    causal: query ``i`` sees keys ``j <= i`` only.
    scale: logit scale; ``None`` means ``K ** -0.5``.
    segment_ids: optional ``[B, T]`` ints packing sequences in a row; a query
      sees only keys of its own segment (a maximal run of equal ids).
    window: optional int >= 1: causal, keys ``i - window < j <= i``; not
      causal, ``|i - j| < window``. Key blocks outside the band are skipped.
    block_sizes: :class:`FlashBlockSizes`; ``None``:
      ``FlashBlockSizes.default(platform, q.dtype, K, V)`` (tiles that follow the head
      size, so that a head of up to 256 compiles for H200, A100, v5e and v6e).
    platform: ``"gpu"`` (Triton) or ``"tpu"`` (Mosaic); ``None``: the platform
      of the device the call compiles for (the ``jax.default_device`` when set,
      a compile-only device from ``jax.experimental.topologies`` included, else
      the default backend), ``"gpu"`` on a CPU.
    interpret: ``None``: native when compiling for ``platform``, else interpret
      mode (``True`` for GPU, ``pltpu.InterpretParams()`` for TPU); ``False``:
      always compile the kernel for ``platform``, with or without such a device
      on this host (a deviceless AOT compile); or either interpret mode.
    return_lse: also return the float32 log-sum-exp ``[B, T, H]`` (natural
      log; differentiable).

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q`` (or ``(o, lse)``).
    Statistics and accumulation are float32.
  """
  _, t, h, hkv, dk, _ = _check_inputs(q, k, v, segment_ids, window)
  if block_sizes is None:
    block_sizes = FlashBlockSizes.default(
        dispatch.default_platform() if platform is None else platform, q.dtype, dk, v.shape[-1])
  platform, blocks, interpret = dispatch.resolve_launch(
      "flash_attention", unsupported_arguments(q), platform, block_sizes, FlashBlockSizes,
      interpret)
  blocks = blocks.capped(platform, interpret, t)
  scale = common.resolve_scale(scale, dk)
  return _flash(q, k, v, segment_ids, causal=bool(causal), scale=float(scale), window=window,
                blocks=blocks, platform=platform, interpret=interpret,
                groups=h // hkv, return_lse=bool(return_lse))


@functools.partial(jax.jit, static_argnames=("causal", "scale", "window", "blocks", "platform",
                                             "interpret", "groups", "return_lse"))
def _flash(q, k, v, segment_ids, *, causal, scale, window, blocks, platform, interpret, groups,
           return_lse):
  b, t, h, dk = q.shape
  dv = v.shape[-1]
  multiple = max(dataclasses.astuple(blocks)[:6])
  tp = t + (-t % multiple)
  cfg = KernelConfig(platform=platform, causal=causal, window=window, scale=scale, seq_len=t,
                     padded_len=tp, groups=groups, segments=segment_ids is not None,
                     blocks=blocks, interpret=interpret)
  q_seg = k_seg = None
  if segment_ids is not None:
    seg = common.segment_index(segment_ids)
    q_seg = common.pad_axis(seg, multiple, value=PAD_QUERY_SEG)
    k_seg = common.pad_axis(seg, multiple, value=PAD_KEY_SEG)
  q, k, v = (common.pad_axis(x, multiple) for x in (q, k, v))
  if platform == "gpu":
    q, k = (common.pad_axis(x, dispatch.flash_head_dim(platform, dk), axis=3) for x in (q, k))
    v = common.pad_axis(v, dispatch.flash_head_dim(platform, dv), axis=3)
    o, lse = _attention(cfg, q, k, v, q_seg, k_seg)
    o, lse = o[:, :t, :, :dv], jnp.swapaxes(lse, 1, 2)[:, :t]
  else:
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
    if segment_ids is not None:
      q_seg, k_seg = q_seg[:, :, None], k_seg[:, None, :]
    o, lse = _attention(cfg, q, k, v, q_seg, k_seg)
    o, lse = jnp.swapaxes(o, 1, 2)[:, :t], jnp.swapaxes(lse[..., 0], 1, 2)[:, :t]
  return (o, lse) if return_lse else o
