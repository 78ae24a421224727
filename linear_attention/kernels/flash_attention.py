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

Two thin entry points share that block logic (``_visible``, ``_softmax_step``,
``_finalize``, ``_bwd_probs``, ``_bwd_dscores`` and the block ranges):

* ``backend="gpu"``: ``pallas_call`` lowered through Triton (a Triton
  ``CompilerParams`` is always passed: without compiler params jax 0.10.2
  lowers GPU ``pallas_call`` through Mosaic GPU instead). Layout
  ``[B, T, H, D]`` as given; the program for a query block holds the whole key
  sequence of its head as a ref and loops over key blocks with ``fori_loop``.
  Block sizes are powers of two >= 16 and head dims are zero-padded to one.
* ``backend="tpu"``: ``pallas_call`` for Mosaic. Layout ``[B, H, T, D]``
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
import math
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from linear_attention.ops import common

Array = jax.Array

BACKENDS = ("gpu", "tpu")
SUPPORTED_DTYPES = (jnp.dtype(jnp.float32), jnp.dtype(jnp.bfloat16), jnp.dtype(jnp.float16))
# Same finite mask logit as ops/softmax.py: max/exp never see inf - inf.
MASK_VALUE = -1e30
# Segment ids of padding: padded keys match no query, padded queries no key.
_PAD_KEY_SEG = -1
_PAD_QUERY_SEG = -2
_LOG2E = math.log2(math.e)
_LN2 = math.log(2.0)
# Smallest block per backend: Triton's dot needs 16; TPU tiles are (8, 128)
# (a key block is the lane dimension of the logits, so it needs 128 natively).
_MIN_BLOCK = {"gpu": (16, 16), "tpu": (8, 128)}  # (query-side, key-side)
_MIN_BLOCK_TPU_INTERPRET = (8, 8)


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes of the three kernels (powers of two; capped at the padded ``T``).

  Attributes:
    block_q, block_k: query / key block of the forward kernel.
    block_q_dkv, block_k_dkv: of the ``dk, dv`` kernel (one program per key block).
    block_q_dq, block_k_dq: of the ``dq`` kernel (one program per query block).
    num_warps, num_stages: GPU only, passed to ``pallas.triton.CompilerParams``
      (``None``: Triton's defaults).
  """

  block_q: int = 128
  block_k: int = 64
  block_q_dkv: int = 64
  block_k_dkv: int = 64
  block_q_dq: int = 64
  block_k_dq: int = 64
  num_warps: int | None = None
  num_stages: int | None = None

  @classmethod
  def default(cls, backend: str) -> BlockSizes:
    """Defaults per backend: GPU as above; TPU 128 everywhere (one (8, 128)-aligned tile)."""
    if backend == "tpu":
      return cls(128, 128, 128, 128, 128, 128)
    return cls()

  def query_side(self) -> tuple[str, ...]:
    return ("block_q", "block_q_dkv", "block_q_dq")

  def key_side(self) -> tuple[str, ...]:
    return ("block_k", "block_k_dkv", "block_k_dq")


@dataclasses.dataclass(frozen=True)
class _Config:
  """Everything static about one call (hashable: the custom_vjp's nondiff arg)."""

  backend: str
  causal: bool
  window: int | None
  scale: float
  seq_len: int  # true T
  padded_len: int  # T rounded up to every block size
  groups: int  # H // H_kv
  segments: bool
  blocks: BlockSizes
  interpret: Any

  @property
  def padded(self) -> bool:
    return self.padded_len != self.seq_len


# ---------------------------------------------------------------------------
# Shared block logic (pure functions of values; used inside both kernels).


def _div(a, b: int):
  """Integer division of a non-negative traced (or Python) int by a static int."""
  if isinstance(a, int):
    return a // b
  return lax.div(a, jnp.int32(b))


def _clip(x, lo, hi):
  return jnp.minimum(jnp.maximum(x, lo), hi)


def _key_blocks(cfg: _Config, i, bq: int, bk: int, nk: int):
  """Key blocks of query block ``i``: ``(lo, full_lo, full_hi, hi)``.

  ``[lo, hi)`` holds every key block with a visible pair; inside it,
  ``[full_lo, full_hi)`` are blocks whose pairs are all visible (no mask
  needed). With segments every visited block is masked.
  """
  q0 = i * bq
  q1 = q0 + (bq - 1)
  w = cfg.window
  lo = 0 if w is None else _div(jnp.maximum(q0 - w + 1, 0), bk)
  if cfg.causal:
    hi = jnp.minimum(_div(q1, bk) + 1, nk)
  elif w is not None:
    hi = jnp.minimum(_div(q1 + w - 1, bk) + 1, nk)
  else:
    hi = nk
  if cfg.segments:
    return lo, hi, hi, hi
  full_lo = lo if w is None else _div(jnp.maximum(q1 - w + bk, 0), bk)
  if cfg.causal:
    full_hi = _div(q0 + 1, bk)
  elif w is not None:
    full_hi = _div(q0 + w, bk)
  else:
    full_hi = nk
  if cfg.padded and not cfg.causal:
    # The last key blocks hold padding (causal masks it: it lies after every real query).
    full_hi = jnp.minimum(full_hi, cfg.seq_len // bk)
  full_lo = _clip(full_lo, lo, hi)
  full_hi = _clip(full_hi, full_lo, hi)
  return lo, full_lo, full_hi, hi


def _query_blocks(cfg: _Config, j, bq: int, bk: int, nq: int):
  """Query blocks that see key block ``j``: ``(lo, full_lo, full_hi, hi)`` as in ``_key_blocks``.

  Padding needs no mask here: a padded key's ``dk, dv`` rows are sliced off,
  and a padded query's ``ds`` row is zero (its ``do`` and ``delta`` are zero).
  """
  k0 = j * bk
  k1 = k0 + (bk - 1)
  w = cfg.window
  if cfg.causal:
    lo = _div(k0, bq)
  elif w is not None:
    lo = _div(jnp.maximum(k0 - w + 1, 0), bq)
  else:
    lo = 0
  hi = nq if w is None else jnp.minimum(_div(k1 + w - 1, bq) + 1, nq)
  if cfg.segments:
    return lo, hi, hi, hi
  if cfg.causal:
    full_lo = _div(k1 + bq - 1, bq)
  elif w is not None:
    full_lo = _div(jnp.maximum(k1 - w + bq, 0), bq)
  else:
    full_lo = lo
  full_hi = nq if w is None else _div(k0 + w, bq)
  full_lo = _clip(full_lo, lo, hi)
  full_hi = _clip(full_hi, full_lo, hi)
  return lo, full_lo, full_hi, hi


def _visible(cfg: _Config, q_pos, k_pos, q_seg, k_seg):
  """Bool mask broadcast from ``q_pos [bq, 1|bk]`` and ``k_pos [1|bq, bk]``."""
  ok = None

  def conj(a, b):
    return b if a is None else a & b

  d = q_pos - k_pos
  if cfg.causal:
    ok = conj(ok, d >= 0)
  if cfg.window is not None:
    ok = conj(ok, d < cfg.window)
    if not cfg.causal:
      ok = conj(ok, d > -cfg.window)
  if cfg.padded and not cfg.causal:
    ok = conj(ok, k_pos < cfg.seq_len)
  if q_seg is not None:
    ok = conj(ok, q_seg == k_seg)
  if ok is None:  # plain non-causal attention: masked blocks only hold padding
    ok = k_pos < cfg.seq_len
  return jnp.broadcast_to(ok, jnp.broadcast_shapes(q_pos.shape, k_pos.shape))


def _dot_nt(a, b):
  """``a [m, d] @ b[n, d].T`` accumulated in float32."""
  return lax.dot_general(a, b, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _dot_tn(a, b):
  """``a[m, n].T @ b[m, d]`` accumulated in float32."""
  return lax.dot(a.T, b, preferred_element_type=jnp.float32)


def _dot(a, b):
  return lax.dot(a, b, preferred_element_type=jnp.float32)


def _softmax_step(q, k, v, carry, ok, qk_scale: float):
  """One key block of the online softmax; ``carry = (m [bq,1], l [bq,1], acc [bq,V])``."""
  m, l, acc = carry
  s = _dot_nt(q, k) * qk_scale  # base-2 logits
  if ok is not None:
    s = jnp.where(ok, s, MASK_VALUE)
  m_new = jnp.maximum(m, jnp.max(s, axis=1, keepdims=True))
  p = jnp.exp2(s - m_new)
  if ok is not None:
    # A row with nothing visible yet has m_new == MASK_VALUE, where exp2(0) = 1.
    p = jnp.where(ok, p, 0.0)
  corr = jnp.exp2(m - m_new)
  l = l * corr + jnp.sum(p, axis=1, keepdims=True)
  acc = acc * corr + _dot(p.astype(v.dtype), v)
  return m_new, l, acc


def _init_carry(bq: int, dv: int):
  return (jnp.full((bq, 1), MASK_VALUE, jnp.float32), jnp.zeros((bq, 1), jnp.float32),
          jnp.zeros((bq, dv), jnp.float32))


def _finalize(m, l, acc):
  """``o [bq, V]`` float32 and the natural-log ``lse [bq, 1]`` (MASK_VALUE if nothing seen)."""
  seen = l > 0
  l_safe = jnp.where(seen, l, 1.0)
  o = acc * (1.0 / l_safe)
  lse = jnp.where(seen, (m + jnp.log2(l_safe)) * _LN2, MASK_VALUE)
  return o, lse


def _bwd_probs(q, k, lse2, ok, qk_scale: float):
  """Probabilities ``[bq, bk]`` recomputed from the base-2 log-sum-exp ``lse2 [bq, 1]``."""
  p = jnp.exp2(_dot_nt(q, k) * qk_scale - lse2)
  return p if ok is None else jnp.where(ok, p, 0.0)


def _bwd_dscores(p, do, v, delta):
  """Gradient of the (scaled) logits: ``p * (do . v - delta)``."""
  return p * (_dot_nt(do, v) - delta)


# ---------------------------------------------------------------------------
# GPU entry point (Triton). Layout [B, T, H, D]; grid (blocks, B, H).


def _gpu_params(cfg: _Config):
  # Triton's CompilerParams selects the Triton lowering: without compiler params,
  # jax 0.10.2 lowers a GPU pallas_call through Mosaic GPU (jax_pallas_use_mosaic_gpu
  # defaults to True), which this kernel is not written for.
  from jax.experimental.pallas import triton as pl_triton  # pylint: disable=g-import-not-at-top
  b = cfg.blocks
  kw = {k: v for k, v in (("num_warps", b.num_warps), ("num_stages", b.num_stages))
        if v is not None}
  return {"compiler_params": pl_triton.CompilerParams(**kw)}


def _gpu_loops(lo, full_lo, full_hi, hi, body, carry):
  """Masked blocks, then unmasked ones, then masked ones again."""
  carry = lax.fori_loop(lo, full_lo, functools.partial(body, True), carry)
  carry = lax.fori_loop(full_lo, full_hi, functools.partial(body, False), carry)
  return lax.fori_loop(full_hi, hi, functools.partial(body, True), carry)


def _gpu_fwd_kernel(q_ref, k_ref, v_ref, *refs, cfg: _Config, bq: int, bk: int):
  if cfg.segments:
    qs_ref, ks_ref, o_ref, lse_ref = refs
  else:
    o_ref, lse_ref = refs
  i = pl.program_id(0)
  nk = k_ref.shape[0] // bk
  q = q_ref[...]
  q_pos = i * bq + jnp.arange(bq, dtype=jnp.int32)[:, None]
  q_seg = qs_ref[...][:, None] if cfg.segments else None
  qk_scale = cfg.scale * _LOG2E

  def body(masked, j, carry):
    sl = pl.ds(j * bk, bk)
    ok = None
    if masked:
      k_pos = j * bk + jnp.arange(bk, dtype=jnp.int32)[None, :]
      k_seg = ks_ref[sl][None, :] if cfg.segments else None
      ok = _visible(cfg, q_pos, k_pos, q_seg, k_seg)
    return _softmax_step(q, k_ref[sl, :], v_ref[sl, :], carry, ok, qk_scale)

  carry = _gpu_loops(*_key_blocks(cfg, i, bq, bk, nk), body, _init_carry(bq, v_ref.shape[-1]))
  o, lse = _finalize(*carry)
  o_ref[...] = o.astype(o_ref.dtype)
  lse_ref[...] = lse[:, 0]


def _gpu_forward(cfg: _Config, q, k, v, q_seg, k_seg):
  """``q [B,Tp,H,K]``, ``k [B,Tp,Hkv,K]``, ``v [B,Tp,Hkv,V]`` -> ``o [B,Tp,H,V]``, ``lse [B,H,Tp]``."""
  b, tp, h, dk = q.shape
  dv = v.shape[-1]
  bq, bk, g = cfg.blocks.block_q, cfg.blocks.block_k, cfg.groups
  in_specs = [
      pl.BlockSpec((None, bq, None, dk), lambda i, bi, hi: (bi, i, hi, 0)),
      pl.BlockSpec((None, tp, None, dk), lambda i, bi, hi: (bi, 0, _div(hi, g), 0)),
      pl.BlockSpec((None, tp, None, dv), lambda i, bi, hi: (bi, 0, _div(hi, g), 0)),
  ]
  args = [q, k, v]
  if cfg.segments:
    in_specs += [pl.BlockSpec((None, bq), lambda i, bi, hi: (bi, i)),
                 pl.BlockSpec((None, tp), lambda i, bi, hi: (bi, 0))]
    args += [q_seg, k_seg]
  return pl.pallas_call(
      functools.partial(_gpu_fwd_kernel, cfg=cfg, bq=bq, bk=bk),
      grid=(tp // bq, b, h),
      in_specs=in_specs,
      out_specs=[pl.BlockSpec((None, bq, None, dv), lambda i, bi, hi: (bi, i, hi, 0)),
                 pl.BlockSpec((None, None, bq), lambda i, bi, hi: (bi, hi, i))],
      out_shape=[jax.ShapeDtypeStruct((b, tp, h, dv), q.dtype),
                 jax.ShapeDtypeStruct((b, h, tp), jnp.float32)],
      interpret=cfg.interpret,
      name="flash_attention_fwd",
      **_gpu_params(cfg),
  )(*args)


def _gpu_dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, cfg: _Config,
                   bq: int, bk: int):
  if cfg.segments:
    qs_ref, ks_ref, dq_ref = refs
  else:
    (dq_ref,) = refs
  i = pl.program_id(0)
  nk = k_ref.shape[0] // bk
  q, do = q_ref[...], do_ref[...]
  lse2 = lse_ref[...][:, None] * _LOG2E
  delta = delta_ref[...][:, None]
  q_pos = i * bq + jnp.arange(bq, dtype=jnp.int32)[:, None]
  q_seg = qs_ref[...][:, None] if cfg.segments else None
  qk_scale = cfg.scale * _LOG2E

  def body(masked, j, dq):
    sl = pl.ds(j * bk, bk)
    k = k_ref[sl, :]
    ok = None
    if masked:
      k_pos = j * bk + jnp.arange(bk, dtype=jnp.int32)[None, :]
      k_seg = ks_ref[sl][None, :] if cfg.segments else None
      ok = _visible(cfg, q_pos, k_pos, q_seg, k_seg)
    p = _bwd_probs(q, k, lse2, ok, qk_scale)
    ds = _bwd_dscores(p, do, v_ref[sl, :], delta)
    return dq + _dot(ds.astype(k.dtype), k)

  dq = _gpu_loops(*_key_blocks(cfg, i, bq, bk, nk), body,
                  jnp.zeros((bq, q_ref.shape[-1]), jnp.float32))
  dq_ref[...] = (dq * cfg.scale).astype(dq_ref.dtype)


def _gpu_dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, cfg: _Config,
                    bq: int, bk: int):
  if cfg.segments:
    qs_ref, ks_ref, dk_ref, dv_ref = refs
  else:
    dk_ref, dv_ref = refs
  j = pl.program_id(0)
  nq = q_ref.shape[0] // bq
  k, v = k_ref[...], v_ref[...]
  k_pos = j * bk + jnp.arange(bk, dtype=jnp.int32)[None, :]
  k_seg = ks_ref[...][None, :] if cfg.segments else None
  qk_scale = cfg.scale * _LOG2E

  def body(masked, i, carry):
    dk, dv = carry
    sl = pl.ds(i * bq, bq)
    q, do = q_ref[sl, :], do_ref[sl, :]
    ok = None
    if masked:
      q_pos = i * bq + jnp.arange(bq, dtype=jnp.int32)[:, None]
      q_seg = qs_ref[sl][:, None] if cfg.segments else None
      ok = _visible(cfg, q_pos, k_pos, q_seg, k_seg)
    p = _bwd_probs(q, k, lse_ref[sl][:, None] * _LOG2E, ok, qk_scale)
    ds = _bwd_dscores(p, do, v, delta_ref[sl][:, None])
    return dk + _dot_tn(ds.astype(q.dtype), q), dv + _dot_tn(p.astype(do.dtype), do)

  init = (jnp.zeros((bk, k.shape[-1]), jnp.float32), jnp.zeros((bk, v.shape[-1]), jnp.float32))
  dk, dv = _gpu_loops(*_query_blocks(cfg, j, bq, bk, nq), body, init)
  dk_ref[...] = (dk * cfg.scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def _gpu_backward(cfg: _Config, q, k, v, q_seg, k_seg, do, lse, delta, kv_dtype):
  """Per-query-head ``dq [B,Tp,H,K]``, ``dk [B,Tp,H,K]``, ``dv [B,Tp,H,V]``."""
  b, tp, h, dk_ = q.shape
  dv_ = v.shape[-1]
  g = cfg.groups
  bl = cfg.blocks
  seg_args = [q_seg, k_seg] if cfg.segments else []

  bq, bk = bl.block_q_dq, bl.block_k_dq
  blk = lambda d: pl.BlockSpec((None, bq, None, d), lambda i, bi, hi: (bi, i, hi, 0))
  full_kv = lambda d: pl.BlockSpec((None, tp, None, d), lambda i, bi, hi: (bi, 0, _div(hi, g), 0))
  row = pl.BlockSpec((None, None, bq), lambda i, bi, hi: (bi, hi, i))
  seg_specs = ([pl.BlockSpec((None, bq), lambda i, bi, hi: (bi, i)),
                pl.BlockSpec((None, tp), lambda i, bi, hi: (bi, 0))] if cfg.segments else [])
  dq = pl.pallas_call(
      functools.partial(_gpu_dq_kernel, cfg=cfg, bq=bq, bk=bk),
      grid=(tp // bq, b, h),
      in_specs=[blk(dk_), full_kv(dk_), full_kv(dv_), blk(dv_), row, row] + seg_specs,
      out_specs=blk(dk_),
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      interpret=cfg.interpret,
      name="flash_attention_dq",
      **_gpu_params(cfg),
  )(q, k, v, do, lse, delta, *seg_args)

  bq, bk = bl.block_q_dkv, bl.block_k_dkv
  full_q = lambda d: pl.BlockSpec((None, tp, None, d), lambda j, bi, hi: (bi, 0, hi, 0))
  kv_blk = lambda d: pl.BlockSpec((None, bk, None, d), lambda j, bi, hi: (bi, j, _div(hi, g), 0))
  out_blk = lambda d: pl.BlockSpec((None, bk, None, d), lambda j, bi, hi: (bi, j, hi, 0))
  row = pl.BlockSpec((None, None, tp), lambda j, bi, hi: (bi, hi, 0))
  seg_specs = ([pl.BlockSpec((None, tp), lambda j, bi, hi: (bi, 0)),
                pl.BlockSpec((None, bk), lambda j, bi, hi: (bi, j))] if cfg.segments else [])
  dk, dv = pl.pallas_call(
      functools.partial(_gpu_dkv_kernel, cfg=cfg, bq=bq, bk=bk),
      grid=(tp // bk, b, h),
      in_specs=[full_q(dk_), kv_blk(dk_), kv_blk(dv_), full_q(dv_), row, row] + seg_specs,
      out_specs=[out_blk(dk_), out_blk(dv_)],
      out_shape=[jax.ShapeDtypeStruct((b, tp, h, dk_), kv_dtype),
                 jax.ShapeDtypeStruct((b, tp, h, dv_), kv_dtype)],
      interpret=cfg.interpret,
      name="flash_attention_dkv",
      **_gpu_params(cfg),
  )(q, k, v, do, lse, delta, *seg_args)
  return dq, dk, dv


# ---------------------------------------------------------------------------
# TPU entry point (Mosaic). Layout [B, H, T, D]; grid (B, H, blocks, inner blocks).

_TPU_SEMANTICS = ("parallel", "parallel", "parallel", "arbitrary")


def _tpu_params():
  return pltpu.CompilerParams(dimension_semantics=_TPU_SEMANTICS)


def _tpu_positions(i, j, bq: int, bk: int):
  q_pos = i * bq + lax.broadcasted_iota(jnp.int32, (bq, bk), 0)
  k_pos = j * bk + lax.broadcasted_iota(jnp.int32, (bq, bk), 1)
  return q_pos, k_pos


def _tpu_dispatch(lo, full_lo, full_hi, hi, x, fn):
  """Runs ``fn(masked)`` when step ``x`` is a visited block (unmasked inside the full range)."""
  full = (x >= full_lo) & (x < full_hi)
  live = (x >= lo) & (x < hi)
  pl.when(full)(functools.partial(fn, False))
  pl.when(live & jnp.logical_not(full))(functools.partial(fn, True))


def _tpu_fwd_kernel(q_ref, k_ref, v_ref, *refs, cfg: _Config, bq: int, bk: int, nk: int):
  if cfg.segments:
    qs_ref, ks_ref, o_ref, lse_ref, m_sc, l_sc, acc_sc = refs
  else:
    o_ref, lse_ref, m_sc, l_sc, acc_sc = refs
  i, j = pl.program_id(2), pl.program_id(3)

  @pl.when(j == 0)
  def _init():
    m_sc[...], l_sc[...], acc_sc[...] = _init_carry(bq, acc_sc.shape[-1])

  def update(masked):
    ok = None
    if masked:
      q_pos, k_pos = _tpu_positions(i, j, bq, bk)
      segs = (qs_ref[...], ks_ref[...]) if cfg.segments else (None, None)
      ok = _visible(cfg, q_pos, k_pos, *segs)
    carry = (m_sc[...], l_sc[...], acc_sc[...])
    m_sc[...], l_sc[...], acc_sc[...] = _softmax_step(q_ref[...], k_ref[...], v_ref[...], carry,
                                                      ok, cfg.scale * _LOG2E)

  _tpu_dispatch(*_key_blocks(cfg, i, bq, bk, nk), j, update)

  @pl.when(j == nk - 1)
  def _store():
    o, lse = _finalize(m_sc[...], l_sc[...], acc_sc[...])
    o_ref[...] = o.astype(o_ref.dtype)
    lse_ref[...] = lse


def _tpu_clamped(cfg, ranges, bq, bk, n):
  """Index of the block visited at step ``x``: skipped steps repeat a visited block (no DMA)."""

  def index(outer, x):
    lo, _, _, hi = ranges(cfg, outer, bq, bk, n)
    return _clip(x, lo, hi - 1)

  return index


def _tpu_forward(cfg: _Config, q, k, v, q_seg, k_seg):
  """``q [B,H,Tp,K]``, ``k, v [B,Hkv,Tp,*]`` -> ``o [B,H,Tp,V]``, ``lse [B,H,Tp,1]``."""
  b, h, tp, dk = q.shape
  dv = v.shape[-1]
  bq, bk, g = cfg.blocks.block_q, cfg.blocks.block_k, cfg.groups
  nq, nk = tp // bq, tp // bk
  kv = _tpu_clamped(cfg, _key_blocks, bq, bk, nk)
  in_specs = [
      pl.BlockSpec((None, None, bq, dk), lambda bi, hi, i, j: (bi, hi, i, 0)),
      pl.BlockSpec((None, None, bk, dk), lambda bi, hi, i, j: (bi, _div(hi, g), kv(i, j), 0)),
      pl.BlockSpec((None, None, bk, dv), lambda bi, hi, i, j: (bi, _div(hi, g), kv(i, j), 0)),
  ]
  args = [q, k, v]
  if cfg.segments:
    in_specs += [pl.BlockSpec((None, bq, 1), lambda bi, hi, i, j: (bi, i, 0)),
                 pl.BlockSpec((None, 1, bk), lambda bi, hi, i, j: (bi, 0, kv(i, j)))]
    args += [q_seg, k_seg]
  return pl.pallas_call(
      functools.partial(_tpu_fwd_kernel, cfg=cfg, bq=bq, bk=bk, nk=nk),
      grid=(b, h, nq, nk),
      in_specs=in_specs,
      out_specs=[pl.BlockSpec((None, None, bq, dv), lambda bi, hi, i, j: (bi, hi, i, 0)),
                 pl.BlockSpec((None, None, bq, 1), lambda bi, hi, i, j: (bi, hi, i, 0))],
      out_shape=[jax.ShapeDtypeStruct((b, h, tp, dv), q.dtype),
                 jax.ShapeDtypeStruct((b, h, tp, 1), jnp.float32)],
      scratch_shapes=[pltpu.VMEM((bq, 1), jnp.float32), pltpu.VMEM((bq, 1), jnp.float32),
                      pltpu.VMEM((bq, dv), jnp.float32)],
      compiler_params=_tpu_params(),
      interpret=cfg.interpret,
      name="flash_attention_fwd",
  )(*args)


def _tpu_dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, cfg: _Config,
                   bq: int, bk: int, nk: int):
  if cfg.segments:
    qs_ref, ks_ref, dq_ref, dq_sc = refs
  else:
    dq_ref, dq_sc = refs
  i, j = pl.program_id(2), pl.program_id(3)

  @pl.when(j == 0)
  def _init():
    dq_sc[...] = jnp.zeros(dq_sc.shape, jnp.float32)

  def update(masked):
    ok = None
    if masked:
      q_pos, k_pos = _tpu_positions(i, j, bq, bk)
      segs = (qs_ref[...], ks_ref[...]) if cfg.segments else (None, None)
      ok = _visible(cfg, q_pos, k_pos, *segs)
    k = k_ref[...]
    p = _bwd_probs(q_ref[...], k, lse_ref[...] * _LOG2E, ok, cfg.scale * _LOG2E)
    ds = _bwd_dscores(p, do_ref[...], v_ref[...], delta_ref[...])
    dq_sc[...] += _dot(ds.astype(k.dtype), k)

  _tpu_dispatch(*_key_blocks(cfg, i, bq, bk, nk), j, update)

  @pl.when(j == nk - 1)
  def _store():
    dq_ref[...] = (dq_sc[...] * cfg.scale).astype(dq_ref.dtype)


def _tpu_dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, cfg: _Config,
                    bq: int, bk: int, nq: int):
  if cfg.segments:
    qs_ref, ks_ref, dk_ref, dv_ref, dk_sc, dv_sc = refs
  else:
    dk_ref, dv_ref, dk_sc, dv_sc = refs
  j, i = pl.program_id(2), pl.program_id(3)

  @pl.when(i == 0)
  def _init():
    dk_sc[...] = jnp.zeros(dk_sc.shape, jnp.float32)
    dv_sc[...] = jnp.zeros(dv_sc.shape, jnp.float32)

  def update(masked):
    ok = None
    if masked:
      q_pos, k_pos = _tpu_positions(i, j, bq, bk)
      segs = (qs_ref[...], ks_ref[...]) if cfg.segments else (None, None)
      ok = _visible(cfg, q_pos, k_pos, *segs)
    q, do = q_ref[...], do_ref[...]
    p = _bwd_probs(q, k_ref[...], lse_ref[...] * _LOG2E, ok, cfg.scale * _LOG2E)
    ds = _bwd_dscores(p, do, v_ref[...], delta_ref[...])
    dk_sc[...] += _dot_tn(ds.astype(q.dtype), q)
    dv_sc[...] += _dot_tn(p.astype(do.dtype), do)

  _tpu_dispatch(*_query_blocks(cfg, j, bq, bk, nq), i, update)

  @pl.when(i == nq - 1)
  def _store():
    dk_ref[...] = (dk_sc[...] * cfg.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv_sc[...].astype(dv_ref.dtype)


def _tpu_backward(cfg: _Config, q, k, v, q_seg, k_seg, do, lse, delta, kv_dtype):
  """Per-query-head ``dq [B,H,Tp,K]``, ``dk [B,H,Tp,K]``, ``dv [B,H,Tp,V]``."""
  b, h, tp, dk_ = q.shape
  dv_ = v.shape[-1]
  g = cfg.groups
  bl = cfg.blocks
  seg_args = [q_seg, k_seg] if cfg.segments else []

  bq, bk = bl.block_q_dq, bl.block_k_dq
  nq, nk = tp // bq, tp // bk
  kv = _tpu_clamped(cfg, _key_blocks, bq, bk, nk)
  q_blk = lambda d: pl.BlockSpec((None, None, bq, d), lambda bi, hi, i, j: (bi, hi, i, 0))
  kv_blk = lambda d: pl.BlockSpec((None, None, bk, d),
                                  lambda bi, hi, i, j: (bi, _div(hi, g), kv(i, j), 0))
  seg_specs = ([pl.BlockSpec((None, bq, 1), lambda bi, hi, i, j: (bi, i, 0)),
                pl.BlockSpec((None, 1, bk), lambda bi, hi, i, j: (bi, 0, kv(i, j)))]
               if cfg.segments else [])
  dq = pl.pallas_call(
      functools.partial(_tpu_dq_kernel, cfg=cfg, bq=bq, bk=bk, nk=nk),
      grid=(b, h, nq, nk),
      in_specs=[q_blk(dk_), kv_blk(dk_), kv_blk(dv_), q_blk(dv_), q_blk(1), q_blk(1)] + seg_specs,
      out_specs=q_blk(dk_),
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      scratch_shapes=[pltpu.VMEM((bq, dk_), jnp.float32)],
      compiler_params=_tpu_params(),
      interpret=cfg.interpret,
      name="flash_attention_dq",
  )(q, k, v, do, lse, delta, *seg_args)

  bq, bk = bl.block_q_dkv, bl.block_k_dkv
  nq, nk = tp // bq, tp // bk
  qi = _tpu_clamped(cfg, _query_blocks, bq, bk, nq)
  q_blk = lambda d: pl.BlockSpec((None, None, bq, d), lambda bi, hi, j, i: (bi, hi, qi(j, i), 0))
  kv_blk = lambda d: pl.BlockSpec((None, None, bk, d), lambda bi, hi, j, i: (bi, _div(hi, g), j, 0))
  out_blk = lambda d: pl.BlockSpec((None, None, bk, d), lambda bi, hi, j, i: (bi, hi, j, 0))
  seg_specs = ([pl.BlockSpec((None, bq, 1), lambda bi, hi, j, i: (bi, qi(j, i), 0)),
                pl.BlockSpec((None, 1, bk), lambda bi, hi, j, i: (bi, 0, j))]
               if cfg.segments else [])
  dk, dv = pl.pallas_call(
      functools.partial(_tpu_dkv_kernel, cfg=cfg, bq=bq, bk=bk, nq=nq),
      grid=(b, h, nk, nq),
      in_specs=[q_blk(dk_), kv_blk(dk_), kv_blk(dv_), q_blk(dv_), q_blk(1), q_blk(1)] + seg_specs,
      out_specs=[out_blk(dk_), out_blk(dv_)],
      out_shape=[jax.ShapeDtypeStruct((b, h, tp, dk_), kv_dtype),
                 jax.ShapeDtypeStruct((b, h, tp, dv_), kv_dtype)],
      scratch_shapes=[pltpu.VMEM((bk, dk_), jnp.float32), pltpu.VMEM((bk, dv_), jnp.float32)],
      compiler_params=_tpu_params(),
      interpret=cfg.interpret,
      name="flash_attention_dkv",
  )(q, k, v, do, lse, delta, *seg_args)
  return dq, dk, dv


# ---------------------------------------------------------------------------
# custom_vjp over the padded, backend-native layout.


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attention(cfg: _Config, q, k, v, q_seg, k_seg):
  fwd = _gpu_forward if cfg.backend == "gpu" else _tpu_forward
  return tuple(fwd(cfg, q, k, v, q_seg, k_seg))


def _attention_fwd(cfg: _Config, q, k, v, q_seg, k_seg):
  o, lse = _attention(cfg, q, k, v, q_seg, k_seg)
  return (o, lse), (q, k, v, q_seg, k_seg, o, lse)


def _attention_bwd(cfg: _Config, res, cotangents):
  q, k, v, q_seg, k_seg, o, lse = res
  do, dlse = cotangents
  do = do.astype(q.dtype)
  # d lse_i / d s_ij = p_ij, so an lse cotangent only shifts the row term delta.
  delta = jnp.sum(do.astype(jnp.float32) * o.astype(jnp.float32), axis=-1)
  if cfg.backend == "gpu":
    delta = jnp.swapaxes(delta, 1, 2) - dlse  # [B, H, Tp]
  else:
    delta = delta[..., None] - dlse  # [B, H, Tp, 1]
  g = cfg.groups
  kv_dtype = k.dtype if g == 1 else jnp.float32
  bwd = _gpu_backward if cfg.backend == "gpu" else _tpu_backward
  dq, dk, dv = bwd(cfg, q, k, v, q_seg, k_seg, do, lse, delta, kv_dtype)
  if g > 1:
    # Per-query-head gradients summed over each key head's group.
    head = 2 if cfg.backend == "gpu" else 1
    fold = lambda x: x.reshape(x.shape[:head] + (x.shape[head] // g, g) + x.shape[head + 1:])
    dk = fold(dk).sum(head + 1).astype(k.dtype)
    dv = fold(dv).sum(head + 1).astype(v.dtype)
  return dq, dk, dv, None, None


_attention.defvjp(_attention_fwd, _attention_bwd)


# ---------------------------------------------------------------------------
# Public API.


def default_backend() -> str | None:
  """``"gpu"`` or ``"tpu"`` when the default JAX backend is one, else ``None``."""
  platform = jax.default_backend()
  if platform in ("gpu", "cuda", "rocm"):
    return "gpu"
  if platform == "tpu":
    return "tpu"
  return None


def _next_pow2(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


def _resolve_blocks(block_sizes: BlockSizes | None, backend: str, t: int,
                    native: bool) -> BlockSizes:
  """Validates ``block_sizes`` and caps each block at the padded sequence length."""
  if block_sizes is None:
    block_sizes = BlockSizes.default(backend)
  if not isinstance(block_sizes, BlockSizes):
    raise ValueError(f"block_sizes must be a BlockSizes or None, got {block_sizes!r}.")
  mins = _MIN_BLOCK[backend] if (native or backend == "gpu") else _MIN_BLOCK_TPU_INTERPRET
  capped = {}
  for names, least in ((block_sizes.query_side(), mins[0]), (block_sizes.key_side(), mins[1])):
    for name in names:
      size = getattr(block_sizes, name)
      if isinstance(size, bool) or not isinstance(size, int) or size < least or size & (size - 1):
        raise ValueError(
            f"block_sizes.{name} must be a power of two >= {least} on backend={backend!r}, "
            f"got {size!r}."
        )
      capped[name] = min(size, max(least, _next_pow2(t)))
  return dataclasses.replace(block_sizes, **capped)


def _check_inputs(q, k, v, segment_ids, window):
  for name, x in (("q", q), ("k", k), ("v", v)):
    common.check_rank(name, x, 4)
    common.check_float(name, x)
  common.check_same_dtype(q=q, k=k, v=v)
  if jnp.dtype(q.dtype) not in SUPPORTED_DTYPES:
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
    block_sizes: BlockSizes | None = None,
    backend: str | None = None,
    interpret: Any = False,
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
    block_sizes: :class:`BlockSizes`; ``None``: ``BlockSizes.default(backend)``.
    backend: ``"gpu"`` (Triton) or ``"tpu"`` (Mosaic); ``None``: the current
      JAX backend, or ``"gpu"`` when interpreting on CPU.
    interpret: ``False`` (compile for the device), ``True`` (Pallas interpret
      mode, any host) or a ``pltpu.InterpretParams`` (TPU interpret mode).
    return_lse: also return the float32 log-sum-exp ``[B, T, H]`` (natural
      log; differentiable).

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q`` (or ``(o, lse)``).
    Statistics and accumulation are float32.
  """
  _, t, h, hkv, dk, _ = _check_inputs(q, k, v, segment_ids, window)
  if backend is None:
    backend = default_backend()
    if backend is None:
      if interpret is False or interpret is None:
        raise ValueError(
            f"interpret must be set on backend {jax.default_backend()!r} (the kernels compile "
            "only for GPU and TPU), got interpret=False."
        )
      backend = "tpu" if isinstance(interpret, pltpu.InterpretParams) else "gpu"
  common.check_choice("backend", backend, BACKENDS)
  native = interpret is False or interpret is None
  blocks = _resolve_blocks(block_sizes, backend, t, native)
  if native and default_backend() != backend:
    raise ValueError(
        f"backend={backend!r} needs a {backend.upper()} (JAX backend is "
        f"{jax.default_backend()!r}); pass interpret=True or a pltpu.InterpretParams."
    )
  scale = common.resolve_scale(scale, dk)
  return _flash(q, k, v, segment_ids, causal=bool(causal), scale=float(scale), window=window,
                blocks=blocks, backend=backend, interpret=interpret or False,
                groups=h // hkv, return_lse=bool(return_lse))


@functools.partial(jax.jit, static_argnames=("causal", "scale", "window", "blocks", "backend",
                                             "interpret", "groups", "return_lse"))
def _flash(q, k, v, segment_ids, *, causal, scale, window, blocks, backend, interpret, groups,
           return_lse):
  b, t, h, dk = q.shape
  dv = v.shape[-1]
  multiple = max(dataclasses.astuple(blocks)[:6])
  tp = t + (-t % multiple)
  cfg = _Config(backend=backend, causal=causal, window=window, scale=scale, seq_len=t,
                padded_len=tp, groups=groups, segments=segment_ids is not None, blocks=blocks,
                interpret=interpret)
  q_seg = k_seg = None
  if segment_ids is not None:
    seg = common.segment_index(segment_ids)
    q_seg = common.pad_axis(seg, multiple, value=_PAD_QUERY_SEG)
    k_seg = common.pad_axis(seg, multiple, value=_PAD_KEY_SEG)
  q, k, v = (common.pad_axis(x, multiple) for x in (q, k, v))
  if backend == "gpu":
    # Triton blocks are powers of two: zero-pad head dims (zeros change no logit).
    q, k = (common.pad_axis(x, max(16, _next_pow2(dk)), axis=3) for x in (q, k))
    v = common.pad_axis(v, max(16, _next_pow2(dv)), axis=3)
    o, lse = _attention(cfg, q, k, v, q_seg, k_seg)
    o, lse = o[:, :t, :, :dv], jnp.swapaxes(lse, 1, 2)[:, :t]
  else:
    q, k, v = (jnp.swapaxes(x, 1, 2) for x in (q, k, v))
    if segment_ids is not None:
      q_seg, k_seg = q_seg[:, :, None], k_seg[:, None, :]
    o, lse = _attention(cfg, q, k, v, q_seg, k_seg)
    o, lse = jnp.swapaxes(o, 1, 2)[:, :t], jnp.swapaxes(lse[..., 0], 1, 2)[:, :t]
  return (o, lse) if return_lse else o


def supported(q: Array, k: Array, v: Array, backend: str | None = None) -> bool:
  """Whether :func:`flash_attention` runs natively here for these inputs (used by ``ops``)."""
  backend = backend or default_backend()
  if backend not in BACKENDS or default_backend() != backend:
    return False
  dtypes = {jnp.dtype(x.dtype) for x in (q, k, v)}
  return len(dtypes) == 1 and dtypes <= set(SUPPORTED_DTYPES)
