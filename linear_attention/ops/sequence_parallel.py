"""Deprecated: the sequence-parallel twins, kept one release for old callers.

Every engine and variant now takes ``context=``
(:class:`~linear_attention.ops.context.SeqContext`): ``sequence_parallel_gla(...,
mesh=mesh, axis_name="seq", batch_axis=None)`` is ``gla(...,
context=SeqContext(mesh, "seq", None))``, and each function here is exactly that
call. The algorithms are documented next to the engines (for the diagonal decay:
``ops/decay.py``, ``_sequence_parallel``; for the delta rule and DPLR:
:func:`~linear_attention.ops.context.affine_call`; for the scan: ``ops/scan.py``).
The short convolution and softmax twins call ``causal_conv1d`` and
``softmax_attention`` with ``context=`` the same way.
"""

from __future__ import annotations

from typing import Sequence

import jax
from jax.sharding import AbstractMesh, Mesh

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
                                    batch_axis: str | Sequence[str] | None = None, **kwargs):
  """``causal_conv1d(..., context=SeqContext(mesh, axis_name, batch_axis), **kwargs)``."""
  return conv_ops.causal_conv1d(x, weight, bias, context=_context(mesh, axis_name, batch_axis),
                                **kwargs)


def sequence_parallel_softmax_attention(q: Array, k: Array, v: Array, *,
                                        mesh: Mesh | AbstractMesh, axis_name: str = "seq",
                                        batch_axis: str | Sequence[str] | None = None,
                                        **kwargs) -> Array:
  """``softmax_attention(..., context=SeqContext(mesh, axis_name, batch_axis), **kwargs)``."""
  return softmax_ops.softmax_attention(q, k, v, context=_context(mesh, axis_name, batch_axis),
                                       **kwargs)
