"""Tasks and corpora: MQAR, selective copying, induction heads, ListOps, byte-level text.

The contract with ``train/``: ``ds = make_dataset(config.data)`` gives
``ds.vocab_size``, ``ds.kind`` (``"lm"`` or ``"classify"``), ``ds.num_classes``,
``ds.seq_len``, ``ds.batch_size``; ``ds.batch(step, split)`` is a pure function of
``(seed, split, step)``; ``ds.eval_batches(split, num_batches)`` is a fixed,
finite sequence. Everything is generated with numpy on the host.
"""

from __future__ import annotations

from linear_attention.data.base import KINDS, SPLITS, Dataset
from linear_attention.data.registry import (
    TASKS, default_data_config, describe, make_dataset, normalize_config)

__all__ = [
    "TASKS", "SPLITS", "KINDS", "Dataset", "make_dataset", "default_data_config", "describe",
    "normalize_config",
]
