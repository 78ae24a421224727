"""Chunk-delta kernels, TPU entry point: ``pallas_call`` for Mosaic.

Grid ``(B, H, V / block_v, chunks)``, the chunk axis sequential ("arbitrary")
with the float32 state (or its gradient) in a VMEM scratch that persists
across it, so Pallas pipelines each chunk's HBM->VMEM copies. Blocks are
``(chunk, K)``, ``(chunk, block_v)`` and ``(chunk, chunk)``: ``chunk`` a
multiple of 16, ``block_v`` a multiple of 128 or all of ``V`` (the (8, 128)
tiling). The chunk's total decay is a ``(1, 1)`` block, or ``(K, 1)`` (one
per key channel) for the DPLR algebra (``cfg.dplr``).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from linear_attention.engines import dispatch
from linear_attention.engines.delta.pallas import blocks


def _tpu_fwd_kernel(*refs, names, cfg, n_chunks):
  """``o`` and the final state (``kind="fwd"``), or the entering states and ``D``
  (``kind="states"``)."""
  r = dict(zip(names, refs))
  j = pl.program_id(3)

  @pl.when(j == 0)
  def _():
    r["acc"][...] = r["s0"][...].astype(jnp.float32)

  state = r["acc"][...]
  if "states" in r:
    r["states"][...] = state
  state = blocks.fwd_block(r, 0, r["decay"][...], state, cfg)
  r["acc"][...] = state
  if "st" in r:
    @pl.when(j == n_chunks - 1)
    def _():
      r["st"][...] = state


def _tpu_bwd_kernel(*refs, names, cfg, n_chunks):
  """The reverse sweep (chunks visited last to first)."""
  r = dict(zip(names, refs))
  i = pl.program_id(3)

  @pl.when(i == 0)
  def _():
    r["acc"][...] = r["dst"][...].astype(jnp.float32)

  dstate = r["acc"][...]
  r["dsl"][...] = dstate
  dstate = blocks.bwd_block(r, 0, r["decay"][...], dstate, cfg)
  r["acc"][...] = dstate

  @pl.when(i == n_chunks - 1)
  def _():
    r["ds0"][...] = dstate


def _specs(cfg: blocks.KernelConfig, n_chunks: int, kp: int, reverse: bool):
  """BlockSpec per array kind on the grid ``(b, h, jv, n)``: one chunk per step
  (``n`` counted from the end when ``reverse``)."""
  c, bv = cfg.chunk, cfg.block_v
  ch = (lambda n: n_chunks - 1 - n) if reverse else (lambda n: n)
  return {
      "rows_k": pl.BlockSpec((None, None, c, kp), lambda b, h, jv, n: (b, h, ch(n), 0)),
      "rows_c": pl.BlockSpec((None, None, c, c), lambda b, h, jv, n: (b, h, ch(n), 0)),
      "rows_k_group": pl.BlockSpec((None, None, c, kp),
                                   lambda b, h, jv, n: (b, h // cfg.group, ch(n), 0)),
      "rows_c_group": pl.BlockSpec((None, None, c, c),
                                   lambda b, h, jv, n: (b, h // cfg.group, ch(n), 0)),
      "rows_v": pl.BlockSpec((None, None, c, bv), lambda b, h, jv, n: (b, h, ch(n), jv)),
      "decay": pl.BlockSpec((None, None, None, blocks.decay_rows(cfg, kp), 1),
                            lambda b, h, jv, n: (b, h, ch(n), 0, 0)),
      "state": pl.BlockSpec((None, None, kp, bv), lambda b, h, jv, n: (b, h, 0, jv)),
      "states": pl.BlockSpec((None, None, kp, bv), lambda b, h, jv, n: (b, h, ch(n), jv)),
  }


_KERNELS = {"fwd": _tpu_fwd_kernel, "states": _tpu_fwd_kernel, "bwd": _tpu_bwd_kernel}


def call(kind: str, cfg: blocks.KernelConfig, inputs, outputs, *, n_chunks: int, kp: int,
         vp: int):
  """Runs the ``kind`` kernel; arguments as in :func:`..triton.call`. The backward
  (``"bwd"``) visits the chunks last to first."""
  b = inputs[0][1].shape[0]
  h = next(x.shape[1] for _, x, s in inputs if s == "state")  # the value heads
  # The decay column [B, H, N, rows] as (rows, 1) blocks: the last two dims are whole.
  inputs = [(n, x.reshape(b, h, n_chunks, -1, 1) if s == "decay" else x, s)
            for n, x, s in inputs]
  return dispatch.named_pallas_call(
      _KERNELS[kind], inputs, outputs, _specs(cfg, n_chunks, kp, reverse=kind == "bwd"),
      grid=(b, h, vp // cfg.block_v, n_chunks), interpret=cfg.interpret,
      name=f"{'chunk_dplr' if cfg.dplr else 'chunk_delta'}_{kind}",
      compiler_params=pltpu.CompilerParams(
          dimension_semantics=("parallel", "parallel", "parallel", "arbitrary")),
      scratch=[("acc", pltpu.VMEM((kp, cfg.block_v), jnp.float32))],
      cfg=cfg, n_chunks=n_chunks)
