"""Chunk-decay kernel, GPU entry point: ``pallas_call`` lowered through Triton.

Grid ``(B, H, V / block_v)``: each program sees whole sequences of its
``(batch, head)`` as refs and walks the chunks with ``fori_loop``, the float32
state ``[K, block_v]`` (or its gradient, in the ``dk, dv`` kernel, last chunk
first) in registers; the ``dq`` kernel's chunks are independent. Triton wants power-of-two blocks and dots
of at least 16 rows, so ``K`` and ``V`` arrive zero-padded to powers of two
>= 16 (:func:`blocks.pad_dim`).

Kernel arguments arrive positionally; ``names`` maps them to the dict the
block logic reads. Per-chunk small inputs: ``grow`` (the scalar decay as
rows, ``[N, C]``) and ``glc`` (the vector decay at each chunk end as a
column, ``[N * K, 1]``).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from linear_attention.engines import dispatch
from linear_attention.engines.decay.pallas import blocks


def _gpu_fwd_kernel(*refs, names, cfg, n_chunks, kp):
  r = dict(zip(names, refs))

  def body(j, state):
    base = pl.multiple_of(j * cfg.chunk, cfg.chunk)
    grow = r["grow"][pl.ds(j, 1), :] if cfg.mode == "scalar" else None
    glc = r["glc"][pl.ds(j * kp, kp), :] if cfg.mode == "vector" else None
    return blocks.fwd_block(r, base, grow, glc, state, cfg)

  r["st"][...] = lax.fori_loop(0, n_chunks, body, r["s0"][...].astype(jnp.float32))


def _gpu_states_kernel(*refs, names, cfg, n_chunks, kp):
  r = dict(zip(names, refs))

  def body(j, state):
    r["states"][pl.ds(j * kp, kp), :] = state
    glc = r["glc"][pl.ds(j * kp, kp), :] if cfg.mode == "vector" else None
    return blocks.state_block(r, pl.multiple_of(j * cfg.chunk, cfg.chunk), glc, state, cfg)

  lax.fori_loop(0, n_chunks, body, r["s0"][...].astype(jnp.float32))


def _gpu_dq_kernel(*refs, names, cfg, n_chunks, kp):
  r = dict(zip(names, refs))

  @pl.loop(0, n_chunks)
  def _(j):
    grow = r["grow"][pl.ds(j, 1), :] if cfg.mode == "scalar" else None
    state = r["states"][pl.ds(j * kp, kp), :]
    blocks.dq_block(r, pl.multiple_of(j * cfg.chunk, cfg.chunk), grow, state, cfg)


def _gpu_dkv_kernel(*refs, names, cfg, n_chunks, kp):
  r = dict(zip(names, refs))

  def body(i, dstate):
    j = n_chunks - 1 - i
    grow = r["grow"][pl.ds(j, 1), :] if cfg.mode == "scalar" else None
    glc = r["glc"][pl.ds(j * kp, kp), :] if cfg.mode == "vector" else None
    return blocks.dkv_block(r, pl.multiple_of(j * cfg.chunk, cfg.chunk), grow, glc, dstate, cfg)

  ds0 = lax.fori_loop(0, n_chunks, body, r["dst"][...].astype(jnp.float32))
  if "ds0" in r:  # the dk kernel of a split sweep leaves it to the dv kernel
    r["ds0"][...] = ds0


def _specs(cfg: blocks.KernelConfig, n_chunks: int, tp: int, kp: int):
  """BlockSpec per array kind on the grid ``(b, h, jv)``: row arrays are whole sequences."""
  c, bv = cfg.chunk, cfg.block_v
  return {
      "rows_k": pl.BlockSpec((None, None, tp, kp), lambda b, h, jv: (b, h, 0, 0)),
      "rows_1": pl.BlockSpec((None, None, tp, 1), lambda b, h, jv: (b, h, 0, 0)),
      "rows_v": pl.BlockSpec((None, None, tp, bv), lambda b, h, jv: (b, h, 0, jv)),
      "part_k": pl.BlockSpec((None, None, None, tp, kp), lambda b, h, jv: (jv, b, h, 0, 0)),
      "grow": pl.BlockSpec((None, None, n_chunks, c), lambda b, h, jv: (b, h, 0, 0)),
      "glc": pl.BlockSpec((None, None, n_chunks * kp, 1), lambda b, h, jv: (b, h, 0, 0)),
      "state": pl.BlockSpec((None, None, kp, bv), lambda b, h, jv: (b, h, 0, jv)),
      "states": pl.BlockSpec((None, None, n_chunks * kp, bv), lambda b, h, jv: (b, h, 0, jv)),
  }


_KERNELS = {"fwd": _gpu_fwd_kernel, "states": _gpu_states_kernel, "bwd_dq": _gpu_dq_kernel,
            "bwd_dkv": _gpu_dkv_kernel, "bwd_dk": _gpu_dkv_kernel, "bwd_dv": _gpu_dkv_kernel}


def call(kind: str, cfg: blocks.KernelConfig, inputs, outputs, *, n_chunks: int, kp: int,
         vp: int, reverse: bool = False):
  """Runs the ``kind`` kernel (``"fwd"``, ``"states"``, ``"bwd_dq"``, ``"bwd_dkv"``,
  or ``"bwd_dk"`` and ``"bwd_dv"`` for a split sweep).

  ``inputs``: ``[(name, array [B, H, ...], spec kind)]`` (arrays present only);
  ``outputs``: ``[(name, ShapeDtypeStruct, spec kind)]``. Returns ``{name: array}``.
  ``reverse`` is implicit on GPU (the ``dk, dv`` kernel loops from the last chunk).
  """
  del reverse
  b, h, tp = inputs[0][1].shape[:3]
  return dispatch.named_pallas_call(
      _KERNELS[kind], inputs, outputs, _specs(cfg, n_chunks, tp, kp),
      grid=(b, h, vp // cfg.block_v), interpret=cfg.interpret,
      name=f"chunk_decay_{kind}_{cfg.mode}",
      compiler_params=dispatch.triton_compiler_params(cfg.num_warps, cfg.num_stages),
      cfg=cfg, n_chunks=n_chunks, kp=kp)
