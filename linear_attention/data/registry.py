"""Task registry: config defaults, validation, and ``make_dataset``.

Every task has a complete set of fields with defaults (:func:`default_data_config`);
a config may give any subset of them plus ``task``. Validation happens before
any data is generated or read: an unknown task lists :data:`TASKS`, an unknown
field names itself and the valid ones, a value of the wrong type or range names
the field, the expected and the received value.
"""

from __future__ import annotations

import importlib
import math
from typing import Any, Mapping

import numpy as np

# Fields every task has. ``num_eval_batches`` is what ``eval_batches(num_batches=None)``
# yields; for text, 0 means "the whole split".
_COMMON: dict[str, Any] = {
    "task": "",
    "batch_size": 32,
    "seq_len": 256,
    "seed": 0,
    "num_eval_batches": 16,
}

# task -> ("module:Class", task-specific defaults and overrides of _COMMON).
_TASKS: dict[str, tuple[str, dict[str, Any]]] = {
    "mqar": ("synthetic:MQAR", {
        "batch_size": 64, "seq_len": 256, "vocab_size": 8192, "num_kv_pairs": 16,
        "power_a": 0.01, "random_non_queries": True, "mixture": "",
    }),
    "selective_copying": ("synthetic:SelectiveCopying", {
        "batch_size": 32, "seq_len": 4096, "vocab_size": 16, "num_tokens": 16,
    }),
    "induction_heads": ("synthetic:InductionHeads", {
        "batch_size": 8, "seq_len": 256, "vocab_size": 16, "dense": False,
    }),
    "listops": ("listops:ListOps", {
        "batch_size": 32, "seq_len": 2000, "max_depth": 10, "max_args": 10,
        "min_length": 500, "max_length": 2000,
    }),
    "text": ("text:TextDataset", {
        "batch_size": 32, "seq_len": 512, "corpus": "kjv", "num_eval_batches": 0,
        "text_file": "", "tokenizer": "",
    }),
}

TASKS: tuple[str, ...] = tuple(_TASKS)


def _defaults(task: str) -> dict[str, Any]:
  out = dict(_COMMON)
  out.update(_TASKS[task][1])
  out["task"] = task
  return out


def _check_task(task: Any) -> str:
  if not isinstance(task, str) or task not in _TASKS:
    raise ValueError(f"unknown data task {task!r}; valid tasks: {list(TASKS)}.")
  return task


def default_data_config(task: str):
  """A ``ConfigDict`` with every field of ``task`` set to its default.

  Returns: a locked ``ml_collections.ConfigDict``: existing fields can be
  overridden (with values of the same type), a misspelt new field raises.
  """
  import ml_collections  # lazy: the numpy-only parts of data/ do not need it

  cfg = ml_collections.ConfigDict(_defaults(_check_task(task)))
  cfg.lock()
  return cfg


def _as_dict(config: Any) -> dict[str, Any]:
  if hasattr(config, "to_dict") and callable(config.to_dict):
    return dict(config.to_dict())
  if isinstance(config, Mapping):
    return dict(config)
  raise ValueError(
      f"config must be an ml_collections.ConfigDict or a Mapping, got {type(config).__name__}.")


def _is_int(x: Any) -> bool:
  return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_))


def normalize_config(config: Any) -> dict[str, Any]:
  """Validates ``config`` and returns a plain dict of every field, defaults filled in.

  Raises:
    ValueError: no or unknown ``task``; unknown field; wrong type; out-of-range
      common field (task-specific ranges are checked by the task's class).
  """
  given = _as_dict(config)
  if "task" not in given:
    raise ValueError(f"config has no 'task' field; valid tasks: {list(TASKS)}.")
  task = _check_task(given["task"])
  out = _defaults(task)
  unknown = sorted(set(given) - set(out))
  if unknown:
    raise ValueError(
        f"unknown config field(s) {unknown} for data task {task!r}; valid fields: {sorted(out)}.")
  for name, value in given.items():
    default = out[name]
    if isinstance(default, bool):
      if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"config field {name!r} must be a bool, got {value!r}.")
      value = bool(value)
    elif isinstance(default, int):
      if not _is_int(value):
        raise ValueError(f"config field {name!r} must be an int, got {value!r}.")
      value = int(value)
    elif isinstance(default, float):
      is_number = _is_int(value) or isinstance(value, (float, np.floating))
      if not is_number or not math.isfinite(value):
        raise ValueError(f"config field {name!r} must be a finite float, got {value!r}.")
      value = float(value)
    elif isinstance(default, str):
      if not isinstance(value, str):
        raise ValueError(f"config field {name!r} must be a str, got {value!r}.")
    out[name] = value
  for name in ("batch_size", "seq_len"):
    if out[name] < 1:
      raise ValueError(f"config field {name!r} must be >= 1, got {out[name]}.")
  if out["seed"] < 0:
    raise ValueError(f"config field 'seed' must be >= 0, got {out['seed']}.")
  if out["num_eval_batches"] < 0:
    raise ValueError(
        f"config field 'num_eval_batches' must be >= 0, got {out['num_eval_batches']}.")
  return out


def _task_class(task: str):
  module_name, cls_name = _TASKS[task][0].split(":")
  module = importlib.import_module(f"linear_attention.data.{module_name}")
  return getattr(module, cls_name)


def make_dataset(config: Any):
  """Builds the dataset that ``config`` (``config.data`` of a run) describes.

  Args:
    config: ``ConfigDict`` or Mapping with ``task`` (one of :data:`TASKS`) and
      any of that task's fields (see :func:`default_data_config`).

  Returns:
    A :class:`~linear_attention.data.base.Dataset`: ``vocab_size``, ``kind``,
    ``num_classes``, ``seq_len``, ``batch_size``, ``batch(step, split)``,
    ``eval_batches(split, num_batches)``.
  """
  cfg = normalize_config(config)
  return _task_class(cfg["task"])(cfg)


def describe_config(cfg: Mapping[str, Any]) -> str:
  """One line: the task, then its fields in a fixed order (common ones first)."""
  first = ["seq_len", "batch_size", "seed"]
  rest = sorted(k for k in cfg if k not in first and k != "task")
  parts = [f"{k}={cfg[k]}" for k in first + rest]
  return f"{cfg['task']}: " + " ".join(parts)


def describe(config: Any) -> str:
  """One line describing a data config, for logs (validates it; reads no data).

  Returns: e.g. ``"mqar: seq_len=256 batch_size=64 seed=0 num_kv_pairs=16 ..."``.
  """
  return describe_config(normalize_config(config))
