"""Flash attention, TPU entry point: ``pallas_call`` for Mosaic.

Layout ``[B, H, T, D]`` (transposed by the caller, so blocks obey the
``(8, 128)`` tiling); grid ``(B, H, blocks, inner blocks)`` with the inner
block the sequential ("arbitrary") axis and VMEM scratch accumulators. The
index maps clamp skipped blocks onto visited ones, so they cost no DMA.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from linear_attention.engines.softmax.pallas import blocks

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


def _tpu_fwd_kernel(q_ref, k_ref, v_ref, *refs, cfg: blocks.KernelConfig, bq: int, bk: int, nk: int):
  if cfg.segments:
    qs_ref, ks_ref, o_ref, lse_ref, m_sc, l_sc, acc_sc = refs
  else:
    o_ref, lse_ref, m_sc, l_sc, acc_sc = refs
  i, j = pl.program_id(2), pl.program_id(3)

  @pl.when(j == 0)
  def _init():
    m_sc[...], l_sc[...], acc_sc[...] = blocks.init_carry(bq, acc_sc.shape[-1])

  def update(masked):
    ok = None
    if masked:
      q_pos, k_pos = _tpu_positions(i, j, bq, bk)
      segs = (qs_ref[...], ks_ref[...]) if cfg.segments else (None, None)
      ok = blocks.visible(cfg, q_pos, k_pos, *segs)
    carry = (m_sc[...], l_sc[...], acc_sc[...])
    m_sc[...], l_sc[...], acc_sc[...] = blocks.softmax_step(q_ref[...], k_ref[...], v_ref[...], carry,
                                                      ok, cfg.scale * blocks.LOG2E)

  _tpu_dispatch(*blocks.key_blocks(cfg, i, bq, bk, nk), j, update)

  @pl.when(j == nk - 1)
  def _store():
    o, lse = blocks.finalize(m_sc[...], l_sc[...], acc_sc[...])
    o_ref[...] = o.astype(o_ref.dtype)
    lse_ref[...] = lse


def _tpu_clamped(cfg, ranges, bq, bk, n):
  """Index of the block visited at step ``x``: skipped steps repeat a visited block (no DMA)."""

  def index(outer, x):
    lo, _, _, hi = ranges(cfg, outer, bq, bk, n)
    return blocks.clip(x, lo, hi - 1)

  return index


def forward(cfg: blocks.KernelConfig, q, k, v, q_seg, k_seg):
  """``q [B,H,Tp,K]``, ``k, v [B,Hkv,Tp,*]`` -> ``o [B,H,Tp,V]``, ``lse [B,H,Tp,1]``."""
  b, h, tp, dk = q.shape
  dv = v.shape[-1]
  bq, bk, g = cfg.blocks.block_q, cfg.blocks.block_k, cfg.groups
  nq, nk = tp // bq, tp // bk
  kv = _tpu_clamped(cfg, blocks.key_blocks, bq, bk, nk)
  in_specs = [
      pl.BlockSpec((None, None, bq, dk), lambda bi, hi, i, j: (bi, hi, i, 0)),
      pl.BlockSpec((None, None, bk, dk), lambda bi, hi, i, j: (bi, blocks.div(hi, g), kv(i, j), 0)),
      pl.BlockSpec((None, None, bk, dv), lambda bi, hi, i, j: (bi, blocks.div(hi, g), kv(i, j), 0)),
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


def _tpu_dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, cfg: blocks.KernelConfig,
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
      ok = blocks.visible(cfg, q_pos, k_pos, *segs)
    k = k_ref[...]
    p = blocks.bwd_probs(q_ref[...], k, lse_ref[...] * blocks.LOG2E, ok, cfg.scale * blocks.LOG2E)
    ds = blocks.bwd_dscores(p, do_ref[...], v_ref[...], delta_ref[...])
    dq_sc[...] += blocks.dot(ds.astype(k.dtype), k)

  _tpu_dispatch(*blocks.key_blocks(cfg, i, bq, bk, nk), j, update)

  @pl.when(j == nk - 1)
  def _store():
    dq_ref[...] = (dq_sc[...] * cfg.scale).astype(dq_ref.dtype)


def _tpu_dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, cfg: blocks.KernelConfig,
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
      ok = blocks.visible(cfg, q_pos, k_pos, *segs)
    q, do = q_ref[...], do_ref[...]
    p = blocks.bwd_probs(q, k_ref[...], lse_ref[...] * blocks.LOG2E, ok, cfg.scale * blocks.LOG2E)
    ds = blocks.bwd_dscores(p, do, v_ref[...], delta_ref[...])
    dk_sc[...] += blocks.dot_tn(ds.astype(q.dtype), q)
    dv_sc[...] += blocks.dot_tn(p.astype(do.dtype), do)

  _tpu_dispatch(*blocks.query_blocks(cfg, j, bq, bk, nq), i, update)

  @pl.when(i == nq - 1)
  def _store():
    dk_ref[...] = (dk_sc[...] * cfg.scale).astype(dk_ref.dtype)
    dv_ref[...] = dv_sc[...].astype(dv_ref.dtype)


def backward(cfg: blocks.KernelConfig, q, k, v, q_seg, k_seg, do, lse, delta, kv_dtype):
  """Per-query-head ``dq [B,H,Tp,K]``, ``dk [B,H,Tp,K]``, ``dv [B,H,Tp,V]``."""
  b, h, tp, dk_ = q.shape
  dv_ = v.shape[-1]
  g = cfg.groups
  bl = cfg.blocks
  seg_args = [q_seg, k_seg] if cfg.segments else []

  bq, bk = bl.block_q_dq, bl.block_k_dq
  nq, nk = tp // bq, tp // bk
  kv = _tpu_clamped(cfg, blocks.key_blocks, bq, bk, nk)
  q_blk = lambda d: pl.BlockSpec((None, None, bq, d), lambda bi, hi, i, j: (bi, hi, i, 0))
  kv_blk = lambda d: pl.BlockSpec((None, None, bk, d),
                                  lambda bi, hi, i, j: (bi, blocks.div(hi, g), kv(i, j), 0))
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
  qi = _tpu_clamped(cfg, blocks.query_blocks, bq, bk, nq)
  q_blk = lambda d: pl.BlockSpec((None, None, bq, d), lambda bi, hi, j, i: (bi, hi, qi(j, i), 0))
  kv_blk = lambda d: pl.BlockSpec((None, None, bk, d), lambda bi, hi, j, i: (bi, blocks.div(hi, g), j, 0))
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
