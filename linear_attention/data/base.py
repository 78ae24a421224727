"""The dataset interface every task implements, and its deterministic randomness.

A batch is a pure function of ``(seed, split, step)``: the generator that makes
it is seeded from exactly those three numbers (plus a per-task salt), so a
resumed run only needs the step counter to continue the data stream where it
stopped, and two processes asking for the same batch get the same arrays.

Batch layouts (``B`` = batch size, ``T`` = sequence length):

* kind ``"lm"``: ``inputs`` int32 [B, T], ``targets`` int32 [B, T], ``mask``
  float32 [B, T] (1 where the loss and the accuracy count, 0 elsewhere; the
  targets there are 0 and mean nothing).
* kind ``"classify"``: ``inputs`` int32 [B, T], ``mask`` bool [B, T] (True on
  real tokens, False on padding), ``label`` int32 [B].
"""

from __future__ import annotations

import zlib
from typing import Any, Iterator, Mapping

import numpy as np

SPLITS: tuple[str, ...] = ("train", "validation", "test")
KINDS: tuple[str, ...] = ("lm", "classify")


def check_split(split: Any, valid: tuple[str, ...] = SPLITS) -> int:
  """Index of ``split`` in ``valid``; ``ValueError`` naming the valid splits otherwise."""
  if not isinstance(split, str) or split not in valid:
    raise ValueError(f"split must be one of {list(valid)}, got {split!r}.")
  return valid.index(split)


def check_step(step: Any) -> int:
  """``step`` as a Python int; it must be a non-negative integer (not a bool)."""
  if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)):
    raise ValueError(f"step must be a non-negative int, got {step!r} ({type(step).__name__}).")
  if step < 0:
    raise ValueError(f"step must be a non-negative int, got {step}.")
  return int(step)


def task_salt(task: str) -> int:
  """A stable 32-bit number per task name, so tasks sharing a seed draw unrelated streams."""
  return zlib.crc32(task.encode("utf-8"))


def make_rng(task: str, seed: int, split_index: int, step: int) -> np.random.Generator:
  """The generator for one batch: a pure function of (task, seed, split, step).

  ``SeedSequence`` hashes the whole entropy list, so neighbouring steps or seeds
  give statistically independent streams (unlike ``seed + step``).
  """
  return np.random.default_rng(
      np.random.SeedSequence([task_salt(task), seed, split_index, step]))


def choose_distinct(rng: np.random.Generator, batch: int, low: int, high: int,
                    k: int) -> np.ndarray:
  """``k`` distinct integers from ``[low, high)`` per row, uniformly, in random order.

  Returns: int64 [batch, k].
  """
  n = high - low
  if k > n:
    raise ValueError(f"cannot draw {k} distinct values from a range of {n}.")
  if k == 0:
    return np.zeros((batch, 0), np.int64)
  # Top-k of i.i.d. uniforms picks a uniform k-subset; the order inside the
  # subset (argpartition's) is arbitrary, so shuffle it with a second draw.
  u = rng.random((batch, n))
  idx = np.argpartition(u, k - 1, axis=1)[:, :k]
  order = np.argsort(rng.random((batch, k)), axis=1)
  return np.take_along_axis(idx, order, axis=1).astype(np.int64) + low


class Dataset:
  """Base class: the attributes and methods of the data contract.

  Attributes:
    task: the task name (one of ``data.TASKS``).
    kind: ``"lm"`` or ``"classify"``.
    vocab_size: token ids lie in ``[0, vocab_size)``.
    num_classes: number of labels for ``"classify"``, ``None`` for ``"lm"``.
    seq_len, batch_size, seed: from the config.
    splits: the split names :meth:`batch` accepts.
    config: the validated config as a plain dict (every field, defaults filled).
    max_targets_per_row: optional (``"lm"`` tasks scored at a few positions): no row has
      more counted positions; the trainer then computes logits at those positions only.
  """

  task: str = ""
  kind: str = "lm"
  num_classes: int | None = None
  splits: tuple[str, ...] = SPLITS

  def __init__(self, config: Mapping[str, Any]):
    self.config = dict(config)
    self.task = self.config["task"]
    self.seq_len = int(self.config["seq_len"])
    self.batch_size = int(self.config["batch_size"])
    self.seed = int(self.config["seed"])
    self.num_eval_batches = int(self.config["num_eval_batches"])
    self.vocab_size = 0

  # -- the contract -----------------------------------------------------------

  def batch(self, step: int, split: str = "train") -> dict[str, np.ndarray]:
    """The batch number ``step`` of ``split``; the same arrays every time.

    Returns: a dict of numpy arrays (see the module docstring for the layout).
    """
    step = check_step(step)
    split_index = check_split(split, self.splits)
    return self._make_batch(step, split, split_index)

  def eval_batches(self, split: str = "validation",
                   num_batches: int | None = None) -> Iterator[dict[str, np.ndarray]]:
    """A fixed, finite sequence of batches of ``split`` (the same on every call).

    Args:
      split: which split.
      num_batches: how many; ``None`` takes the task's default
        (:meth:`num_eval_steps`).

    Returns: an iterator over batch dicts of the :meth:`batch` layout.
    """
    n = self.num_eval_steps(split, num_batches)
    split_index = check_split(split, self.splits)
    return self._eval_iter(split, split_index, n)

  def num_eval_steps(self, split: str = "validation", num_batches: int | None = None) -> int:
    """How many batches :meth:`eval_batches` yields for these arguments."""
    check_split(split, self.splits)
    if num_batches is None:
      return self._default_eval_steps(split)
    if isinstance(num_batches, (bool, np.bool_)) or not isinstance(num_batches, (int, np.integer)) \
        or num_batches < 1:
      raise ValueError(f"num_batches must be None or a positive int, got {num_batches!r}.")
    return int(num_batches)

  def describe(self) -> str:
    """One line for logs: the task and its settings."""
    from linear_attention.data.registry import describe_config
    return describe_config(self.config)

  def __repr__(self) -> str:
    return f"<{type(self).__name__} {self.describe()}>"

  # -- what subclasses provide ------------------------------------------------

  def _make_batch(self, step: int, split: str, split_index: int) -> dict[str, np.ndarray]:
    raise NotImplementedError

  def _default_eval_steps(self, split: str) -> int:
    return self.num_eval_batches

  def _eval_iter(self, split: str, split_index: int, n: int) -> Iterator[dict[str, np.ndarray]]:
    # Synthetic tasks: evaluation batches are simply steps 0..n-1 of the split,
    # a stream the training split (another split index) never draws from.
    for step in range(n):
      yield self._make_batch(step, split, split_index)


class SyntheticDataset(Dataset):
  """A generated task: ``_generate(rng)`` makes one batch from a seeded generator."""

  def _make_batch(self, step: int, split: str, split_index: int) -> dict[str, np.ndarray]:
    rng = make_rng(self.task, self.seed, split_index, step)
    return self._generate(rng)

  def _generate(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
    raise NotImplementedError


def lm_batch(inputs: np.ndarray, targets: np.ndarray, mask: np.ndarray) -> dict[str, np.ndarray]:
  """Packs an ``"lm"`` batch with the contract's dtypes (targets are 0 where mask is 0)."""
  mask = mask.astype(np.float32)
  targets = np.where(mask > 0, targets, 0).astype(np.int32)
  return {"inputs": inputs.astype(np.int32), "targets": targets, "mask": mask}
