"""Flash attention, GPU entry point: ``pallas_call`` lowered through Triton.

Layout ``[B, T, H, D]`` as given; grid ``(blocks, B, H)``. The program for a
query block holds the whole key sequence of its head as a ref and loops over
key blocks with ``fori_loop`` (masked blocks, unmasked ones, masked ones
again); the ``dk, dv`` program of a key block loops over query blocks the
same way. Block sizes are powers of two >= 16 and head dims arrive
zero-padded to one.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from linear_attention.engines import dispatch
from linear_attention.engines.softmax.pallas import blocks


def _gpu_params(cfg: blocks.KernelConfig):
  return {"compiler_params": dispatch.triton_compiler_params(cfg.blocks.num_warps,
                                                             cfg.blocks.num_stages)}


def _gpu_loops(lo, full_lo, full_hi, hi, body, carry):
  """Masked blocks, then unmasked ones, then masked ones again."""
  carry = lax.fori_loop(lo, full_lo, functools.partial(body, True), carry)
  carry = lax.fori_loop(full_lo, full_hi, functools.partial(body, False), carry)
  return lax.fori_loop(full_hi, hi, functools.partial(body, True), carry)


def _gpu_fwd_kernel(q_ref, k_ref, v_ref, *refs, cfg: blocks.KernelConfig, bq: int, bk: int):
  if cfg.segments:
    qs_ref, ks_ref, o_ref, lse_ref = refs
  else:
    o_ref, lse_ref = refs
  i = pl.program_id(0)
  nk = k_ref.shape[0] // bk
  q = q_ref[...]
  q_pos = i * bq + jnp.arange(bq, dtype=jnp.int32)[:, None]
  q_seg = qs_ref[...][:, None] if cfg.segments else None
  qk_scale = cfg.scale * blocks.LOG2E

  def body(masked, j, carry):
    sl = pl.ds(j * bk, bk)
    ok = None
    if masked:
      k_pos = j * bk + jnp.arange(bk, dtype=jnp.int32)[None, :]
      k_seg = ks_ref[sl][None, :] if cfg.segments else None
      ok = blocks.visible(cfg, q_pos, k_pos, q_seg, k_seg)
    return blocks.softmax_step(q, k_ref[sl, :], v_ref[sl, :], carry, ok, qk_scale)

  carry = _gpu_loops(*blocks.key_blocks(cfg, i, bq, bk, nk), body, blocks.init_carry(bq, v_ref.shape[-1]))
  o, lse = blocks.finalize(*carry)
  o_ref[...] = o.astype(o_ref.dtype)
  lse_ref[...] = lse[:, 0]


def forward(cfg: blocks.KernelConfig, q, k, v, q_seg, k_seg):
  """``q [B,Tp,H,K]``, ``k [B,Tp,Hkv,K]``, ``v [B,Tp,Hkv,V]`` -> ``o [B,Tp,H,V]``, ``lse [B,H,Tp]``."""
  b, tp, h, dk = q.shape
  dv = v.shape[-1]
  bq, bk, g = cfg.blocks.block_q, cfg.blocks.block_k, cfg.groups
  in_specs = [
      pl.BlockSpec((None, bq, None, dk), lambda i, bi, hi: (bi, i, hi, 0)),
      pl.BlockSpec((None, tp, None, dk), lambda i, bi, hi: (bi, 0, blocks.div(hi, g), 0)),
      pl.BlockSpec((None, tp, None, dv), lambda i, bi, hi: (bi, 0, blocks.div(hi, g), 0)),
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


def _gpu_dq_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, cfg: blocks.KernelConfig,
                   bq: int, bk: int):
  if cfg.segments:
    qs_ref, ks_ref, dq_ref = refs
  else:
    (dq_ref,) = refs
  i = pl.program_id(0)
  nk = k_ref.shape[0] // bk
  q, do = q_ref[...], do_ref[...]
  lse2 = lse_ref[...][:, None] * blocks.LOG2E
  delta = delta_ref[...][:, None]
  q_pos = i * bq + jnp.arange(bq, dtype=jnp.int32)[:, None]
  q_seg = qs_ref[...][:, None] if cfg.segments else None
  qk_scale = cfg.scale * blocks.LOG2E

  def body(masked, j, dq):
    sl = pl.ds(j * bk, bk)
    k = k_ref[sl, :]
    ok = None
    if masked:
      k_pos = j * bk + jnp.arange(bk, dtype=jnp.int32)[None, :]
      k_seg = ks_ref[sl][None, :] if cfg.segments else None
      ok = blocks.visible(cfg, q_pos, k_pos, q_seg, k_seg)
    p = blocks.bwd_probs(q, k, lse2, ok, qk_scale)
    ds = blocks.bwd_dscores(p, do, v_ref[sl, :], delta)
    return dq + blocks.dot(ds.astype(k.dtype), k)

  dq = _gpu_loops(*blocks.key_blocks(cfg, i, bq, bk, nk), body,
                  jnp.zeros((bq, q_ref.shape[-1]), jnp.float32))
  dq_ref[...] = (dq * cfg.scale).astype(dq_ref.dtype)


def _gpu_dkv_kernel(q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, *refs, cfg: blocks.KernelConfig,
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
  qk_scale = cfg.scale * blocks.LOG2E

  def body(masked, i, carry):
    dk, dv = carry
    sl = pl.ds(i * bq, bq)
    q, do = q_ref[sl, :], do_ref[sl, :]
    ok = None
    if masked:
      q_pos = i * bq + jnp.arange(bq, dtype=jnp.int32)[:, None]
      q_seg = qs_ref[sl][:, None] if cfg.segments else None
      ok = blocks.visible(cfg, q_pos, k_pos, q_seg, k_seg)
    p = blocks.bwd_probs(q, k, lse_ref[sl][:, None] * blocks.LOG2E, ok, qk_scale)
    ds = blocks.bwd_dscores(p, do, v, delta_ref[sl][:, None])
    return dk + blocks.dot_tn(ds.astype(q.dtype), q), dv + blocks.dot_tn(p.astype(do.dtype), do)

  init = (jnp.zeros((bk, k.shape[-1]), jnp.float32), jnp.zeros((bk, v.shape[-1]), jnp.float32))
  dk, dv = _gpu_loops(*blocks.query_blocks(cfg, j, bq, bk, nq), body, init)
  dk_ref[...] = (dk * cfg.scale).astype(dk_ref.dtype)
  dv_ref[...] = dv.astype(dv_ref.dtype)


def backward(cfg: blocks.KernelConfig, q, k, v, q_seg, k_seg, do, lse, delta, kv_dtype):
  """Per-query-head ``dq [B,Tp,H,K]``, ``dk [B,Tp,H,K]``, ``dv [B,Tp,H,V]``."""
  b, tp, h, dk_ = q.shape
  dv_ = v.shape[-1]
  g = cfg.groups
  bl = cfg.blocks
  seg_args = [q_seg, k_seg] if cfg.segments else []

  bq, bk = bl.block_q_dq, bl.block_k_dq
  blk = lambda d: pl.BlockSpec((None, bq, None, d), lambda i, bi, hi: (bi, i, hi, 0))
  full_kv = lambda d: pl.BlockSpec((None, tp, None, d), lambda i, bi, hi: (bi, 0, blocks.div(hi, g), 0))
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
  kv_blk = lambda d: pl.BlockSpec((None, bk, None, d), lambda j, bi, hi: (bi, j, blocks.div(hi, g), 0))
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
