"""Trainer, checkpoints, metrics, sweeps: ``train_and_evaluate(config, workdir)``."""

from linear_attention.train.optim import decay_mask, lr_schedule, make_optimizer, make_tx
from linear_attention.train.sweep_utils import product, zip_
from linear_attention.train.trainer import (NonFiniteLossError, PreemptedError, create_model,
                                            evaluate_checkpoint, load_checkpoint, load_config,
                                            load_final_metrics, loss_and_metrics,
                                            train_and_evaluate)
