"""MQAR, selective copying and induction heads: contract, determinism, each task's definition."""

from __future__ import annotations

import numpy as np
import pytest

from linear_attention import data
from tests.data.checks import check_contract, same_batch

SMALL = {
    "mqar": dict(task="mqar", vocab_size=128, seq_len=64, num_kv_pairs=8, batch_size=16, seed=3),
    "selective_copying": dict(task="selective_copying", vocab_size=10, seq_len=48, num_tokens=6,
                              batch_size=16, seed=3),
    "induction_heads": dict(task="induction_heads", vocab_size=8, seq_len=40, batch_size=16,
                            seed=3),
    "induction_dense": dict(task="induction_heads", vocab_size=8, seq_len=40, batch_size=16,
                            seed=3, dense=True),
}


@pytest.mark.parametrize("task", list(SMALL))
@pytest.mark.parametrize("split", ["train", "validation", "test"])
def test_contract_and_determinism(task, split):
  ds = data.make_dataset(SMALL[task])
  assert ds.kind == "lm" and ds.vocab_size == SMALL[task]["vocab_size"]
  b0 = ds.batch(5, split=split)
  check_contract(ds, b0)
  # Same args, even through a freshly built dataset -> identical arrays.
  assert same_batch(b0, data.make_dataset(SMALL[task]).batch(5, split=split))
  assert same_batch(b0, ds.batch(np.int64(5), split=split))
  assert not same_batch(b0, ds.batch(6, split=split))
  other_seed = dict(SMALL[task], seed=4)
  assert not same_batch(b0, data.make_dataset(other_seed).batch(5, split=split))


@pytest.mark.parametrize("task", list(SMALL))
def test_splits_differ_and_eval_is_fixed(task):
  ds = data.make_dataset(SMALL[task])
  assert not same_batch(ds.batch(0, "train"), ds.batch(0, "validation"))
  ev1 = list(ds.eval_batches("validation", num_batches=3))
  ev2 = list(ds.eval_batches("validation", num_batches=3))
  assert len(ev1) == 3 and all(same_batch(a, b) for a, b in zip(ev1, ev2))
  assert not same_batch(ev1[0], ev1[1])
  assert len(list(ds.eval_batches())) == ds.num_eval_steps() == 16
  for b in ev1:
    check_contract(ds, b)


def _check_mqar_row(x, y, m, v, n, length):
  """One MQAR row with ``n`` pairs whose example ends at ``length`` (filler after it)."""
  keys, values = x[0:2 * n:2], x[1:2 * n:2]
  # Keys distinct in [1, V/2), values distinct in [V/2, V): disjoint halves.
  assert len(set(keys)) == n and len(set(values)) == n
  assert keys.min() >= 1 and keys.max() < v // 2
  assert values.min() >= v // 2 and values.max() < v
  qpos = np.flatnonzero(m)
  assert len(qpos) == n
  assert qpos.min() >= 2 * n and qpos.max() < length and np.all((qpos - 2 * n) % 2 == 0)
  assert np.all(y[m == 0] == 0)
  pairs = dict(zip(keys.tolist(), values.tolist()))
  # Each key asked exactly once, and the target is the value paired with it earlier.
  assert sorted(x[qpos].tolist()) == sorted(keys.tolist())
  for p in qpos:
    assert y[p] == pairs[x[p]]


def test_mqar_definition():
  cfg = SMALL["mqar"]
  ds = data.make_dataset(cfg)
  v, n = cfg["vocab_size"], cfg["num_kv_pairs"]
  assert ds.max_targets_per_row == n
  for step in range(4):
    b = ds.batch(step)
    for x, y, m in zip(b["inputs"], b["targets"], b["mask"]):
      _check_mqar_row(x, y, m, v, n, cfg["seq_len"])


def test_mqar_mixture_rows_are_examples_of_each_setting():
  cfg = dict(SMALL["mqar"], mixture="16:2, 32:4,64:8", batch_size=64)
  ds = data.make_dataset(cfg)
  assert ds.settings == [(16, 2), (32, 4), (64, 8)] and ds.max_targets_per_row == 8
  b = ds.batch(0)
  check_contract(ds, b)
  by_pairs = {2: 16, 4: 32, 8: 64}
  seen = set()
  for x, y, m in zip(b["inputs"], b["targets"], b["mask"]):
    n = int(m.sum())
    assert n in by_pairs
    seen.add(n)
    _check_mqar_row(x, y, m, cfg["vocab_size"], n, by_pairs[n])
  assert seen == {2, 4, 8}  # 64 rows: every setting drawn


