"""Pallas kernels: the chunked DPLR engine, KDA, RWKV-7 and Gated DeltaProduct (GPU and TPU).

The kernel twin of :func:`linear_attention.ops.dplr.dplr_attention`
(``form="chunk"``)::

    S_t = (diag(exp(log_decay_t)) + a_t b_t^T) S_{t-1} + k_t v_t^T     o_t = scale * S_t^T q_t

with ``R`` such sub-steps per token (DeltaProduct) flattened into ``T R``
sub-steps, the decay on each token's first, the query on its last.

It runs on the state-pass kernels of :mod:`linear_attention.engines.delta.pallas`
with their DPLR algebra (``KernelConfig.dplr``). XLA builds every chunk's
state-independent terms at once (:func:`~linear_attention.engines.dplr.terms.dplr_chunk_terms`:
the per-channel in-chunk scores ``A_qa, A_qk``, the UT transform, ``U_0``,
``W``, the correction and write keys decayed to the chunk's end ``Ae, Ke``,
the per-channel chunk decay ``d`` and ``Qg = Q e^G``); one program per
``(batch, head, value block)`` then walks the chunks with the float32 state
``[K, block_v]`` on chip::

    U = U_0 + W S      O = Qg S + A_qa U      S <- d * S + Ae^T U + Ke^T V

and ``A_qk V`` (state-independent) is added to ``O`` in XLA. What differs
from the delta rule (``D = U - W S``, ``S <- a S + Ke^T D``): the sign of
``W S``, the decay (a ``[K, 1]`` column per chunk instead of a scalar) and the
direct writes ``Ke^T V`` (the delta rule folds its writes into ``U``; here the
correction ``a`` and the write key ``k`` are independent vectors).

The backward is chunk_delta's: the ``states`` sweep (the state entering each
chunk, and ``U``), the reverse sweep carrying ``dS`` (``dU = A_qa^T dO + Ae
dS'``, ``dS = d * dS' + Qg^T dO + W^T dU``), then batched XLA matmuls over all
chunks (``dQg = dO S^T``, ``dA_qa = dO U^T``, ``dW = dU S^T``, ``dAe = U
dS'^T``, ``dKe = V dS'^T``, ``dV = Ke dS'``, ``dd = sum_v S dS'``) and
automatic differentiation of :func:`~linear_attention.engines.dplr.terms.dplr_chunk_terms`.

Tiling and numerics are chunk_delta's (:class:`ChunkDeltaBlockSizes`; ``K``,
``V`` zero-padded to powers of two >= 16 on GPU; bf16 dot operands with
float32 accumulation and state; 3-pass TF32 dots for float32 on GPU). The
kernel's ``o`` is float32 (``A_qk V`` is added to it before the one rounding
to the input dtype). ``chunk_size`` counts sub-steps here (tokens when
``R = 1``): ``R = 3`` still tiles with power-of-two chunks.

Compiled (deviceless, :mod:`tests.kernels.aot`, case
``chunk_dplr/channel/*/gpu_check``: B=4, T=8192, H=16, K=V=128, chunk 64,
default tiling; shared memory per launch in bytes, registers a thread,
spilled bytes stores+loads):

=============  ======  =========================  ==========================
target, dtype  kernel  H200                       A100
=============  ======  =========================  ==========================
bf16           fwd     167936 B, 129 regs, 0      90112 B, 228 regs, 0
bf16           states  122880 B, 128 regs, 0      69632 B, 168 regs, 0
bf16           bwd     139264 B, 126 regs, 0      81920 B, 168 regs, 0
float32        fwd     65536 B, 255 regs, 1000    not compiled
float32        states  65536 B, 255 regs, 232     not compiled
float32        bwd     81920 B, 255 regs, 2140    not compiled
=============  ======  =========================  ==========================

The float32 spills are in ``ACCEPTED_SPILLS`` (``tests/kernels/test_compile_gpu.py``);
the odd shape spills nothing on H200 in either dtype. TPU: Mosaic compiles every
``chunk_dplr`` case for v5e (bf16 and float32, both shapes) and the bf16
``gpu_check`` case for v6e. None has run on hardware yet.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from linear_attention import common
from linear_attention.engines import dispatch
from linear_attention.engines.delta.pallas import _core, blocks
from linear_attention.engines.delta.pallas.blocks import ChunkDeltaBlockSizes, KernelConfig
from linear_attention.engines.dplr import terms as dplr_terms

Array = jax.Array


# ------------------------------------------------------------------- public API


def unsupported_arguments(q, v=None, chunk_size=None, platform=None) -> dict[str, str]:
  """``{argument: why}`` for the arguments this kernel cannot take (empty: all fine).

  Dtypes other than float32/bfloat16/float16, and a ``chunk_size`` the
  ``platform``'s kernel cannot tile (``None``: the default platform). Packed
  ``segment_ids``, ``R`` sub-steps and every decay shape are supported.
  """
  bad = dispatch.unsupported_dtypes(q=q, v=v)
  bad.update(blocks.unsupported_chunk(chunk_size, platform))
  return bad


def chunk_dplr_attention(
    q: Array,
    k: Array,
    v: Array,
    a: Array,
    b: Array,
    log_decay: Array | None = None,
    *,
    scale: float | None = None,
    chunk_size: int = 64,
    initial_state: Array | None = None,
    return_state: bool = False,
    segment_ids: Array | None = None,
    block_sizes: ChunkDeltaBlockSizes | None = None,
    platform: str | None = None,
    interpret=None,
):
  """The DPLR recurrence through the Pallas chunk kernels.

  ``S_t = (diag(exp(log_decay_t)) + a_t b_t^T) S_{t-1} + k_t v_t^T``,
  ``o_t = scale * S_t^T q_t``; the same function as
  ``ops.dplr_attention(form="chunk")``. Differentiable in every array argument.

  Args:
    q: ``[B, T, Hk, K]`` (``H`` a multiple of ``Hk``: grouped value heads, as in
      ``ops.dplr_attention``); its dtype is that of the kernels' dot operands (16-bit
      inputs run on the tensor cores; the state is float32 always).
    k, a, b: ``[B, T, H, K]`` or ``[B, T, H, R, K]`` (``R`` sub-steps per token);
      v: ``[B, T, H, V]`` or ``[B, T, H, R, V]``. ``a`` None means ``a = -k`` (KDA's and
      DeltaProduct's map), whose in-chunk scores are then computed once.
    log_decay: None, ``[B, T, H]`` (per head) or ``[B, T, H, K]`` (per key
      channel), values ``<= 0`` (``-inf`` included; checked when concrete).
    scale: output scale; ``None`` means ``K ** -0.5``.
    chunk_size: sub-steps per chunk (tokens when ``R = 1``): a power of two >= 16
      on GPU, a multiple of 16 on TPU. Any ``T`` works (padded inside).
    initial_state: optional ``[B, H, K, V]`` (float32 inside).
    return_state: also return the final float32 state ``[B, H, K, V]``.
    segment_ids: optional ``[B, T]`` ints packing several sequences per row.
    block_sizes: :class:`~linear_attention.engines.delta.pallas.ChunkDeltaBlockSizes`
      (the kernels are chunk_delta's); ``None``: the platform default.
    platform: ``"gpu"`` (Triton) or ``"tpu"`` (Mosaic); ``None``: the platform
      of the device the call compiles for, GPU on CPU.
    interpret: as in :func:`~linear_attention.engines.decay.pallas_attention`.

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)``.
  """
  bsz, t, h, dk, dv = dplr_terms.check_dplr_inputs(q, k, v, k if a is None else a, b, log_decay)
  common.check_sequence_args("chunk", chunk_size, segment_ids, bsz, t, initial_state,
                             (bsz, h, dk, dv))
  if block_sizes is None:  # the default depends on the dtype too
    block_sizes = ChunkDeltaBlockSizes.default(platform or dispatch.default_platform(), q.dtype)
  platform, block_sizes, interpret = dispatch.resolve_launch(
      "chunk_dplr_attention", unsupported_arguments(q, v), platform, block_sizes,
      ChunkDeltaBlockSizes, interpret)
  blocks.check_chunk(chunk_size, platform)
  if q.shape[2] != h:  # grouped value heads: one program per value head reads its query
    q = jnp.repeat(q, h // q.shape[2], axis=2)
  if k.ndim == 4:  # rank one: R = 1
    k, v, a, b = (None if x is None else x[:, :, :, None] for x in (k, v, a, b))
  if log_decay is not None and log_decay.ndim == 3:  # one decay per head, for every channel
    log_decay = jnp.broadcast_to(log_decay[..., None], log_decay.shape + (dk,))
  o, state = _chunk_dplr(q, k, v, a, b, log_decay, initial_state, segment_ids,
                         scale=common.resolve_scale(scale, dk), chunk=chunk_size,
                         block_sizes=block_sizes, platform=platform, interpret=interpret)
  return (o, state) if return_state else o


@functools.partial(jax.jit, static_argnames=("scale", "chunk", "block_sizes", "platform",
                                             "interpret"))
def _chunk_dplr(q, k, v, a, b, log_decay, initial_state, segment_ids, *, scale, chunk,
                block_sizes, platform, interpret):
  """Sub-steps flattened, the XLA chunk terms, layout and padding around :func:`_core`.
  ``k, a, b [B, T, H, R, K]`` (``a`` None: ``-k``), ``v [B, T, H, R, V]``, ``log_decay [B,
  T, H, K]`` or None."""
  bsz, t, h, dk = q.shape
  r, dv = v.shape[3], v.shape[-1]
  acc = jnp.float32
  kp, vp = blocks.pad_dim(dk, platform), blocks.pad_dim(dv, platform)
  bv = blocks.value_block(vp, block_sizes.block_v, platform)
  vp = dispatch.round_up(vp, bv)
  cfg = KernelConfig(chunk=chunk, block_v=bv, platform=platform, interpret=interpret,
                     exact_dots=jnp.dtype(q.dtype) == jnp.float32, dplr=True,
                     num_warps=block_sizes.num_warps, num_stages=block_sizes.num_stages)

  # [B, T, H, R, *] -> [B, H, T R, *]; the query on each token's last sub-step, the decay
  # on its first, zero on the others.
  flat = lambda x: jnp.swapaxes(x, 1, 2).reshape(bsz, h, t * r, x.shape[-1]).astype(acc)
  def one_substep(x, j):
    x = x.astype(acc)[:, :, :, None]
    return jnp.concatenate([jnp.zeros_like(x)] * j + [x] + [jnp.zeros_like(x)] * (r - 1 - j),
                           axis=3)
  qh = flat(one_substep(q, r - 1)) * jnp.asarray(scale, acc)
  g = None if log_decay is None else flat(one_substep(common.floor_log_decay(
      log_decay.astype(acc)), 0))  # floored: -inf would give inf - inf in the cumsums
  seg = None if segment_ids is None else jnp.repeat(common.segment_index(segment_ids), r, 1)
  qg, a_qa, a_qk, u0, w, a_end, k_end, decay = dplr_terms.dplr_chunk_terms(
      qh, flat(k), flat(v), None if a is None else flat(a), flat(b), g, seg, chunk)
  n = decay.shape[2]
  tp = n * chunk

  def rows(x, width):  # [B, H, N, C, D] -> [B, H, Tp, width] in the input dtype, zero padded
    x = x.reshape(bsz, h, tp, x.shape[-1])
    return jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, width - x.shape[-1]))).astype(q.dtype)

  vc = common.pad_axis(flat(v), chunk, axis=2).reshape(bsz, h, n, chunk, dv)
  s0 = jnp.zeros((bsz, h, kp, vp), acc)
  if initial_state is not None:
    s0 = s0.at[:, :, :dk, :dv].set(initial_state.astype(acc))
  decay = jnp.pad(decay, ((0, 0), (0, 0), (0, 0), (0, kp - dk)))
  o, state = _core(cfg, rows(qg, kp), rows(a_qa, chunk), rows(u0, vp), rows(w, kp),
                   rows(a_end, kp), decay, s0, rows(k_end, kp), rows(vc, vp))
  o = o[..., :dv] + (a_qk @ vc).reshape(bsz, h, tp, dv)
  o = o[:, :, r - 1:t * r:r]  # the read after each token's last sub-step
  return jnp.swapaxes(o, 1, 2).astype(q.dtype), state[:, :, :dk, :dv]
