"""Checkpoints with an orbax ``CheckpointManager``: interval, keep-N, async, preemption.

A checkpoint holds the model's variables, the optimiser state (with its step count) and,
as its orbax step, the number of completed training steps, which by the data contract is
also the data iterator's position. Orbax writes each checkpoint to a temporary directory
and renames it when complete, so a checkpoint cut short by a kill is never listed (and its
temporary directory is removed at the next start).
"""

from __future__ import annotations

import os
from typing import Any

import jax
import orbax.checkpoint as ocp

CHECKPOINT_DIR = "checkpoints"


class Checkpointer:
  """Thin wrapper over ``ocp.CheckpointManager`` for one pytree of arrays.

  Args:
    workdir: run directory; checkpoints go to ``workdir/checkpoints/<step>``.
    every: save interval in steps (``<= 0``: only forced saves, e.g. at the end).
    keep: number of checkpoints kept (``<= 0``: all).
    async_save: write in a background thread while training continues.
  """

  def __init__(self, workdir: str, every: int, keep: int, async_save: bool = True):
    self.directory = os.path.abspath(os.path.join(workdir, CHECKPOINT_DIR))
    policies = [ocp.checkpoint_managers.PreemptionCheckpointingPolicy()]
    if every > 0:  # no save at the first step (orbax's default adds one)
      policies.append(ocp.checkpoint_managers.FixedIntervalPolicy(every))
    options = ocp.CheckpointManagerOptions(
        save_decision_policy=ocp.checkpoint_managers.AnySavePolicy(policies),
        max_to_keep=keep if keep > 0 else None,
        enable_async_checkpointing=async_save,
        create=True,
        cleanup_tmp_directories=True,
    )
    self.manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> int | None:
    """The step of the newest complete checkpoint, or None."""
    return self.manager.latest_step()

  def should_save(self, step: int) -> bool:
    """True at the save interval and when a preemption sync point was reached (multi-host)."""
    return self.manager.should_save(step)

  def save(self, step: int, state: Any, force: bool = False) -> bool:
    """Saves ``state`` (a pytree of arrays) as ``step``; async unless configured otherwise."""
    return self.manager.save(step, args=ocp.args.StandardSave(state), force=force)

  def restore(self, step: int, target: Any) -> Any:
    """Restores ``step`` into the structure, dtypes and shardings of ``target``.

    ``target`` may hold arrays or ``jax.ShapeDtypeStruct`` with shardings.
    """
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
    return self.manager.restore(step, args=ocp.args.StandardRestore(abstract))

  def wait_until_finished(self) -> None:
    self.manager.wait_until_finished()

  def close(self) -> None:
    self.manager.wait_until_finished()
    self.manager.close()
