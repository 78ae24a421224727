"""Pallas kernel: chunked diagonal-decay linear attention (GPU and TPU).

The kernel twin of :func:`linear_attention.ops.decay.decay_linear_attention`
(``form="chunk"``)::

    S_t = exp(log_decay_t) * S_{t-1} + k_t v_t^T        o_t = scale * S_t^T q_t

with ``log_decay`` absent, ``[B, T, H]`` (scalar per head) or ``[B, T, H, K]``
(per key channel). One kernel program owns one ``(batch, head, value block)``
and walks the chunks in order, keeping the float32 state ``[K, block_v]`` on
chip: the per-chunk states never go to HBM in the forward pass.

Layout of this package: ``__init__`` (this file: the API, padding and the
``custom_vjp``), ``blocks.py`` (tiling, static config and the per-chunk block
logic ``fwd_block``, ``state_block``, ``dq_block``, ``dkv_block``) and two thin entry
points that share it:

* ``triton.py``, GPU (``pallas_call`` lowered through Triton): grid ``(B, H, V / block_v)``;
  each program sees whole sequences and loops over chunks with ``fori_loop``,
  the state in registers. Triton wants power-of-two blocks and dots of at
  least 16 rows, so ``K`` and ``V`` are zero-padded to powers of two >= 16.
* ``mosaic_tpu.py``, TPU (``pallas_call`` with Mosaic): grid ``(B, H, V / block_v, chunks)``, the
  chunk axis sequential ("arbitrary") and the state in a VMEM scratch that
  persists across it, so Pallas pipelines each chunk's HBM->VMEM copies.
  Blocks are ``(chunk, K)``/``(chunk, block_v)``: chunk a multiple of 8,
  ``block_v`` a multiple of 128 or all of ``V``, the (8, 128) tiling.

The backward pass (``jax.custom_vjp``) has three kernels (four on GPU), as
flash attention splits its backward, so that no program holds the tiles of
all gradients:

* ``states``: a forward sweep stores the state entering every chunk of
  ``state_chunk`` steps (a transient float32 ``[T / state_chunk, K, V]``
  buffer per head, freed after the backward);
* ``bwd_dq``: ``dq`` from those states and the chunk's own keys, no sweep
  (on TPU the chunk axis is parallel);
* ``bwd_dkv``: ``dk``, ``dv`` and the initial state's gradient, sweeping
  the chunks in reverse carrying ``dS``, the gradient of the state, on chip;
  it needs no states, so its chunk (``chunk``, shared with the forward) can be
  shorter than ``state_chunk``. With ``block_sizes.split_dkv`` (the GPU
  default) two such sweeps, ``bwd_dk`` and ``bwd_dv``, each carry ``dS`` and
  hold one gradient's tiles: one sweep for both spilled registers on H200 and
  A100; the second costs one more ``[K, C] x [C, block_v]`` dot per chunk.

``dq`` and ``dk`` (sums over ``V``) come out per value block and are added up
outside. The log decay's gradient is not computed in the kernels: the outputs
see the decays only through their cumulative sum ``G``, in factors
``exp(G_i - G_j)``, so ``dL/dG = q dq - k dk`` (plus the final state's share
at the last step), cumulated in reverse over the sequence in XLA.

Numerics: ``log_decay`` is cumulated inside each chunk (outside the kernels);
every ``exp`` in the kernel is of a non-positive number. Scalar decays use the
exact pairwise differences of the ``C x C`` chunk. Per-channel decays cut the
chunk into sub-chunks: a query sub-chunk reaches earlier keys through the
cumulative decay just before it (both factors ``<= 1``), and pairs inside one
sub-chunk use exact pairwise differences. Log decays down to -20 per step (and
lower) underflow to exact zeros instead of overflowing.

Dot operands are in the input dtype (bfloat16 runs on the tensor cores) with
float32 accumulation; the state is float32 but is rounded to the input dtype
where it meets a query in a dot. Float32 inputs use full float32 dots.

``segment_ids`` are not supported by the kernel: the ops layer falls back to
XLA for them (or raises for ``implementation="pallas"``).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
from jax import lax

from linear_attention.engines import dispatch
from linear_attention.engines.decay.pallas import blocks, mosaic_tpu, triton
from linear_attention.engines.decay.pallas.blocks import ChunkDecayBlockSizes, KernelConfig
from linear_attention import common

Array = jax.Array


def _call(kind, cfg: KernelConfig, inputs, outputs, **kw):
  """Runs one kernel on ``cfg.platform``; inputs whose array is None are skipped."""
  inputs = [x for x in inputs if x[1] is not None]
  entry = dispatch.lowering(cfg.platform, triton=triton, mosaic_tpu=mosaic_tpu)
  return entry.call(kind, cfg, inputs, outputs, **kw)


def _side_inputs(gc, cfg: KernelConfig, n_chunks: int):
  """``(grow, glc)``: the scalar decay as rows and the vector decay's chunk ends as columns."""
  b, h, tp = gc.shape[:3] if gc is not None else (0, 0, 0)
  grow = glc = None
  if cfg.mode == "scalar":
    grow = gc.reshape(b, h, n_chunks, cfg.chunk)
    if cfg.platform == "tpu":
      grow = grow[:, :, :, None, :]
  elif cfg.mode == "vector":
    kp = gc.shape[-1]
    glc = gc.reshape(b, h, n_chunks, cfg.chunk, kp)[:, :, :, -1, :].reshape(b, h, n_chunks * kp, 1)
  return grow, glc


