"""Pallas kernels: the chunked delta rule, DeltaNet and Gated DeltaNet (GPU and TPU).

The kernel twin of :func:`linear_attention.ops.delta.delta_rule`
(``form="chunk"``)::

    S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T     o_t = scale * S_t^T q_t

with ``a_t = exp(log_decay_t)`` a scalar gate per head and step (or 1).

Split of the work (the chunk algebra is in :mod:`linear_attention.engines.delta.engine`'s
docstring). Everything that does not depend on the state entering a chunk
stays in XLA, for all chunks at once (:func:`_prepare`): the ``C x C`` masked
and decayed scores ``Am``, the UT transform ``(I + L)^{-1}``,
``U = (I + L)^{-1} diag(beta) V`` and ``W = (I + L)^{-1} diag(beta e^G) K``,
the decayed queries ``Qg = Q e^G`` and keys ``Ke = K e^{G_C - G}``, and the
chunk decay ``a = e^{G_C}``; segment masks fold into these. The kernels do
the sequential part, the part ``lax.scan`` does badly on a GPU: one program
per ``(batch, head, value block)`` walks the chunks with the float32 state
``[K, block_v]`` on chip::

    D = U - W S          O = Qg S + Am D          S <- a S + Ke^T D

* ``fwd``: writes ``O`` and the final state (no per-chunk state goes to HBM).
* ``states`` (backward only): the same sweep writing the state entering each
  chunk (a transient ``[chunks, K, V]`` float32 buffer) and ``D``.
* ``bwd``: the reverse sweep carrying ``dS`` on chip: per chunk
  ``dD = Am^T dO + Ke dS'`` and ``dS = a dS' + Qg^T dO - W^T dD``; writes
  ``dD``, the ``dS'`` leaving each chunk and ``dS_0``.

The kernels' ``custom_vjp`` then forms the remaining gradients with batched
XLA matmuls over all chunks (``dU = dD``, ``dW = -dD S^T``, ``dQg = dO S^T``,
``dAm = dO D^T``, ``dKe = D dS'^T``, ``da = <S, dS'>``), and automatic
differentiation of :func:`_prepare` carries them to ``q, k, v, beta``,
``log_decay`` (and through the UT transform's own VJP).

Layout of this package, as ``chunk_decay/``: ``__init__`` (this file: the API,
the XLA side and the ``custom_vjp``), ``blocks.py`` (tiling, static config,
the per-chunk block logic ``fwd_block``/``bwd_block``) and two entry points:

* ``triton.py``, GPU (Triton): grid ``(B, H, V / block_v)``, whole-sequence
  refs, ``fori_loop`` over chunks, the state in registers. ``K``, ``V`` are
  zero-padded to powers of two >= 16; ``chunk_size`` a power of two >= 16.
* ``mosaic_tpu.py``, TPU (Mosaic): grid ``(B, H, V / block_v, chunks)``, the
  chunk axis "arbitrary", the state in a VMEM scratch; ``chunk_size`` a
  multiple of 16, ``block_v`` a multiple of 128 or all of ``V``.

Numerics: the kernels' dot operands are in the input dtype (bfloat16 runs on
the tensor cores: ``Qg, W, Ke, Am, U`` are rounded to it once, the float32
state and ``D`` where they meet a dot) with float32 accumulation and a float32
state; float32 inputs use full float32 dots. Decay factors are ``exp`` of
non-positive numbers, as in the XLA op.

Compiled (deviceless, ``tests.kernels.aot``; B=4, T=8192, H=16,
K=V=128, chunk 64, default tiling; shared memory per launch in bytes,
registers a thread, spilled bytes stores+loads):

=============  ======  =========================  ==========================
target, dtype  kernel  H200                       A100
=============  ======  =========================  ==========================
bf16           fwd     126976 B, 120 regs, 0      69632 B, 214 regs, 0
bf16           states  86016 B, 120 regs, 0       53248 B, 166 regs, 0
bf16           bwd     139264 B, 138 regs, 0      77824 B, 228 regs, 0
float32        fwd     65536 B, 255 regs, 704     65536 B, 255 regs, 3084
float32        states  65536 B, 255 regs, 40      65536 B, 255 regs, 552
float32        bwd     81920 B, 255 regs, 1180    65536 B, 168 regs, 5848
=============  ======  =========================  ==========================

Float32 uses three-pass TF32 dots on the GPU (``blocks._dot``) and one
pipeline stage; TPU v5e and v6e compile the same programs (Mosaic).

The same kernels run the DPLR engine (:mod:`linear_attention.engines.dplr.pallas`)
with ``KernelConfig.dplr``: ``D = U + W S``, a per-channel chunk decay and
direct writes ``Wk^T Wv`` (``_core``'s ``wk, wv``).

``segment_ids`` (packed sequences) are supported: their masks live entirely
in the XLA part (as in ``ops.delta``), the kernels never see them.

Grouped value heads (``q, k`` with ``Hk`` heads, ``Hv = G Hk`` value heads): the grid runs
over the value heads. ``Qg, Am, Ke`` carry the per-value-head gate when there is one, so
they are built per value head; without a gate they are built once per query/key head and
the kernels read them at head ``h // G`` (BlockSpec index maps, ``KernelConfig.group``),
their gradients summed over the group.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from linear_attention.engines import dispatch
from linear_attention.engines.delta.pallas import blocks, mosaic_tpu, triton
from linear_attention.engines.delta.pallas.blocks import ChunkDeltaBlockSizes, KernelConfig
from linear_attention import common
from linear_attention.engines.delta import terms as delta_terms

Array = jax.Array


def _call(kind, cfg: KernelConfig, inputs, outputs, **kw):
  entry = dispatch.lowering(cfg.platform, triton=triton, mosaic_tpu=mosaic_tpu)
  return entry.call(kind, cfg, inputs, outputs, **kw)


def _writes(wk, wv):
  """The DPLR direct writes as kernel inputs (none for the delta rule)."""
  return [] if wk is None else [("wk", wk, "rows_k"), ("wv", wv, "rows_v")]


def _shared(x, kind, h):
  """``kind``, or its ``_group`` twin for an input with one head per group of ``cfg.group``
  value heads (a gate-free delta rule's ``Qg, Am, Ke``: read at head ``h // group``)."""
  return kind if x.shape[1] == h else kind + "_group"


def _forward_call(cfg, qg, am, u, w, ke, decay, s0, wk, wv):
  b, h, vp = u.shape[0], u.shape[1], u.shape[-1]
  tp, kp = qg.shape[2:]
  # DPLR: o in float32, the state-independent A_qk V is added to it outside.
  o_dtype = jnp.float32 if cfg.dplr else qg.dtype
  out = _call("fwd", cfg, [
      ("qg", qg, _shared(qg, "rows_k", h)), ("am", am, _shared(am, "rows_c", h)),
      ("u", u, "rows_v"), ("w", w, "rows_k"),
      ("ke", ke, _shared(ke, "rows_k", h))] + _writes(wk, wv) + [
      ("decay", decay, "decay"), ("s0", s0, "state")], [
      ("o", jax.ShapeDtypeStruct((b, h, tp, vp), o_dtype), "rows_v"),
      ("st", jax.ShapeDtypeStruct((b, h, kp, vp), jnp.float32), "state")],
      n_chunks=tp // cfg.chunk, kp=kp, vp=vp)
  return out["o"], out["st"]


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _core(cfg, qg, am, u, w, ke, decay, s0, wk, wv):
  """``(o, final_state)`` from the prepared, padded ``[B, H, Tp, *]`` chunk inputs
  (``decay [B, H, N, 1]`` float32, or ``[B, H, N, Kp]`` for DPLR; ``s0 [B, H, Kp, Vp]``
  float32; ``wk [.., Kp]``, ``wv [.., Vp]``: DPLR's direct writes, None for the delta rule)."""
  return _forward_call(cfg, qg, am, u, w, ke, decay, s0, wk, wv)


def _core_fwd(cfg, *args):
  return _forward_call(cfg, *args), args


def _core_bwd(cfg, res, cts):
  qg, am, u, w, ke, decay, s0, wk, wv = res
  do, dst = cts
  b, h, vp = u.shape[0], u.shape[1], u.shape[-1]
  tp, kp = qg.shape[2:]
  c = cfg.chunk
  n = tp // c
  kw = dict(n_chunks=n, kp=kp, vp=vp)
  f32 = jnp.float32
  fwd = _call("states", cfg, [
      ("u", u, "rows_v"), ("w", w, "rows_k"), ("ke", ke, _shared(ke, "rows_k", h))]
      + _writes(wk, wv) + [
      ("decay", decay, "decay"), ("s0", s0, "state")], [
      ("states", jax.ShapeDtypeStruct((b, h, n * kp, vp), f32), "states"),
      ("d", jax.ShapeDtypeStruct((b, h, tp, vp), f32), "rows_v")], **kw)
  bwd = _call("bwd", cfg, [
      ("qg", qg, _shared(qg, "rows_k", h)), ("am", am, _shared(am, "rows_c", h)),
      ("w", w, "rows_k"), ("ke", ke, _shared(ke, "rows_k", h)),
      ("decay", decay, "decay"), ("do", do, "rows_v"), ("dst", dst, "state")], [
      ("dd", jax.ShapeDtypeStruct((b, h, tp, vp), f32), "rows_v"),
      ("dsl", jax.ShapeDtypeStruct((b, h, n * kp, vp), f32), "states"),
      ("ds0", jax.ShapeDtypeStruct((b, h, kp, vp), f32), "state")], **kw)
  # The rest is parallel over chunks: batched matmuls in XLA.
  chunks = lambda x: x.reshape(b, h, n, -1, x.shape[-1]).astype(f32)
  s, dsl = chunks(fwd["states"]), chunks(bwd["dsl"])  # [B, H, N, Kp, Vp]
  d, dd, dof = chunks(fwd["d"]), chunks(bwd["dd"]), chunks(do)  # [B, H, N, C, Vp]
  precision = jax.lax.Precision.HIGHEST if cfg.exact_dots else None
  mm = functools.partial(jnp.einsum, precision=precision)
  # A group-shared input's gradient is the sum over the value heads of its group.
  rows = lambda x, like: x.reshape((b, like.shape[1], -1) + x.shape[2:]).sum(2).reshape(
      like.shape).astype(like.dtype)
  dqg = mm("bhncv,bhnkv->bhnck", dof, s)
  dam = mm("bhniv,bhnjv->bhnij", dof, d)
  dw = mm("bhncv,bhnkv->bhnck", dd, s)
  dke = mm("bhncv,bhnkv->bhnck", d, dsl)
  ddecay = jnp.sum(s * dsl, axis=-1)  # [B, H, N, Kp]
  if not cfg.dplr:  # D = U - W S, one decay per chunk
    dw, ddecay = -dw, jnp.sum(ddecay, axis=-1, keepdims=True)
  dwk = dwv = None
  if wk is not None:
    dwk = rows(mm("bhncv,bhnkv->bhnck", chunks(wv), dsl), wk)
    dwv = rows(mm("bhnck,bhnkv->bhncv", chunks(wk), dsl), wv)
  return (rows(dqg, qg), rows(dam, am), rows(dd, u), rows(dw, w), rows(dke, ke),
          ddecay.astype(decay.dtype), bwd["ds0"].astype(s0.dtype), dwk, dwv)


_core.defvjp(_core_fwd, _core_bwd)


def _prepare(q, k, v, beta, log_decay, seg, scale, c):
  """The state-independent chunk quantities, for all chunks at once (XLA).

  Inputs in the ops' layout (``[B, T, H, *]``, ``q, k`` with ``Hk`` heads and the rest
  with ``Hv``; ``seg`` from ``common.segment_index`` or None). Returns float32
  ``(qg, am, u, w, ke)``, each ``[B, Hv, N, C, *]`` (``am``: ``[..., C, C]``),
  and ``decay [B, Hv, N]``: :func:`~linear_attention.engines.delta.terms.delta_chunk_terms`,
  the same quantities as the XLA chunk form builds before its scan.
  """
  acc = jnp.float32
  b, hk, hv = q.shape[0], q.shape[2], v.shape[2]
  grouped = lambda x: None if x is None else common.group_heads(x, hk).astype(acc)
  qh, kh, vh, bh = (grouped(x) for x in (q, k, v, beta))
  # -inf (a hard reset) would give inf - inf in the cumulative sums: floored.
  g = common.floor_log_decay(grouped(log_decay))
  terms = delta_terms.delta_chunk_terms(qh * jnp.asarray(scale, acc), kh, vh, bh, g, seg, c)
  # [B, Hk, G, ...] -> [B, Hv, ...] (one kernel program per value head), except what has
  # no per-value-head factor (a gate-free call's Qg, Am, Ke): [B, Hk, ...], read by the
  # kernels at head h // G. The chunk decays (small) always per value head.
  flat = lambda x: x.reshape((b, hk) + x.shape[3:]) if x.shape[2] == 1 < hv // hk else (
      jnp.broadcast_to(x, (b, hk, hv // hk) + x.shape[3:]).reshape((b, hv) + x.shape[3:]))
  *rest, decay = terms
  return tuple(flat(x) for x in rest) + (
      jnp.broadcast_to(decay, (b, hk, hv // hk) + decay.shape[3:]).reshape(
          (b, hv) + decay.shape[3:]),)


# ------------------------------------------------------------------- public API


def unsupported_arguments(q, beta=None, log_decay=None, segment_ids=None, chunk_size=None,
                          platform=None) -> dict[str, str]:
  """``{argument: why}`` for the arguments this kernel cannot take (empty: all fine).

  Dtypes other than float32/bfloat16/float16, and a ``chunk_size`` the
  ``platform``'s kernel cannot tile (``None``: the default platform). Packed
  ``segment_ids`` are supported.
  """
  del segment_ids
  bad = dispatch.unsupported_dtypes(q=q, beta=beta, log_decay=log_decay)
  bad.update(blocks.unsupported_chunk(chunk_size, platform))
  return bad


def chunk_delta_attention(
    q: Array,
    k: Array,
    v: Array,
    beta: Array,
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
  """The (gated) delta rule through the Pallas chunk kernels.

  ``S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T`` with
  ``a_t = exp(log_decay_t)`` (1 without a gate), ``o_t = scale * S_t^T q_t``;
  the same function as ``ops.delta_rule(form="chunk")``. Differentiable in
  ``q, k, v, beta, log_decay, initial_state``. Grouped value heads as in
  ``ops.delta_rule``: ``q, k`` may have ``Hk`` heads, ``H`` a multiple of ``Hk``.

  Args:
    q, k: ``[B, T, Hk, K]`` (keys expected L2-normalised by the caller);
      v: ``[B, T, H, V]`` (float32, bfloat16 or float16, one dtype).
    beta: ``[B, T, H]`` write strengths in ``[0, 2]`` (checked when concrete).
    log_decay: None (DeltaNet) or ``[B, T, H]`` values ``<= 0`` (Gated DeltaNet).
    scale: output scale; ``None`` means ``K ** -0.5``.
    chunk_size: tokens per chunk: a power of two >= 16 on GPU, a multiple of
      16 on TPU. Any ``T`` works (padded inside).
    initial_state: optional ``[B, H, K, V]`` (float32 inside).
    return_state: also return the final float32 state ``[B, H, K, V]``.
    segment_ids: optional ``[B, T]`` ints packing several sequences per row
      (as in ``ops.delta_rule``).
    block_sizes: :class:`ChunkDeltaBlockSizes`; ``None``: the platform default.
    platform: ``"gpu"`` (Triton) or ``"tpu"`` (Mosaic); ``None``: the platform
      of the device the call compiles for, GPU on CPU.
    interpret: as in :func:`~linear_attention.engines.decay.pallas_attention`.

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, or ``(o, state)``.
  """
  b, t, _, dk, dv = common.check_qkv(q, k, v, grouped=True)
  h = v.shape[2]
  common.check_beta(beta, (b, t, h), "[B, T, Hv], Hv the heads of v")
  common.check_log_decay(log_decay, b, t, h, dk, per_channel=False)
  common.check_sequence_args("chunk", chunk_size, segment_ids, b, t, initial_state, (b, h, dk, dv))
  if block_sizes is None:  # the default depends on the dtype too
    block_sizes = ChunkDeltaBlockSizes.default(platform or dispatch.default_platform(), q.dtype)
  platform, block_sizes, interpret = dispatch.resolve_launch(
      "chunk_delta_attention", unsupported_arguments(q, beta, log_decay), platform, block_sizes,
      ChunkDeltaBlockSizes, interpret)
  blocks.check_chunk(chunk_size, platform)
  o, state = _chunk_delta(q, k, v, beta, log_decay, initial_state, segment_ids,
                          scale=common.resolve_scale(scale, dk), chunk=chunk_size,
                          block_sizes=block_sizes, platform=platform, interpret=interpret)
  return (o, state) if return_state else o


@functools.partial(jax.jit, static_argnames=("scale", "chunk", "block_sizes", "platform",
                                             "interpret"))
def _chunk_delta(q, k, v, beta, log_decay, initial_state, segment_ids, *, scale, chunk,
                 block_sizes, platform, interpret):
  """The XLA preparation, layout and padding around :func:`_core`."""
  b, t, _, dk = q.shape
  h, dv = v.shape[2:]
  kp, vp = blocks.pad_dim(dk, platform), blocks.pad_dim(dv, platform)
  bv = blocks.value_block(vp, block_sizes.block_v, platform)
  vp = dispatch.round_up(vp, bv)
  cfg = KernelConfig(chunk=chunk, block_v=bv, platform=platform, interpret=interpret,
                     exact_dots=jnp.dtype(q.dtype) == jnp.float32,
                     num_warps=block_sizes.num_warps, num_stages=block_sizes.num_stages,
                     group=h // q.shape[2])
  seg = None if segment_ids is None else common.segment_index(segment_ids)
  qg, am, u, w, ke, decay = _prepare(q, k, v, beta, log_decay, seg, scale, chunk)
  tp = decay.shape[-1] * chunk

  def rows(x, width):  # [B, H, N, C, D] -> [B, H, Tp, width] in the input dtype, zero padded
    x = x.reshape(b, x.shape[1], tp, x.shape[-1])
    return jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, width - x.shape[-1]))).astype(q.dtype)

  s0 = jnp.zeros((b, h, kp, vp), jnp.float32)
  if initial_state is not None:
    s0 = s0.at[:, :, :dk, :dv].set(initial_state.astype(jnp.float32))
  o, state = _core(cfg, rows(qg, kp), rows(am, chunk), rows(u, vp), rows(w, kp), rows(ke, kp),
                   decay[..., None], s0, None, None)
  return jnp.swapaxes(o[:, :, :t, :dv], 1, 2), state[:, :, :dk, :dv]
