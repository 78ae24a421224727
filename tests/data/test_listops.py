"""ListOps: contract, determinism, and labels recomputed by an independent evaluator."""

from __future__ import annotations

import statistics
import time

import numpy as np
import pytest

from linear_attention import data
from tests.data.checks import check_contract, same_batch

# The token layout of the data contract for ListOps, written out independently.
OPS = {11: min, 12: max, 13: lambda a: int(statistics.median(a)), 14: lambda a: sum(a) % 10}
CLOSE = 15

CFG = dict(task="listops", seq_len=256, min_length=64, max_length=250, max_depth=8, max_args=6,
           batch_size=24, seed=11)


def evaluate(tokens):
  """Value, depth and per-operator argument counts of a token row, with an explicit stack."""
  stack = []  # frames: [op token, args, depth]
  result, max_depth, arg_counts = None, 0, []
  for t in tokens:
    t = int(t)
    if t == 0:
      break
    if t in OPS:
      stack.append([t, [], len(stack) + 1])
      max_depth = max(max_depth, len(stack))
      continue
    if t == CLOSE:
      op, args, _ = stack.pop()
      arg_counts.append(len(args))
      value = OPS[op](args)
    else:
      assert 1 <= t <= 10, t
      value = t - 1
      max_depth = max(max_depth, len(stack) + 1)
    if stack:
      stack[-1][1].append(value)
    else:
      assert result is None, "more than one top-level expression"
      result = value
  assert not stack, "unclosed operator"
  return result, max_depth, arg_counts


def test_contract_and_determinism():
  ds = data.make_dataset(CFG)
  assert ds.kind == "classify" and ds.num_classes == 10 and ds.vocab_size == 16
  b = ds.batch(0)
  check_contract(ds, b)
  assert same_batch(b, data.make_dataset(CFG).batch(0))
  assert not same_batch(b, ds.batch(1))
  assert not same_batch(b, ds.batch(0, "validation"))
  ev = list(ds.eval_batches("validation", 2))
  assert len(ev) == 2 and same_batch(ev[1], ds.batch(1, "validation"))


def test_labels_and_structure():
  ds = data.make_dataset(CFG)
  labels, ops_seen = [], set()
  for step in range(3):
    b = ds.batch(step)
    for x, m, y in zip(b["inputs"], b["mask"], b["label"]):
      n = int(m.sum())
      assert np.all(m[:n]) and not np.any(m[n:]), "mask must be a prefix"
      assert np.all(x[n:] == 0) and np.all(x[:n] != 0)
      assert CFG["min_length"] < n < CFG["max_length"]
      value, depth, arg_counts = evaluate(x)
      assert value == y
      assert depth <= CFG["max_depth"]
      assert all(2 <= a <= CFG["max_args"] for a in arg_counts)
      labels.append(int(y))
      ops_seen |= set(np.unique(x[:n]).tolist()) & set(OPS)
  assert ops_seen == set(OPS)
  assert len(set(labels)) >= 6


def test_decode():
  from linear_attention.data import listops
  assert listops.decode([13, 1, 10, 15, 0, 0]) == "[MED 0 9 ]"


def test_speed_lra_defaults_and_512():
  short = dict(task="listops", seq_len=512, min_length=256, max_length=512)
  for cfg in [dict(task="listops"), short]:
    ds = data.make_dataset(cfg)
    t0 = time.perf_counter()
    b = ds.batch(0)
    assert time.perf_counter() - t0 < 1.0
    assert b["inputs"].shape == (32, cfg.get("seq_len", 2000))


@pytest.mark.parametrize("field,value,match", [
    ("max_length", 300, "seq_len"),           # an expression may not fit
    ("min_length", 249, "max_length"),        # empty length window
    ("max_depth", 1, "max_depth"),
    ("max_args", 1, "max_args"),
])
def test_validation(field, value, match):
  with pytest.raises(ValueError, match=match):
    data.make_dataset(dict(CFG, **{field: value}))


def test_unreachable_length():
  with pytest.raises(ValueError, match="min_length"):
    data.make_dataset(dict(CFG, max_depth=2, max_args=3, min_length=5, max_length=10))


def _naive_tree(r, depth, max_depth, max_args):
  """The LRA recursion, written plainly: returns (length, value); no early stop."""
  if depth < max_depth and r.random() <= 0.25:
    args = [_naive_tree(r, depth + 1, max_depth, max_args) for _ in range(r.randint(2, max_args))]
    op = r.choice(list(OPS))
    return 2 + sum(a[0] for a in args), OPS[op]([a[1] for a in args])
  return 1, r.randrange(10)


def test_distribution_matches_plain_rejection_sampling():
  import random
  from linear_attention.data import listops
  depth, args, lo, hi, n = 5, 4, 10, 60, 1500
  r = random.Random(0)
  naive = []
  while len(naive) < n:
    length, value = _naive_tree(r, 1, depth, args)
    if lo < length < hi:
      naive.append((length, value))
  u = listops._Uniforms(np.random.default_rng(0))
  ours = []
  for _ in range(n):
    tokens, value, _ = listops.sample_expression(u, depth, args, lo, hi)
    ours.append((len(tokens), value))
  a, b = np.array(naive, float), np.array(ours, float)
  se = np.sqrt(a[:, 0].var() / n + b[:, 0].var() / n)
  assert abs(a[:, 0].mean() - b[:, 0].mean()) < 5 * se
  ha = np.bincount(a[:, 1].astype(int), minlength=10) / n
  hb = np.bincount(b[:, 1].astype(int), minlength=10) / n
  assert np.abs(ha - hb).max() < 0.05