def _cumulate(g, chunk: int):
  """The log decay ``[B, H, Tp, W]`` cumulated inside each chunk of ``chunk`` steps."""
  if g is None:
    return None
  b, h, tp, w = g.shape
  return jnp.cumsum(g.reshape(b, h, tp // chunk, chunk, w), axis=3).reshape(g.shape)


def _forward_call(cfg, q, k, v, g, s0):
  b, h, tp, kp = q.shape
  vp = v.shape[-1]
  n_chunks = tp // cfg.chunk
  gc = _cumulate(g, cfg.chunk)
  grow, glc = _side_inputs(gc, cfg, n_chunks)
  g_kind = "rows_k" if cfg.mode == "vector" else "rows_1"
  out = _call("fwd", cfg, [
      ("q", q, "rows_k"), ("k", k, "rows_k"), ("v", v, "rows_v"), ("g", gc, g_kind),
      ("grow", grow, "grow"), ("glc", glc, "glc"), ("s0", s0, "state")], [
      ("o", jax.ShapeDtypeStruct((b, h, tp, vp), q.dtype), "rows_v"),
      ("st", jax.ShapeDtypeStruct((b, h, kp, vp), jnp.float32), "state")],
      n_chunks=n_chunks, kp=kp, vp=vp)
  return out["o"], out["st"]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _core(cfg, q, k, v, g, s0):
  """``(o, final_state)`` on padded ``[B, H, Tp, *]`` inputs; ``g`` the log decay
  (float32, ``[B, H, Tp, K]`` or ``[B, H, Tp, 1]``) or None."""
  return _forward_call(cfg, q, k, v, g, s0)


def _core_fwd(cfg, q, k, v, g, s0):
  o, st = _forward_call(cfg, q, k, v, g, s0)
  return (o, st), (q, k, v, g, s0, st)


def _core_bwd(cfg, res, cts):
  """Three kernels: the states entering each chunk of ``cfg.state_chunk`` steps (a
  forward sweep), ``dq`` from them (no sweep), and ``dk, dv, dS0`` (a reverse sweep
  over chunks of ``cfg.chunk`` steps; no states; two with ``cfg.split_dkv``). The log decay's gradient follows
  from ``dq`` and ``dk`` (:func:`_log_decay_grad`)."""
  q, k, v, g, s0, st = res
  do, dst = cts
  b, h, tp, kp = q.shape
  vp = v.shape[-1]
  nv = vp // cfg.block_v
  g_kind = "rows_k" if cfg.mode == "vector" else "rows_1"
  part = jax.ShapeDtypeStruct((nv, b, h, tp, kp), jnp.float32)  # summed over value blocks below

  scfg = dataclasses.replace(cfg, chunk=cfg.state_chunk, sub=min(cfg.sub, cfg.state_chunk))
  n_chunks = tp // scfg.chunk
  shapes = dict(n_chunks=n_chunks, kp=kp, vp=vp)
  gc = _cumulate(g, scfg.chunk)
  grow, glc = _side_inputs(gc, scfg, n_chunks)
  states = _call("states", scfg, [("k", k, "rows_k"), ("v", v, "rows_v"), ("g", gc, g_kind),
                                  ("glc", glc, "glc"), ("s0", s0, "state")],
                 [("states", jax.ShapeDtypeStruct((b, h, n_chunks * kp, vp), jnp.float32),
                   "states")], **shapes)["states"]
  dq = _call("bwd_dq", scfg, [
      ("k", k, "rows_k"), ("v", v, "rows_v"), ("do", do, "rows_v"), ("g", gc, g_kind),
      ("grow", grow, "grow"), ("states", states, "states")], [("dq", part, "part_k")],
      **shapes)["dq"]

  n_chunks = tp // cfg.chunk
  shapes = dict(n_chunks=n_chunks, kp=kp, vp=vp)
  gc = _cumulate(g, cfg.chunk)
  grow, glc = _side_inputs(gc, cfg, n_chunks)
  inputs = [("q", q, "rows_k"), ("k", k, "rows_k"), ("v", v, "rows_v"), ("do", do, "rows_v"),
            ("g", gc, g_kind), ("grow", grow, "grow"), ("glc", glc, "glc"), ("dst", dst, "state")]
  dk_out = ("dk", part, "part_k")
  dv_outs = [("dv", jax.ShapeDtypeStruct((b, h, tp, vp), jnp.float32), "rows_v"),
             ("ds0", jax.ShapeDtypeStruct((b, h, kp, vp), jnp.float32), "state")]
  if cfg.split_dkv:
    # Each sweep carries dS itself; dk needs no k, dv no v.
    out = _call("bwd_dk", dataclasses.replace(cfg, grads="dk"),
                [x for x in inputs if x[0] != "k"], [dk_out], reverse=True, **shapes)
    out |= _call("bwd_dv", dataclasses.replace(cfg, grads="dv"),
                 [x for x in inputs if x[0] != "v"], dv_outs, reverse=True, **shapes)
  else:
    out = _call("bwd_dkv", cfg, inputs, [dk_out] + dv_outs, reverse=True, **shapes)

  dq = jnp.sum(dq, 0) * cfg.scale
  dk = jnp.sum(out["dk"], 0)
  dg = None if cfg.mode == "none" else _log_decay_grad(cfg, q, k, dq, dk, st, dst).astype(g.dtype)
  return (dq.astype(q.dtype), dk.astype(k.dtype), out["dv"].astype(v.dtype), dg,
          out["ds0"].astype(s0.dtype))


def _log_decay_grad(cfg, q, k, dq, dk, st, dst):
  """The log decay's gradient from ``dq`` and ``dk`` (w.r.t. the unscaled query).

  The outputs see the log decays only through their cumulative sum ``G`` in
  the factors ``exp(G_i - G_j)`` between query ``i`` and key ``j`` (the
  initial state is a key at ``G = 0``) and ``exp(G_T - G_j)`` into the final
  state. So ``dL/dG_t = q_t dq_t - k_t dk_t``, plus ``sum_v S_T dS_T`` at the
  last step ``T``, and the log decay at ``s`` gets the sum of ``dL/dG_t``
  over ``t >= s``. Float32, ``[B, H, Tp, K]`` (vector) or ``[B, H, Tp, 1]`` (scalar).
  """
  d = q.astype(jnp.float32) * dq - k.astype(jnp.float32) * dk
  end = jnp.sum(st * dst, axis=-1)[:, :, None, :]  # [B, H, 1, K]
  if cfg.mode == "scalar":
    d, end = jnp.sum(d, -1, keepdims=True), jnp.sum(end, -1, keepdims=True)
  return lax.cumsum(d, axis=2, reverse=True) + end


_core.defvjp(_core_fwd, _core_bwd)

# ------------------------------------------------------------------- public API


def unsupported_arguments(q, log_decay=None, segment_ids=None) -> dict[str, str]:
  """``{argument: why}`` for the arguments this kernel cannot take (empty: all fine)."""
  bad = {}
  if segment_ids is not None:
    bad["segment_ids"] = "packed sequences are not implemented in the kernel"
  bad.update(dispatch.unsupported_dtypes(q=q, log_decay=log_decay))
  return bad


def chunk_decay_attention(
    q: Array,
    k: Array,
    v: Array,
    log_decay: Array | None = None,
    *,
    scale: float | None = None,
    initial_state: Array | None = None,
    return_state: bool = False,
    block_sizes: ChunkDecayBlockSizes | None = None,
    platform: str | None = None,
    interpret=None,
):
  """Diagonal-decay linear attention through the Pallas chunk kernel.

  ``S_t = exp(log_decay_t) * S_{t-1} + k_t v_t^T``, ``o_t = scale * S_t^T q_t``.
  Differentiable in ``q, k, v, log_decay, initial_state`` (a ``custom_vjp``).

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]`` (float32, bfloat16 or float16,
      one dtype).
    log_decay: None, ``[B, T, H]`` or ``[B, T, H, K]``, values ``<= 0``.
    scale: output scale; ``None`` means ``K ** -0.5``.
    initial_state: optional ``[B, H, K, V]`` (float32 inside).
    return_state: also return the final float32 state ``[B, H, K, V]``.
    block_sizes: the tiling (:class:`ChunkDecayBlockSizes`); ``None``:
      ``ChunkDecayBlockSizes.default(platform, q.dtype)``. Any ``T``, ``K``, ``V`` work
      (padded inside).
    platform: ``"gpu"`` (Triton) or ``"tpu"`` (Mosaic) kernel; ``None``: the
      platform of the device the call compiles for (``dispatch.current_platform``),
      GPU on CPU.
    interpret: ``None``: native when compiling for ``platform``, else
      interpret mode (``True`` for the GPU kernel, ``pltpu.InterpretParams()``
      for TPU); ``False`` always compiles the kernel for ``platform``, also for
      a compile-only device on a host without one; or pass either interpret
      mode explicitly.

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)``.
  """
  b, t, h, dk, dv = common.check_qkv(q, k, v)
  common.check_log_decay(log_decay, b, t, h, dk)
  common.check_state("initial_state", initial_state, (b, h, dk, dv))
  if block_sizes is None:
    block_sizes = ChunkDecayBlockSizes.default(platform or dispatch.default_platform(), q.dtype)
  platform, block_sizes, interpret = dispatch.resolve_launch(
      "chunk_decay_attention", unsupported_arguments(q, log_decay), platform, block_sizes,
      ChunkDecayBlockSizes, interpret)
  o, state = _chunk_decay(q, k, v, log_decay, initial_state,
                          scale=common.resolve_scale(scale, dk), block_sizes=block_sizes,
                          platform=platform, interpret=interpret)
  return (o, state) if return_state else o


@functools.partial(jax.jit, static_argnames=("scale", "block_sizes", "platform", "interpret"))
def _chunk_decay(q, k, v, log_decay, initial_state, *, scale, block_sizes, platform, interpret):
  """Layout and padding around :func:`_core`."""
  b, t, h, dk = q.shape
  dv = v.shape[-1]
  kp, vp = blocks.pad_dim(dk, platform), blocks.pad_dim(dv, platform)
  bv = blocks.value_block(vp, block_sizes.block_v, platform)
  vp = dispatch.round_up(vp, bv)
  c = block_sizes.chunk
  sc = block_sizes.state_chunk or c
  tp = dispatch.round_up(t, math.lcm(c, sc))
  mode = "none" if log_decay is None else ("scalar" if log_decay.ndim == 3 else "vector")
  cfg = KernelConfig(mode=mode, chunk=c, sub=block_sizes.sub_chunk, block_v=bv,
                     scale=float(scale), platform=platform, interpret=interpret,
                     exact_dots=jnp.dtype(q.dtype) == jnp.float32, state_chunk=sc,
                     num_warps=block_sizes.num_warps, num_stages=block_sizes.num_stages,
                     split_dkv=block_sizes.split_dkv)

  def layout(x, width):  # [B, T, H, D] -> [B, H, Tp, width], zero padded
    x = jnp.swapaxes(x, 1, 2)
    return jnp.pad(x, ((0, 0), (0, 0), (0, tp - t), (0, width - x.shape[-1])))

  qh, kh, vh = layout(q, kp), layout(k, kp), layout(v, vp)
  g = None
  if mode != "none":
    # -inf (a hard reset) would give inf - inf in the in-chunk cumulative sums:
    # floored where a single step already decays by exactly 0. Padding has log
    # decay 0: the state passes through padded steps unchanged.
    g = common.floor_log_decay(log_decay.astype(jnp.float32))
    g = layout(g if mode == "vector" else g[..., None], kp if mode == "vector" else 1)
  s0 = jnp.zeros((b, h, kp, vp), jnp.float32)
  if initial_state is not None:
    s0 = s0.at[:, :, :dk, :dv].set(initial_state.astype(jnp.float32))
  o, state = _core(cfg, qh, kh, vh, g, s0)
  o = jnp.swapaxes(o[:, :, :t, :dv], 1, 2)
  return o, state[:, :, :dk, :dv]
