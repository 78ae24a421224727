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

``scan=True`` (``config.model.scan_layers``) runs the stack as a ``lax.scan`` over its
repeating unit (one block for a plain stack, the pattern's period for a hybrid such as
``"DDDA"``), so the blocks are traced and compiled once per unit instead of once per
layer. The parameters stay one module per block (the same checkpoints and names); the scan
stacks them inside the step, which costs one extra copy of the blocks' parameters (and of
their gradients) per device, and the optimizer still updates each block's parameters
apart, so compile time still grows with depth, more slowly than unrolled.
"""

from __future__ import annotations

from typing import Callable, Sequence

import jax
from flax import nnx

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


def run_blocks(blocks: Sequence[nnx.Module], x: jax.Array, segment_ids: jax.Array | None = None,
               *, remat: str = "none", scan: bool = False) -> jax.Array:
  """``x [B, T, D]`` through ``blocks`` in order (see the module docstring for ``remat`` and
  ``scan``); a stack that does not repeat runs as a loop even with ``scan=True``."""
  check_remat(remat)
  period = scan_period(blocks) if scan else None
  if period is None:
    for blk in blocks:
      x = _call_block(blk, x, segment_ids, remat)
    return x
  graphdefs = [nnx.graphdef(b) for b in blocks[:period]]
  states = [nnx.state(b) for b in blocks]
  # [repeats] leading axis on every leaf of each position of the unit.
  stacked = tuple(jax.tree.map(lambda *xs: jax.numpy.stack(xs), *states[j::period])
                  for j in range(period))

  def unit(x, unit_states):
    for gd, st in zip(graphdefs, unit_states):
      x = _call_block(nnx.merge(gd, st), x, segment_ids, remat)
    return x, None

  x, _ = jax.lax.scan(unit, x, stacked)
  return x

