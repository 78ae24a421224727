"""Deprecated: the sequence-parallel twins, kept one release for old callers.

Every engine and variant now takes ``context=``
(:class:`~linear_attention.ops.context.SeqContext`): ``sequence_parallel_gla(...,
mesh=mesh, axis_name="seq", batch_axis=None)`` is ``gla(...,
context=SeqContext(mesh, "seq", None))``, and each function here is exactly that
call. The algorithms are documented next to the engines (for the diagonal decay:
``ops/decay.py``, ``_sequence_parallel``; for the delta rule and DPLR:
:func:`~linear_attention.ops.context.affine_call`; for the scan: ``ops/scan.py``).
The short convolution and softmax twins at the end still hold their own
implementations until ``causal_conv1d`` and ``softmax_attention`` take ``context=``.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AbstractMesh, Mesh
from jax.sharding import PartitionSpec as P

from linear_attention import common
from linear_attention.ops import decay, gated
from linear_attention.ops import conv as conv_ops
from linear_attention.ops import linear as linear_ops
from linear_attention.ops import softmax as softmax_ops
from linear_attention.ops.context import SeqContext, axis_index

Array = jax.Array


def _context(mesh, axis_name, batch_axis) -> SeqContext:
  if isinstance(batch_axis, list):
    batch_axis = tuple(batch_axis)
  return SeqContext(mesh, axis_name, batch_axis)


def sequence_parallel_decay_attention_local(
    q: Array, k: Array, v: Array, log_decay: Array | None = None, *, axis_name: str = "seq",
    scale: float | None = None, chunk_size: int = 64, initial_state: Array | None = None,
    return_state: bool = False, segment_ids: Array | None = None):
  """Inside the caller's ``jax.shard_map`` over ``axis_name``: ``decay_linear_attention(...,
  context=SeqContext(jax.sharding.get_abstract_mesh(), axis_name))`` on local slices.

  Returns ``o`` (the local slice) or ``(o, state)``, the final state of the whole
  sequence, identical on every device of the axis.
  """
  axis_index(axis_name)  # a ValueError outside a shard_map binding the axis
  return decay.decay_linear_attention(
      q, k, v, log_decay, scale=scale, chunk_size=chunk_size, initial_state=initial_state,
      return_state=return_state, segment_ids=segment_ids,
      context=SeqContext(jax.sharding.get_abstract_mesh(), axis_name))


def sequence_parallel_decay_attention(
    q: Array, k: Array, v: Array, log_decay: Array | None = None, *,
    mesh: Mesh | AbstractMesh, axis_name: str = "seq",
    batch_axis: str | Sequence[str] | None = None, scale: float | None = None,
    chunk_size: int = 64, initial_state: Array | None = None, return_state: bool = False,
    segment_ids: Array | None = None):
  """``decay_linear_attention(..., context=SeqContext(mesh, axis_name, batch_axis))``."""
  return decay.decay_linear_attention(
      q, k, v, log_decay, scale=scale, chunk_size=chunk_size, initial_state=initial_state,
      return_state=return_state, segment_ids=segment_ids,
      context=_context(mesh, axis_name, batch_axis))


def sequence_parallel_gla(q: Array, k: Array, v: Array, log_g: Array, *,
                          mesh: Mesh | AbstractMesh, axis_name: str = "seq",
                          batch_axis: str | Sequence[str] | None = None, **kwargs):
  """``gla(..., context=SeqContext(mesh, axis_name, batch_axis), **kwargs)``."""
  return gated.gla(q, k, v, log_g, context=_context(mesh, axis_name, batch_axis), **kwargs)


def sequence_parallel_ssd(x: Array, dt: Array, A: Array, B: Array, C: Array,
                          D: Array | None = None, *, mesh: Mesh | AbstractMesh,
                          axis_name: str = "seq",
                          batch_axis: str | Sequence[str] | None = None, **kwargs):
  """``ssd(..., context=SeqContext(mesh, axis_name, batch_axis), **kwargs)``."""
  return gated.ssd(x, dt, A, B, C, D, context=_context(mesh, axis_name, batch_axis), **kwargs)


def sequence_parallel_retention(q: Array, k: Array, v: Array, *, mesh: Mesh | AbstractMesh,
                                axis_name: str = "seq",
                                batch_axis: str | Sequence[str] | None = None, **kwargs):
  """``retention(..., context=SeqContext(mesh, axis_name, batch_axis), **kwargs)``."""
  return gated.retention(q, k, v, context=_context(mesh, axis_name, batch_axis), **kwargs)


def sequence_parallel_hgrn2(q: Array, log_f: Array, v: Array, *, mesh: Mesh | AbstractMesh,
                            axis_name: str = "seq",
                            batch_axis: str | Sequence[str] | None = None, **kwargs):
  """``hgrn2(..., context=SeqContext(mesh, axis_name, batch_axis), **kwargs)``."""
  return gated.hgrn2(q, log_f, v, context=_context(mesh, axis_name, batch_axis), **kwargs)


def sequence_parallel_linear_attention(q: Array, k: Array, v: Array, *,
                                       mesh: Mesh | AbstractMesh, axis_name: str = "seq",
                                       batch_axis: str | Sequence[str] | None = None,
                                       **kwargs):
  """``linear_attention(..., context=SeqContext(mesh, axis_name, batch_axis), **kwargs)``."""
  return linear_ops.linear_attention(q, k, v, context=_context(mesh, axis_name, batch_axis),
                                     **kwargs)


def sequence_parallel_rebased_attention(q: Array, k: Array, v: Array, gamma: Array,
                                        beta: Array, *, mesh: Mesh | AbstractMesh,
                                        axis_name: str = "seq",
                                        batch_axis: str | Sequence[str] | None = None,
                                        **kwargs):
  """``rebased_attention(..., context=SeqContext(mesh, axis_name, batch_axis), **kwargs)``."""
  return linear_ops.rebased_attention(q, k, v, gamma, beta,
                                      context=_context(mesh, axis_name, batch_axis), **kwargs)


# ------------------------------------------------- token mixing beyond the engine


def sequence_parallel_causal_conv1d(x: Array, weight: Array, bias: Array | None = None, *,
                                    mesh: Mesh | AbstractMesh, axis_name: str = "seq",
                                    batch_axis: str | Sequence[str] | None = None,
                                    segment_ids: Array | None = None,
                                    activation: str | None = None) -> Array:
  """:func:`~linear_attention.ops.conv.causal_conv1d` with the sequence split over ``axis_name``.

  Each device receives the last ``W - 1`` inputs of the previous device (one
  ``ppermute``: the halo; the first device gets zeros, the causal padding) and
  convolves its slice with the halo in front, so the sequence is never gathered.
  With ``segment_ids`` the halo's ids travel along and the op's own segment
  masking decides which halo taps a token may read.

  Args:
    x: ``[B, T, D]``; weight: ``[W, D]``; bias: optional ``[D]``.
    mesh, axis_name, batch_axis, segment_ids: as in
      :func:`sequence_parallel_decay_attention`; each device's slice must hold at
      least ``W - 1`` tokens.
    activation: ``None`` or ``"silu"``.

  Returns:
    ``y`` ``[B, T, D]`` in the dtype of ``x``, sharded along ``T``.
  """
  common.check_rank("x", x, 3)
  b, t, _ = x.shape
  ctx = _context(mesh, axis_name, batch_axis)
  ctx.check(b, t)
  common.check_segment_ids(segment_ids, b, t)
  halo = weight.shape[0] - 1
  n = mesh.shape[axis_name]
  if halo > t // n:
    raise ValueError(
        f"the short convolution of width {halo + 1} needs at least {halo} tokens per device "
        f"of mesh axis {axis_name!r}, got T / {n} = {t // n}; use a longer sequence or fewer "
        "devices on that axis.")
  if halo == 0:
    return conv_ops.causal_conv1d(x, weight, bias, segment_ids=segment_ids,
                                  activation=activation)
  spec = ctx.seq_spec
  # Device i sends its tail to device i + 1; nobody sends to device 0 (it receives zeros).
  perm = [(i, i + 1) for i in range(n - 1)]

  def body(x, weight, bias=None, segment_ids=None):
    xs = jnp.concatenate([lax.ppermute(x[:, -halo:], axis_name, perm), x], axis=1)
    seg = None
    if segment_ids is not None:
      seg = jnp.concatenate([lax.ppermute(segment_ids[:, -halo:], axis_name, perm),
                             segment_ids], axis=1)
    y = conv_ops.causal_conv1d(xs, weight, bias, segment_ids=seg, activation=activation)
    return y[:, halo:]

  return ctx.shard(body, {"x": (x, spec), "weight": (weight, P()), "bias": (bias, P()),
                          "segment_ids": (segment_ids, spec)}, spec)


def sequence_parallel_softmax_attention(q: Array, k: Array, v: Array, *,
                                        mesh: Mesh | AbstractMesh, axis_name: str = "seq",
                                        batch_axis: str | Sequence[str] | None = None,
                                        causal: bool = False, scale: float | None = None,
                                        segment_ids: Array | None = None,
                                        implementation: str | None = None) -> Array:
  """Exact softmax attention with the sequence split over ``axis_name``: all-gather attention.

  Each device keeps its queries and gathers every key and value of the axis
  (one ``all_gather`` each); its queries sit at global positions
  ``[i * T / n, (i + 1) * T / n)``, which sets the causal mask. The logits are
  ``[B, H, T / n, T]`` per device, so memory is ``1 / n`` of the one-device
  naive form's (not the ``O(T)`` of a ring or blockwise pass).

  Args:
    q, k: ``[B, T, H, K]``; v: ``[B, T, H, V]``.
    mesh, axis_name, batch_axis, segment_ids: as in
      :func:`sequence_parallel_decay_attention`.
    causal, scale: as in :func:`~linear_attention.ops.softmax.softmax_attention`.
    implementation: ``None`` or ``"xla"`` (the per-device attention is XLA's).

  Returns:
    ``o`` ``[B, T, H, V]`` in the dtype of ``q``, sharded along ``T``.
  """
  b, t, _, dk, _ = common.check_attention(q, k, v, segment_ids)
  if implementation not in (None, "xla"):
    raise ValueError(f"implementation must be None or 'xla' for all-gather attention (no "
                     f"Pallas kernel takes a query offset), got {implementation!r}.")
  ctx = _context(mesh, axis_name, batch_axis)
  ctx.check(b, t)
  scale = common.resolve_scale(scale, dk)
  spec = ctx.seq_spec

  def body(q, k, v, segment_ids=None):
    tl = q.shape[1]
    start = lax.axis_index(axis_name) * tl
    k_all = lax.all_gather(k, axis_name, axis=1, tiled=True)
    v_all = lax.all_gather(v, axis_name, axis=1, tiled=True)
    visible = jnp.ones((1, tl, t), bool)
    if causal:
      visible = (jnp.arange(t)[None, :] <= start + jnp.arange(tl)[:, None])[None]
    if segment_ids is not None:
      # Runs are counted on the whole row, so a reused id is still another segment.
      run = common.segment_index(lax.all_gather(segment_ids, axis_name, axis=1, tiled=True))
      run_q = lax.dynamic_slice_in_dim(run, start, tl, axis=1)
      visible = visible & (run_q[:, :, None] == run[:, None, :])
    o, _ = softmax_ops.dense_attention_stats(q, k_all, v_all, visible, scale)
    return o.astype(q.dtype)

  return ctx.shard(body, {"q": (q, spec), "k": (k, spec), "v": (v, spec),
                          "segment_ids": (segment_ids, spec)}, spec)
