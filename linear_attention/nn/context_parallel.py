"""Context parallelism inside the model: the sequence sharded over a mesh axis ``"seq"``.

A model traced under ``jax.set_mesh(mesh)`` with a ``"seq"`` axis of size ``n > 1`` (the
trainer does this when ``config.mesh.seq > 1``) sees global ``[B, T, ...]`` arrays whose
``T`` is split into ``n`` contiguous slices, device ``i`` of the axis holding tokens
``[i T / n, (i + 1) T / n)`` (and the rows split over the other axes, e.g. ``"data"``).
Everything that acts on one token at a time (projections, norms, the MLP, RoPE at global
positions, gates, RWKV's one-token shift) is left to XLA's partitioner, which keeps it
sharded. The ops that mix tokens along the sequence take the mesh as one argument,
``context=``, and every layer passes them :func:`context`: a
:class:`~linear_attention.ops.context.SeqContext` over ``"seq"`` with the other axes as
its batch axes, or None without such a mesh (the layers are then unchanged). How each op
splits its work is written next to it (the engines in ``engines/*/engine.py`` and
``engines/context.py``, log-linear attention in ``ops/loglinear.py``; the halo convolution in
``ops/conv.py``, all-gather attention in ``engines/softmax/engine.py``, the sliding window's
halo in ``ops/sparse.py``).

A mixer class declares ``context_parallel = True`` when every op it calls takes the
context (:class:`~linear_attention.nn.mixer.Mixer`; not inherited). The others refuse a
sharded sequence with a ``ValueError`` naming them rather than letting XLA gather the
whole sequence silently; :data:`REFUSED` says why, per registry name:

- ``longformer``: its global tokens attend to, and are attended by, every token, so each
  layer would all-gather the keys and values of the whole sequence to every device (and
  reduce the global rows' softmax across devices): per-device memory would not shrink
  with the number of devices, which is the point of sharding the sequence;
- ``bigbird``: random and global key blocks anywhere in the sequence: the same all-gather
  of the whole sequence's keys and values per layer.

Linformer runs sharded without a form of its own: its projections over ``T`` are matmuls
that XLA's partitioner splits (a ``psum`` of ``[proj_len, ...]`` per device).

``registry.select(context_parallel=True)`` lists the mixers that run sharded; the test
``tests/nn/test_context_parallel_model.py`` checks each against the unsharded model.
"""

from __future__ import annotations

import jax
from jax.sharding import AbstractMesh

from linear_attention.engines.context import SeqContext

SEQ = "seq"

# Registry names of the mixers that cannot run with the sequence sharded, and why
# (the module docstring says more).
REFUSED: dict[str, str] = {
    "longformer": "global tokens attend to and are attended by every token: an all-gather "
                  "of the whole sequence's keys and values per layer, not sequence-parallel "
                  "in memory",
    "bigbird": "random and global key blocks anywhere in the sequence: an all-gather of the "
               "whole sequence's keys and values per layer, not sequence-parallel in memory",
}


def seq_mesh() -> AbstractMesh | None:
  """The active mesh (``jax.set_mesh``) when it has a ``"seq"`` axis of size > 1, else None.

  Read at trace time, so a jitted model picks it up when it is traced under the mesh (and
  ``jit`` caches per mesh).
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or SEQ not in mesh.axis_names or mesh.shape[SEQ] == 1:
    return None
  return mesh


def constrain_rows(x: jax.Array) -> jax.Array:
  """``x [B, T, ...]`` kept split as the batch is: rows over the active mesh's axes other than
  ``"seq"``, the sequence over ``"seq"`` (when it is sharded); unchanged without a mesh.

  Inside a ``lax.scan`` over layers whose stacked parameters are sharded over features
  (FSDP), XLA's partitioner may otherwise pick a carry sharding that replicates the rows:
  every device then computes the whole global batch.

  Example:
    >>> import jax.numpy as jnp
    >>> constrain_rows(jnp.ones((2, 4, 8))).shape   # no mesh: x itself
    (2, 4, 8)
  """
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or x.ndim < 2:
    return x
  rows = tuple(a for a in mesh.axis_names if a != SEQ and mesh.shape[a] > 1)
  seq = SEQ if seq_mesh() is not None else None
  if not rows and seq is None:
    return x
  spec = jax.sharding.PartitionSpec(rows or None, seq, *([None] * (x.ndim - 2)))
  return jax.lax.with_sharding_constraint(x, spec)


def seq_size() -> int:
  """Devices on the active ``"seq"`` axis (1 when the sequence is not sharded)."""
  mesh = seq_mesh()
  return 1 if mesh is None else mesh.shape[SEQ]


def context() -> SeqContext | None:
  """The ``context=`` the layers pass to their ops: the sequence over the active mesh's
  ``"seq"`` axis and the rows over its other axes, or None when the sequence is not
  sharded (no mesh, no ``"seq"`` axis, or one of size 1)."""
  mesh = seq_mesh()
  if mesh is None:
    return None
  batch = tuple(a for a in mesh.axis_names if a != SEQ)
  return SeqContext(mesh, SEQ, batch or None)
