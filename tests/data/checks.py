"""Shared helpers for the data tests."""

from __future__ import annotations

import numpy as np

from linear_attention import data


def check_contract(ds, b):
  """Asserts the layout of one batch against the data contract."""
  B, T = ds.batch_size, ds.seq_len
  assert b["inputs"].shape == (B, T) and b["inputs"].dtype == np.int32
  assert b["inputs"].min() >= 0 and b["inputs"].max() < ds.vocab_size
  if ds.kind == "lm":
    assert set(b) == {"inputs", "targets", "mask"}
    assert ds.num_classes is None
    assert b["targets"].shape == (B, T) and b["targets"].dtype == np.int32
    assert b["mask"].shape == (B, T) and b["mask"].dtype == np.float32
    assert set(np.unique(b["mask"])) <= {0.0, 1.0}
    assert b["targets"].min() >= 0 and b["targets"].max() < ds.vocab_size
  else:
    assert ds.kind == "classify"
    assert set(b) == {"inputs", "mask", "label"}
    assert b["mask"].shape == (B, T) and b["mask"].dtype == np.bool_
    assert b["label"].shape == (B,) and b["label"].dtype == np.int32
    assert b["label"].min() >= 0 and b["label"].max() < ds.num_classes


def same_batch(a, b) -> bool:
  return set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in a)


__all__ = ["check_contract", "same_batch", "data"]
