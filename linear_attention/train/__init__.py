"""Trainer, checkpoints, metrics, sweeps: ``train_and_evaluate(config, workdir)``."""

from linear_attention.train.optim import decay_mask, lr_schedule, make_optimizer, make_tx
from linear_attention.train.errors import (CheckpointError, CheckpointWriteError,
                                           ConfigChangedError, ConfigError, DataError,
                                           NonFiniteLossError, PreemptedError, WorkdirLockedError)
from linear_attention.train.results import (evaluate_checkpoint, load_checkpoint, load_config,
                                            load_final_metrics)
from linear_attention.train.trainer import create_model, loss_and_metrics, train_and_evaluate
