"""Chunk-decay kernel, TPU entry point: ``pallas_call`` for Mosaic.

Grid ``(B, H, V / block_v, chunks)``, the chunk axis sequential
("arbitrary") with the float32 state (or its gradient) in a VMEM scratch that
persists across it, so Pallas pipelines each chunk's HBM->VMEM copies; the
``dq`` kernel carries nothing and its chunk axis is parallel. Blocks are
``(chunk, K)``/``(chunk, block_v)``: ``chunk`` a multiple of 8, ``block_v`` a
multiple of 128 or all of ``V`` (the (8, 128) tiling). Per-chunk small
inputs: ``grow`` (the scalar decay as a row, ``[N, 1, C]``) and ``glc`` (the
vector decay at the chunk end as a column, ``[K, 1]`` per chunk).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from linear_attention.engines import dispatch
from linear_attention.engines.decay.pallas import blocks


def _tpu_fwd_kernel(*refs, names, cfg, n_chunks, kp):
  del kp
  r = dict(zip(names, refs))
  j = pl.program_id(3)

  @pl.when(j == 0)
  def _():
    r["acc"][...] = r["s0"][...].astype(jnp.float32)

  grow = r["grow"][...] if cfg.mode == "scalar" else None
  glc = r["glc"][...] if cfg.mode == "vector" else None
  state = blocks.fwd_block(r, 0, grow, glc, r["acc"][...], cfg)
  r["acc"][...] = state

  @pl.when(j == n_chunks - 1)
  def _():
    r["st"][...] = state


def _tpu_states_kernel(*refs, names, cfg, n_chunks, kp):
  del n_chunks, kp
  r = dict(zip(names, refs))

  @pl.when(pl.program_id(3) == 0)
  def _():
    r["acc"][...] = r["s0"][...].astype(jnp.float32)

  state = r["acc"][...]
  r["states"][...] = state
  glc = r["glc"][...] if cfg.mode == "vector" else None
  r["acc"][...] = blocks.state_block(r, 0, glc, state, cfg)


def _tpu_dq_kernel(*refs, names, cfg, n_chunks, kp):
  del n_chunks, kp
  r = dict(zip(names, refs))
  grow = r["grow"][...] if cfg.mode == "scalar" else None
  blocks.dq_block(r, 0, grow, r["states"][...], cfg)


def _tpu_dkv_kernel(*refs, names, cfg, n_chunks, kp):
  del kp
  r = dict(zip(names, refs))
  i = pl.program_id(3)  # chunks are visited last to first

  @pl.when(i == 0)
  def _():
    r["acc"][...] = r["dst"][...].astype(jnp.float32)

  grow = r["grow"][...] if cfg.mode == "scalar" else None
  glc = r["glc"][...] if cfg.mode == "vector" else None
  dstate = blocks.dkv_block(r, 0, grow, glc, r["acc"][...], cfg)
  r["acc"][...] = dstate

  @pl.when(i == n_chunks - 1)
  def _():
    if "ds0" in r:  # the dk kernel of a split sweep leaves it to the dv kernel
      r["ds0"][...] = dstate


def _specs(cfg: blocks.KernelConfig, n_chunks: int, kp: int, reverse: bool):
  """BlockSpec per array kind on the grid ``(b, h, jv, n)``: one chunk per step
  (``n`` counted from the end when ``reverse``)."""
  c, bv = cfg.chunk, cfg.block_v
  ch = (lambda n: n_chunks - 1 - n) if reverse else (lambda n: n)
  return {
      "rows_k": pl.BlockSpec((None, None, c, kp), lambda b, h, jv, n: (b, h, ch(n), 0)),
      "rows_1": pl.BlockSpec((None, None, c, 1), lambda b, h, jv, n: (b, h, ch(n), 0)),
      "rows_v": pl.BlockSpec((None, None, c, bv), lambda b, h, jv, n: (b, h, ch(n), jv)),
      "part_k": pl.BlockSpec((None, None, None, c, kp), lambda b, h, jv, n: (jv, b, h, ch(n), 0)),
      "grow": pl.BlockSpec((None, None, None, 1, c), lambda b, h, jv, n: (b, h, ch(n), 0, 0)),
      "glc": pl.BlockSpec((None, None, kp, 1), lambda b, h, jv, n: (b, h, ch(n), 0)),
      "state": pl.BlockSpec((None, None, kp, bv), lambda b, h, jv, n: (b, h, 0, jv)),
      "states": pl.BlockSpec((None, None, kp, bv), lambda b, h, jv, n: (b, h, ch(n), jv)),
  }


# kind: (kernel, whether it carries a state across the chunk axis in a VMEM scratch)
_KERNELS = {"fwd": (_tpu_fwd_kernel, True), "states": (_tpu_states_kernel, True),
            "bwd_dq": (_tpu_dq_kernel, False), "bwd_dkv": (_tpu_dkv_kernel, True),
            "bwd_dk": (_tpu_dkv_kernel, True), "bwd_dv": (_tpu_dkv_kernel, True)}


def call(kind: str, cfg: blocks.KernelConfig, inputs, outputs, *, n_chunks: int, kp: int,
         vp: int, reverse: bool = False):
  """Runs the ``kind`` kernel (``"fwd"``, ``"states"``, ``"bwd_dq"``, ``"bwd_dkv"``,
  ``"bwd_dk"`` or ``"bwd_dv"``);
  arguments as in :func:`..triton.call`, ``reverse`` visiting the chunks last to first.
  The chunk axis is sequential for the kernels that carry a state, parallel for ``dq``."""
  b, h, _ = inputs[0][1].shape[:3]
  kernel, carries = _KERNELS[kind]
  return dispatch.named_pallas_call(
      kernel, inputs, outputs, _specs(cfg, n_chunks, kp, reverse),
      grid=(b, h, vp // cfg.block_v, n_chunks), interpret=cfg.interpret,
      name=f"chunk_decay_{kind}_{cfg.mode}",
      compiler_params=pltpu.CompilerParams(dimension_semantics=(
          "parallel", "parallel", "parallel", "arbitrary" if carries else "parallel")),
      scratch=[("acc", pltpu.VMEM((kp, cfg.block_v), jnp.float32))] if carries else [],
      cfg=cfg, n_chunks=n_chunks, kp=kp)
