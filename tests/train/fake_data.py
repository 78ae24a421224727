"""A tiny dataset following the data contract, for trainer tests that need no task code."""

from __future__ import annotations

import numpy as np


class FakeDataset:
  """Deterministic copy task: the second half of each row repeats its first half.

  ``kind="lm"``: predict the next token (masked to the second half);
  ``kind="classify"``: the label is the first token modulo ``num_classes``.
  """

  def __init__(self, kind="lm", vocab_size=16, seq_len=16, batch_size=8, seed=0, num_classes=4,
               nan_at=None, bad_id_at=None, bad_id=None):
    self.kind, self.vocab_size, self.seq_len, self.batch_size = kind, vocab_size, seq_len, batch_size
    self.num_classes = num_classes if kind == "classify" else None
    self.seed = seed
    self.nan_at = nan_at  # a train step whose mask holds an Inf (to test the NaN guard)
    # A train step whose first input is ``bad_id`` (default ``vocab_size``, just outside
    # the vocabulary): it breaks the data contract, to test the data checks.
    self.bad_id_at = bad_id_at
    self.bad_id = vocab_size if bad_id is None else bad_id

  def batch(self, step, split="train"):
    rng = np.random.default_rng([self.seed, {"train": 0, "validation": 1}[split], step])
    half = self.seq_len // 2
    first = rng.integers(0, self.vocab_size, (self.batch_size, half))
    seq = np.concatenate([first, first, first[:, :1]], axis=1)[:, :self.seq_len + 1]
    inputs = seq[:, :-1].astype(np.int32)
    if split == "train" and step == self.bad_id_at:
      inputs[0, 0] = self.bad_id
    if self.kind == "lm":
      mask = np.zeros((self.batch_size, self.seq_len), np.float32)
      mask[:, half - 1:] = 1.0
      if split == "train" and step == self.nan_at:
        mask[0, -1] = np.inf
      return {"inputs": inputs, "targets": seq[:, 1:].astype(np.int32), "mask": mask}
    return {"inputs": inputs, "mask": np.ones(inputs.shape, bool),
            "label": (inputs[:, 0] % self.num_classes).astype(np.int32)}

  def eval_batches(self, split="validation", num_batches=None):
    for i in range(2 if num_batches is None else num_batches):
      yield self.batch(i, split)


def fake_config(mixer="gla", steps=6, **train):
  """A ConfigDict with the trainer's fields (no ``data`` task needed with a FakeDataset)."""
  import ml_collections
  c = ml_collections.ConfigDict()
  c.data = {"task": "fake", "batch_size": 8, "seq_len": 16, "seed": 0}
  c.model = dict(mixer=mixer, pattern="", d_model=16, num_layers=1, num_heads=2, mlp_ratio=2.0,
                 tie_embeddings=True, mixer_kwargs={}, pooling="mean", dtype="float32")
  c.optim = dict(lr=3e-3, warmup_steps=2, final_lr_ratio=0.1, weight_decay=0.1, b1=0.9,
                 b2=0.99, eps=1e-8, clip_norm=1.0)
  c.train = dict(steps=steps, eval_every=3, eval_batches=2, log_every=2, seed=0,
                 checkpoint_every=2, keep_checkpoints=2, async_checkpoints=True)
  c.train.update(train)
  c.mesh = dict(data=1, fsdp=False, seq=1)
  return c
