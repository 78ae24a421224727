"""Running a stack of blocks: activation checkpointing and a scan over repeated layers.

``remat`` (``Backbone(remat=...)``, ``config.model.remat``) chooses what the backward pass
keeps of each block:

- ``"none"``: every intermediate of every block (the fastest backward, the most memory);
- ``"block"``: only each block's input; the block is recomputed in the backward pass
  (``jax.checkpoint`` around the block, about one extra forward);
- ``"mixer_only"``: the mixer is recomputed, the MLP's intermediates are kept;
- a name of :data:`REMAT_POLICIES` (``jax.checkpoint_policies``): the block is checkpointed
  with that policy, e.g. ``"dots_with_no_batch_dims_saveable"`` keeps the matmuls' outputs
  and recomputes the elementwise work.

Checkpointing changes what is stored, not what is computed: the loss and the gradients are
the same as without it to float32 rounding (XLA fuses the recomputation differently). It
saves memory where the stack runs as a scan (``scan=True``): in an unrolled stack XLA on
CPU schedules the recomputed forwards early in the backward pass, and the memory plan keeps
about as much as without checkpointing.

``scan=True`` (``config.model.scan_layers``) stores and runs the stack as a scan over its
repeating unit (one block for a plain stack, the pattern's period for a hybrid such as
``"DDDA"``): :class:`StackedBlocks` keeps one block per position of the unit whose
parameters carry a leading ``[repeats]`` axis, and runs them with a ``lax.scan``. The blocks
are traced and compiled once per unit instead of once per layer, the optimizer updates one
stacked array per parameter, and no per-step copy of the parameters is made. The parameters
are those of the unscanned model stacked (:func:`stack_states`, :func:`unstack_states`
convert a state between the two layouts); a stack that does not repeat stays one module per
block.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
from flax import nnx

from linear_attention.nn import context_parallel

REMAT_MODES = ("none", "block", "mixer_only")
# The policies of ``jax.checkpoint_policies`` that are policies themselves (the others are
# factories that need names or offload targets).
REMAT_POLICIES = tuple(n for n in (
    "everything_saveable", "nothing_saveable", "dots_saveable", "checkpoint_dots",
    "dots_with_no_batch_dims_saveable", "checkpoint_dots_with_no_batch_dims")
    if hasattr(jax.checkpoint_policies, n))


def check_remat(remat: str, name: str = "remat") -> None:
  """Raises a ``ValueError`` naming ``name`` unless ``remat`` is a mode or a policy name."""
  if remat not in REMAT_MODES + REMAT_POLICIES:
    raise ValueError(f"{name} must be one of {list(REMAT_MODES)} or a jax.checkpoint_policies "
                     f"name {list(REMAT_POLICIES)}, got {remat!r}.")


def _policy(remat: str):
  """The ``jax.checkpoint`` policy of a block-level ``remat`` (None: save nothing)."""
  return None if remat in REMAT_MODES else getattr(jax.checkpoint_policies, remat)


def call_checkpointed(module: nnx.Module, fn: Callable, *args, policy=None):
  """``fn(module, *args)`` under ``jax.checkpoint``: only ``module``'s state and ``args`` are
  kept for the backward pass (plus what ``policy`` saves), the rest is recomputed.

  ``fn`` must not change ``module``'s state (a block's forward pass does not).
  """
  graphdef, state = nnx.split(module)

  def pure(state, *args):
    return fn(nnx.merge(graphdef, state), *args)

  return jax.checkpoint(pure, policy=policy)(state, *args)


def _call_block(blk, x, segment_ids, remat: str):
  if remat == "none":
    return blk(x, segment_ids=segment_ids)
  if remat == "mixer_only":
    return blk(x, segment_ids=segment_ids, remat_mixer=True)
  return call_checkpointed(blk, lambda b, x, s: b(x, segment_ids=s), x, segment_ids,
                           policy=_policy(remat))


def scan_period(blocks: Sequence[nnx.Module]) -> int | None:
  """The smallest ``p`` such that the blocks repeat with period ``p`` (block ``i`` has the
  structure of block ``i % p``) at least twice; None when they do not repeat."""
  defs = [nnx.graphdef(b) for b in blocks]
  n = len(defs)
  for p in range(1, n // 2 + 1):
    if n % p == 0 and all(defs[i] == defs[i % p] for i in range(p, n)):
      return p
  return None


STACKED = "stacked_layers"
"""The attribute of :class:`StackedBlocks` holding the stacked blocks: a variable whose path
goes through it has a leading layer axis (see :func:`layer_axes`)."""


def _path_names(path) -> list[str]:
  return [str(getattr(p, "key", getattr(p, "name", p))) for p in path]


def layer_axes(path) -> int:
  """1 when the variable at ``path`` (a pytree key path) is stored stacked over layers (its
  axis 0 counts layers, not features), else 0."""
  return int(STACKED in _path_names(path))


def _stack(xs):
  return jax.numpy.stack(xs)


def _stack_modules(blocks: Sequence[nnx.Module]) -> nnx.Module:
  """One module of ``blocks[0]``'s structure whose every variable is the blocks' variables
  stacked on a new leading axis."""
  graphdef = nnx.graphdef(blocks[0])
  return nnx.merge(graphdef, jax.tree.map(lambda *xs: _stack(xs),
                                          *[nnx.state(b) for b in blocks]))


class StackedBlocks(nnx.Module):
  """A stack of blocks repeating with period ``p``, stored as ``p`` blocks whose variables
  have a leading ``[repeats]`` axis (layer ``i`` is repeat ``i // p`` of position ``i % p``).

  Iterating or indexing gives each layer as its own block (a copy of its slice: reading, e.g.
  decoding, works; writing to it does not reach the stack). ``run`` applies the layers in
  order as one ``lax.scan``.

  Example:
    >>> from flax import nnx
    >>> from linear_attention.models import Block
    >>> blocks = [Block(8, "gla", 2, rngs=nnx.Rngs(i)) for i in range(4)]
    >>> stacked = StackedBlocks(blocks, period=1)
    >>> len(stacked), stacked.stacked_layers[0].mlp_norm.scale.shape
    (4, (4, 8))
  """

  def __init__(self, blocks: Sequence[nnx.Module], period: int):
    n = len(blocks)
    if period < 1 or n % period:
      raise ValueError(f"period must be >= 1 and divide the number of blocks {n}, got {period}.")
    self.period, self.repeats = int(period), n // period
    setattr(self, STACKED, nnx.List([_stack_modules(blocks[j::period]) for j in range(period)]))

  def __len__(self) -> int:
    return self.period * self.repeats

  def __getitem__(self, i: int) -> nnx.Module:
    n = len(self)
    if not -n <= i < n:
      raise IndexError(f"layer {i} out of range for {n} layers.")
    r, j = divmod(i % n, self.period)
    unit = getattr(self, STACKED)[j]
    return nnx.merge(nnx.graphdef(unit), jax.tree.map(lambda x: x[r], nnx.state(unit)))

  def __iter__(self):
    return (self[i] for i in range(len(self)))

  def run(self, x: jax.Array, segment_ids: jax.Array | None = None, *,
          remat: str = "none") -> jax.Array:
    """``x [B, T, D]`` through every layer in order (one ``lax.scan`` over the repeats)."""
    check_remat(remat)
    units = getattr(self, STACKED)
    graphdefs = [nnx.graphdef(u) for u in units]

    def step(x, unit_states):
      for gd, st in zip(graphdefs, unit_states):
        x = context_parallel.constrain_rows(_call_block(nnx.merge(gd, st), x, segment_ids,
                                                        remat))
      return x, None

    x, _ = jax.lax.scan(step, context_parallel.constrain_rows(x),
                        tuple(nnx.state(u) for u in units))
    return x


def stack_blocks(blocks: Sequence[nnx.Module]) -> "StackedBlocks | None":
  """``blocks`` as a :class:`StackedBlocks` over their repeating unit; None when they do not
  repeat (see :func:`scan_period`)."""
  period = scan_period(blocks)
  return None if period is None else StackedBlocks(blocks, period)


def stack_states(layer_states: Sequence, period: int) -> list:
  """Per-layer states (``nnx.State`` or pure dicts, one per block) -> the states of a
  :class:`StackedBlocks`' positions (``period`` of them, each stacked over the repeats)."""
  return [jax.tree.map(lambda *xs: _stack(xs), *layer_states[j::period])
          for j in range(period)]


def unstack_states(unit_states: Sequence) -> list:
  """The inverse of :func:`stack_states`: the stacked states of the unit's positions -> one
  state per layer, in layer order."""
  period = len(unit_states)
  repeats = jax.tree.leaves(unit_states[0])[0].shape[0]
  return [jax.tree.map(lambda x: x[i // period], unit_states[i % period])
          for i in range(period * repeats)]


def run_blocks(blocks, x: jax.Array, segment_ids: jax.Array | None = None,
               *, remat: str = "none") -> jax.Array:
  """``x [B, T, D]`` through ``blocks`` in order (see the module docstring for ``remat``): a
  :class:`StackedBlocks` runs as a scan, a sequence of blocks as a loop."""
  check_remat(remat)
  if isinstance(blocks, StackedBlocks):
    return blocks.run(x, segment_ids, remat=remat)
  for blk in blocks:
    x = _call_block(blk, x, segment_ids, remat)
  return x
