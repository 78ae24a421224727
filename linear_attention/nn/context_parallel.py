"""Context parallelism inside the model: the sequence sharded over a mesh axis ``"seq"``.

A model traced under ``jax.set_mesh(mesh)`` with a ``"seq"`` axis of size ``n > 1`` (the
trainer does this when ``config.mesh.seq > 1``) sees global ``[B, T, ...]`` arrays whose
``T`` is split into ``n`` contiguous slices, device ``i`` of the axis holding tokens
``[i T / n, (i + 1) T / n)`` (and the rows split over the other axes, e.g. ``"data"``).
Everything that acts on one token at a time (projections, norms, the MLP, RoPE at global
positions, gates) is left to XLA's partitioner, which keeps it sharded. Only the places
that mix tokens along the sequence consult this module, through one call, :func:`op`:

- the diagonal-decay engine ops (``gla``, ``retention``, ``hgrn2``, ``ssd``,
  ``linear_attention``, ``rebased_attention``) run their sequence-parallel twins from
  :mod:`linear_attention.ops.sequence_parallel` (each device runs the chunk form on its
  slice, one ``all_gather`` of the per-device states, one correcting matmul);
- the short causal convolution gets a halo of ``W - 1`` tokens from the previous device
  (``ppermute``) instead of gathering the sequence;
- softmax attention is all-gather attention: keys and values gathered over the axis,
  queries kept local with their global causal offset.

Without such a mesh :func:`op` returns the op itself, so the layers are unchanged on one
device. A mixer that mixes tokens some other way (the delta rule, Mamba's selective scan,
sliding windows, ...) declares ``context_parallel = False`` (the default of
:class:`~linear_attention.nn.mixer.Mixer`); :func:`check_mixer` then raises a
``ValueError`` naming it rather than letting XLA gather the whole sequence silently.
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
from jax.sharding import AbstractMesh

from linear_attention.ops import conv as conv_ops
from linear_attention.ops import gated as gated_ops
from linear_attention.ops import linear as linear_ops
from linear_attention.ops import sequence_parallel as sp
from linear_attention.ops import softmax as softmax_ops

SEQ = "seq"

# Each op that mixes tokens along the sequence, and its twin taking
# ``mesh=, axis_name=, batch_axis=`` on top of the op's own arguments.
TWINS: dict[Callable, Callable] = {
    gated_ops.gla: sp.sequence_parallel_gla,
    gated_ops.retention: sp.sequence_parallel_retention,
    gated_ops.hgrn2: sp.sequence_parallel_hgrn2,
    gated_ops.ssd: sp.sequence_parallel_ssd,
    linear_ops.linear_attention: sp.sequence_parallel_linear_attention,
    linear_ops.rebased_attention: sp.sequence_parallel_rebased_attention,
    conv_ops.causal_conv1d: sp.sequence_parallel_causal_conv1d,
    softmax_ops.softmax_attention: sp.sequence_parallel_softmax_attention,
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


def seq_size() -> int:
  """Devices on the active ``"seq"`` axis (1 when the sequence is not sharded)."""
  mesh = seq_mesh()
  return 1 if mesh is None else mesh.shape[SEQ]


def op(fn: Callable) -> Callable:
  """``fn`` itself, or its sequence-parallel twin bound to the active ``"seq"`` mesh.

  The twin takes the same arguments as ``fn`` (its ``form`` is always the chunk form
  and ``implementation`` is not taken: layers pass neither) and splits the rows over
  the mesh's other axes.

  Raises:
    ValueError: the sequence is sharded and ``fn`` has no twin.
  """
  mesh = seq_mesh()
  if mesh is None:
    return fn
  twin = TWINS.get(fn)
  if twin is None:
    raise ValueError(
        f"{getattr(fn, '__name__', fn)!r} has no sequence-parallel form, but the sequence is "
        f"sharded over mesh axis {SEQ!r} ({mesh.shape[SEQ]} devices); ops that have one: "
        f"{sorted(f.__name__ for f in TWINS)}.")
  batch = tuple(a for a in mesh.axis_names if a != SEQ)
  return functools.partial(twin, mesh=mesh, axis_name=SEQ, batch_axis=batch or None)


def check_mixer(mixer) -> None:
  """Raises a ``ValueError`` naming ``mixer``'s class when the sequence is sharded and the
  mixer cannot run that way (its class does not set ``context_parallel = True``)."""
  n = seq_size()
  if n > 1 and not getattr(type(mixer), "context_parallel", False):
    raise ValueError(
        f"mixer {type(mixer).__name__} cannot run with the sequence sharded over mesh axis "
        f"{SEQ!r} ({n} devices, config.mesh.seq); context-parallel mixers: "
        f"{supported_mixers()}. Use config.mesh.seq=1 for this model.")


def supported_mixers() -> list[str]:
  """Registry names of the mixers that run with the sequence sharded."""
  from linear_attention.nn import registry  # the registry imports the layers, which import us
  return [s.name for s in registry.SPECS if getattr(s.cls, "context_parallel", False)]
