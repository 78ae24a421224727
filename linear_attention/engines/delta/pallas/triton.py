"""Chunk-delta kernels, GPU entry point: ``pallas_call`` lowered through Triton.

Grid ``(B, H, V / block_v)``: each program sees whole sequences of its
``(batch, head)`` as refs and walks the chunks with ``fori_loop``, the float32
state ``[K, block_v]`` (or its gradient) in registers. ``K`` and ``V`` arrive
zero-padded to powers of two >= 16 (Triton's power-of-two blocks and dots of
at least 16 rows). The chunk decays are a ``[N, 1]`` column per head, or
``[N K, 1]`` (one per key channel) for the DPLR algebra (``cfg.dplr``).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl

from linear_attention.engines import dispatch
from linear_attention.engines.delta.pallas import blocks


def _gpu_fwd_kernel(*refs, names, cfg, n_chunks, kp):
  """``o`` and the final state (``kind="fwd"``), or the entering states and ``D``
  (``kind="states"``, for the backward)."""
  r = dict(zip(names, refs))
  rows = blocks.decay_rows(cfg, kp)

  def body(j, state):
    if "states" in r:
      r["states"][pl.ds(j * kp, kp), :] = state
    a = r["decay"][pl.ds(j * rows, rows), :]
    return blocks.fwd_block(r, pl.multiple_of(j * cfg.chunk, cfg.chunk), a, state, cfg)

  state = lax.fori_loop(0, n_chunks, body, r["s0"][...].astype(jnp.float32))
  if "st" in r:
    r["st"][...] = state


def _gpu_bwd_kernel(*refs, names, cfg, n_chunks, kp):
  """The reverse sweep: ``dD`` per chunk, ``dS`` leaving each chunk, ``dS_0``."""
  r = dict(zip(names, refs))
  rows = blocks.decay_rows(cfg, kp)

  def body(i, dstate):
    j = n_chunks - 1 - i
    r["dsl"][pl.ds(j * kp, kp), :] = dstate
    a = r["decay"][pl.ds(j * rows, rows), :]
    return blocks.bwd_block(r, pl.multiple_of(j * cfg.chunk, cfg.chunk), a, dstate, cfg)

  r["ds0"][...] = lax.fori_loop(0, n_chunks, body, r["dst"][...].astype(jnp.float32))


def _specs(cfg: blocks.KernelConfig, n_chunks: int, tp: int, kp: int):
  """BlockSpec per array kind on the grid ``(b, h, jv)``: row arrays are whole sequences."""
  bv = cfg.block_v
  return {
      "rows_k": pl.BlockSpec((None, None, tp, kp), lambda b, h, jv: (b, h, 0, 0)),
      "rows_c": pl.BlockSpec((None, None, tp, cfg.chunk), lambda b, h, jv: (b, h, 0, 0)),
      "rows_k_group": pl.BlockSpec((None, None, tp, kp),
                                   lambda b, h, jv: (b, h // cfg.group, 0, 0)),
      "rows_c_group": pl.BlockSpec((None, None, tp, cfg.chunk),
                                   lambda b, h, jv: (b, h // cfg.group, 0, 0)),
      "rows_v": pl.BlockSpec((None, None, tp, bv), lambda b, h, jv: (b, h, 0, jv)),
      "decay": pl.BlockSpec((None, None, n_chunks * blocks.decay_rows(cfg, kp), 1),
                            lambda b, h, jv: (b, h, 0, 0)),
      "state": pl.BlockSpec((None, None, kp, bv), lambda b, h, jv: (b, h, 0, jv)),
      "states": pl.BlockSpec((None, None, n_chunks * kp, bv), lambda b, h, jv: (b, h, 0, jv)),
  }


_KERNELS = {"fwd": _gpu_fwd_kernel, "states": _gpu_fwd_kernel, "bwd": _gpu_bwd_kernel}


def call(kind: str, cfg: blocks.KernelConfig, inputs, outputs, *, n_chunks: int, kp: int,
         vp: int):
  """Runs the ``kind`` kernel (``"fwd"``, ``"states"`` or ``"bwd"``).

  ``inputs``: ``[(name, array [B, H, ...], spec kind)]``; ``outputs``:
  ``[(name, ShapeDtypeStruct, spec kind)]``. Returns ``{name: array}``.
  """
  b, tp = inputs[0][1].shape[0], inputs[0][1].shape[2]
  h = next(x.shape[1] for _, x, s in inputs if s == "state")  # the value heads
  # The decay column [B, H, N, rows] as [B, H, N rows, 1].
  inputs = [(n, x.reshape(b, h, -1, 1) if s == "decay" else x, s) for n, x, s in inputs]
  return dispatch.named_pallas_call(
      _KERNELS[kind], inputs, outputs, _specs(cfg, n_chunks, tp, kp),
      grid=(b, h, vp // cfg.block_v), interpret=cfg.interpret,
      name=f"{'chunk_dplr' if cfg.dplr else 'chunk_delta'}_{kind}",
      compiler_params=dispatch.triton_compiler_params(cfg.num_warps, cfg.num_stages),
      cfg=cfg, n_chunks=n_chunks, kp=kp)
