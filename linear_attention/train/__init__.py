"""Trainer, checkpoints, metrics, sweeps: ``train_and_evaluate(config, workdir)``.

The names below load their modules on first use (PEP 562), so that ``errors``, ``rundir``
and ``metrics``, which import no JAX, serve the command lines and the sweep runner without
the trainer's imports (JAX, Flax, optax, orbax).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

# name -> the module of this package that defines it
_EXPORTS = {
    **dict.fromkeys(("decay_mask", "lr_schedule", "make_optimizer", "make_tx"), "optim"),
    **dict.fromkeys(("CheckpointError", "CheckpointWriteError", "ConfigChangedError",
                     "ConfigError", "DataError", "NonFiniteLossError", "PreemptedError",
                     "WorkdirLockedError"), "errors"),
    **dict.fromkeys(("evaluate_checkpoint", "load_checkpoint", "load_config",
                     "load_final_metrics"), "results"),
    "create_model": "build",
    "loss_and_metrics": "steps",
    "train_and_evaluate": "trainer",
}
_SUBMODULES = ("build", "checkpoint", "checks", "errors", "metrics", "optim", "results", "rundir",
               "sharding", "steps", "trainer")

if TYPE_CHECKING:  # what editors and type checkers see
  from linear_attention.train.errors import (CheckpointError, CheckpointWriteError,
                                             ConfigChangedError, ConfigError, DataError,
                                             NonFiniteLossError, PreemptedError,
                                             WorkdirLockedError)
  from linear_attention.train.optim import decay_mask, lr_schedule, make_optimizer, make_tx
  from linear_attention.train.results import (evaluate_checkpoint, load_checkpoint, load_config,
                                              load_final_metrics)
  from linear_attention.train.build import create_model
  from linear_attention.train.steps import loss_and_metrics
  from linear_attention.train.trainer import train_and_evaluate


def __getattr__(name: str):
  if name in _EXPORTS:
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value  # later lookups skip this function
    return value
  if name in _SUBMODULES:
    return importlib.import_module(f"{__name__}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
  return sorted(set(globals()) | set(_EXPORTS) | set(_SUBMODULES))