@pytest.mark.parametrize("mixture, match", [
    ("16:2,32", "length:pairs"), ("a:b", "length:pairs"), ("16:0", "positive"),
    ("128:8", "seq_len"), ("16:8", "4 \\* pairs"), ("16:80", "vocab_size")])
def test_mqar_bad_mixture_names_the_field(mixture, match):
  with pytest.raises(ValueError, match=match):
    data.make_dataset(dict(SMALL["mqar"], mixture=mixture))


@pytest.mark.parametrize("task", list(SMALL))
def test_max_targets_per_row_bounds_every_row(task):
  ds = data.make_dataset(dict(SMALL[task], batch_size=64))
  for step in range(3):
    assert ds.batch(step)["mask"].sum(1).max() <= ds.max_targets_per_row


def test_mqar_power_law_gaps():
  # With a small power_a, short gaps are much more likely than long ones; with
  # power_a = 1 the gaps are uniform over the available slots.
  base = dict(task="mqar", vocab_size=256, seq_len=256, num_kv_pairs=4, batch_size=256)
  def gaps(power_a):
    b = data.make_dataset(dict(base, power_a=power_a)).batch(0)
    return (np.nonzero(b["mask"])[1] - 8) // 2
  space = (256 - 8) // 2
  g_small, g_uniform = gaps(0.01), gaps(1.0)
  assert g_small.max() < space and g_uniform.max() < space
  assert np.mean(g_small < space // 10) > 0.5
  assert abs(np.mean(g_uniform < space // 2) - 0.5) < 0.06
  # Non-random filler option puts zeros everywhere else.
  b = data.make_dataset(dict(base, random_non_queries=False)).batch(0)
  filler = np.ones_like(b["mask"], bool)
  filler[:, :8] = False
  filler &= b["mask"] == 0
  assert np.all(b["inputs"][filler] == 0)


def test_selective_copying_definition():
  cfg = SMALL["selective_copying"]
  ds = data.make_dataset(cfg)
  v, t, n = cfg["vocab_size"], cfg["seq_len"], cfg["num_tokens"]
  b = ds.batch(2)
  for x, y, m in zip(b["inputs"], b["targets"], b["mask"]):
    assert np.array_equal(np.flatnonzero(m), np.arange(t - n, t))
    assert np.all(x[t - n:] == v - 1)
    body = x[:t - n]
    data_tokens = body[body != 0]
    assert np.all((data_tokens >= 1) & (data_tokens <= v - 2))
    assert np.array_equal(y[t - n:], data_tokens)  # the data tokens, in order


def test_induction_heads_definition():
  cfg = SMALL["induction_heads"]
  ds = data.make_dataset(cfg)
  v, t = cfg["vocab_size"], cfg["seq_len"]
  positions = []
  for step in range(3):
    b = ds.batch(step)
    for x, y, m in zip(b["inputs"], b["targets"], b["mask"]):
      assert np.array_equal(np.flatnonzero(m), [t - 1])
      trig = np.flatnonzero(x == v - 1)
      assert len(trig) == 2 and trig[1] == t - 1 and trig[0] <= t - 3
      assert y[t - 1] == x[trig[0] + 1]
      positions.append(trig[0])
  assert len(set(positions)) > 10  # the first trigger moves around


def test_dense_induction_heads_definition():
  """Each scored token's answer is what followed its first occurrence; the repeat's
  position, offset and length vary, so no position-only rule predicts the answers."""
  cfg = SMALL["induction_dense"]
  ds = data.make_dataset(cfg)
  v, t = cfg["vocab_size"], cfg["seq_len"]
  starts, offsets, lengths = set(), set(), set()
  for step in range(4):
    b = ds.batch(step)
    for x, y, m in zip(b["inputs"], b["targets"], b["mask"]):
      scored = np.flatnonzero(m)
      second, n = scored[0], len(scored) + 1  # the repeat and its length
      assert np.array_equal(scored, np.arange(second, second + n - 1))
      trig = np.flatnonzero(x == v - 1)
      assert len(trig) == 2  # once in the span, once in its repeat
      first = second - (trig[1] - trig[0])
      assert first + n <= second and np.array_equal(x[first:first + n], x[second:second + n])
      np.testing.assert_array_equal(y[scored], x[scored + 1])
      np.testing.assert_array_equal(y[scored], x[scored - second + first + 1])
      starts.add(second), offsets.add(second - first), lengths.add(n)
  assert len(starts) > 10 and len(offsets) > 10 and len(lengths) >= 5


def test_generation_is_fast():
  import time
  for task, cfg in [("mqar", {}), ("selective_copying", {}), ("induction_heads", {})]:
    ds = data.make_dataset(dict(task=task, **cfg))
    t0 = time.perf_counter()
    ds.batch(0)
    assert time.perf_counter() - t0 < 0.5, task
