"""The training loop on a tiny in-memory dataset: optimiser, metrics, determinism, errors."""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from linear_attention import models, train
from linear_attention import nn as lnn
from linear_attention.train import optim
from tests.train.fake_data import FakeDataset, fake_config


def _leaves(tree):
  return [np.asarray(x) for x in jax.tree_util.tree_leaves(tree)]


def test_decay_mask_skips_norms_biases_and_1d():
  model = models.LanguageModel(32, 16, 2, pattern="RS", num_heads=2, rngs=nnx.Rngs(0))
  params = nnx.state(model, nnx.Param)
  mask = optim.decay_mask(params)
  flat = {jax.tree_util.keystr(p): (m, x.ndim) for (p, m), x in zip(
      jax.tree_util.tree_leaves_with_path(mask), jax.tree_util.tree_leaves(params))}
  assert flat, "no parameters"
  for path, (decayed, ndim) in flat.items():
    if ndim < 2 or any(f"'{n}'" in path for n in ("scale", "bias", "b", "A_log", "dt_bias")):
      assert not decayed, path
  assert any(d for d, _ in flat.values())  # matrices are decayed
  assert flat["['backbone']['embed']['embedding'].value"][0]
  # Hawk's gate bias is 2-D ([heads, width]) but a bias: not decayed.
  gate_b = [k for k in flat if "'gate_i']['b']" in k]
  assert gate_b and not flat[gate_b[0]][0] and flat[gate_b[0]][1] == 2


def test_decay_mask_judges_a_stacked_parameter_by_one_layer():
  def mask(scan):
    model = models.LanguageModel(32, 16, 2, mixer="gla", num_heads=2, rngs=nnx.Rngs(0),
                                 scan_layers=scan)
    return {jax.tree_util.keystr(p): bool(m) for p, m in jax.tree_util.tree_leaves_with_path(
        optim.decay_mask(nnx.state(model, nnx.Param)))}
  # Layer 0 of the unscanned model against the stack of both layers (period 1).
  ref = {k.replace("['blocks'][0]", "['blocks']['stacked_layers'][0]"): v
         for k, v in mask(False).items() if "['blocks'][1]" not in k}
  assert mask(True) == ref
  assert sorted(set(ref.values())) == [False, True]


# Written out, not read from optim.NO_DECAY_NAMES: dropping a name there must fail here.
EXPECTED_NO_DECAY = ("scale", "bias", "b", "dt_bias", "A_log", "D", "log_lambda", "log_dt",
                     "A_imag", "log_neg_A_real", "decay_base", "bonus", "maa_x", "maa_wkvrg")


def test_decay_mask_excludes_every_named_parameter_whatever_its_rank():
  params = {n: jnp.ones((2, 3)) for n in EXPECTED_NO_DECAY}
  params["kernel"] = jnp.ones((2, 3))
  mask = optim.decay_mask(params)
  assert [n for n in EXPECTED_NO_DECAY if mask[n]] == []
  assert mask["kernel"]


def test_decay_mask_on_every_mixer_excludes_the_named_matrices():
  # Every pattern letter once: RWKV-6's bonus and token-shift mixes, Mamba's A_log, Hawk's
  # gate bias and S4D's poles are 2-D yet not decayed; projections and embeddings are.
  letters = "".join(lnn.PATTERN_LETTERS)
  model = models.LanguageModel(32, 16, None, pattern=letters, num_heads=2, rngs=nnx.Rngs(0),
                               mixer_kwargs={"rwkv6": dict(mix_low_rank=4, decay_low_rank=4)})
  params = nnx.state(model, nnx.Param)
  mask = optim.decay_mask(params)
  excluded, decayed = set(), set()
  for (path, m), x in zip(jax.tree_util.tree_leaves_with_path(mask),
                          jax.tree_util.tree_leaves(params)):
    if x.ndim >= 2:
      (decayed if m else excluded).add(optim._name(path))
  assert excluded == {"A_imag", "A_log", "b", "bonus", "log_neg_A_real", "maa_wkvrg"}
  assert {"kernel", "embedding"} <= decayed


def test_weight_decay_leaves_masked_params_alone():
  """With zero gradients AdamW changes only decayed parameters."""
  model = models.LanguageModel(32, 16, 1, mixer="gla", num_heads=2, rngs=nnx.Rngs(0))
  cfg = fake_config().optim
  cfg.weight_decay = 0.5
  opt = optim.make_optimizer(model, cfg, total_steps=4)
  before = nnx.state(model, nnx.Param)
  before = jax.tree.map(lambda x: np.asarray(x).copy(), before)
  for _ in range(3):
    grads = jax.tree.map(jnp.zeros_like, nnx.state(model, nnx.Param))
    opt.update(model, grads)
  after = nnx.state(model, nnx.Param)
  mask = optim.decay_mask(after)
  for m, b, a in zip(jax.tree_util.tree_leaves(mask), _leaves(before), _leaves(after)):
    if m:
      assert not np.array_equal(a, b)
    else:
      np.testing.assert_array_equal(a, b)


def test_lr_schedule_warmup_then_cosine():
  cfg = fake_config().optim
  cfg.lr, cfg.warmup_steps, cfg.final_lr_ratio = 1.0, 10, 0.1
  s = optim.lr_schedule(cfg, 110)
  assert float(s(0)) == 0.0
  np.testing.assert_allclose(float(s(5)), 0.5, rtol=1e-6)
  np.testing.assert_allclose(float(s(10)), 1.0, rtol=1e-6)
  np.testing.assert_allclose(float(s(60)), 0.55, rtol=1e-5)  # cosine midpoint: (1 + 0.1) / 2
  np.testing.assert_allclose(float(s(110)), 0.1, rtol=1e-5)
  assert all(float(s(i)) >= float(s(i + 1)) for i in range(10, 110))


def test_loss_is_masked_mean():
  model = models.LanguageModel(16, 8, 1, mixer="softmax", num_heads=2, rngs=nnx.Rngs(0))
  b = FakeDataset().batch(0)
  loss, aux = train.loss_and_metrics(model, b, "lm")
  logits = np.asarray(model(b["inputs"]), np.float64)
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  ce = -np.take_along_axis(logp, b["targets"][..., None], -1)[..., 0]
  np.testing.assert_allclose(float(loss), (ce * b["mask"]).sum() / b["mask"].sum(), rtol=1e-5)
  assert float(aux["weight"]) == b["mask"].sum()


def test_run_writes_metrics_config_checkpoints_and_is_deterministic(tmp_path):
  cfg = fake_config(steps=6)
  r1 = train.train_and_evaluate(cfg, str(tmp_path / "a"), dataset=FakeDataset(), verbose=False)
  r2 = train.train_and_evaluate(cfg, str(tmp_path / "b"), dataset=FakeDataset(), verbose=False)
  for k in ("train_loss", "validation_loss", "validation_accuracy"):
    assert r1[k] == r2[k]
  p1, p2 = train.load_checkpoint(str(tmp_path / "a")), train.load_checkpoint(str(tmp_path / "b"))
  for x, y in zip(_leaves(p1), _leaves(p2)):
    np.testing.assert_array_equal(x, y)
  wd = tmp_path / "a"
  assert sorted(os.listdir(wd / "checkpoints")) == ["4", "6"]  # keep_checkpoints=2
  assert json.loads((wd / "config.json").read_text())["optim"]["lr"] == cfg.optim.lr
  recs = [json.loads(l) for l in (wd / "metrics.jsonl").read_text().splitlines()]
  train_recs = [r for r in recs if r["split"] == "train"]
  assert [r["step"] for r in train_recs] == [2, 4, 6]
  assert [r["step"] for r in recs if r["split"] == "validation"] == [3, 6]
  for r in train_recs:
    assert {"loss", "accuracy", "lr", "tokens_per_s", "elapsed"} <= set(r)
    assert np.isfinite(r["loss"]) and 0 <= r["accuracy"] <= 1
  assert train_recs[-1]["loss"] == r1["train_loss"]
  assert any(f.startswith("events.out.tfevents") for f in os.listdir(wd / "tensorboard"))
  assert json.loads((wd / "final_metrics.json").read_text())["validation_loss"] == r1["validation_loss"]


def test_training_reduces_loss(tmp_path):
  cfg = fake_config(steps=40, eval_every=0, checkpoint_every=0, log_every=10)
  cfg.optim.lr = 1e-2
  train.train_and_evaluate(cfg, str(tmp_path), dataset=FakeDataset(), verbose=False)
  losses = [r["loss"] for r in train.metrics.read_metrics(str(tmp_path), "train")]
  assert losses[-1] < losses[0] - 0.3


def test_classifier_runs(tmp_path):
  res = train.train_and_evaluate(fake_config(steps=2, eval_every=0), str(tmp_path),
                                 dataset=FakeDataset("classify"), verbose=False)
  assert np.isfinite(res["validation_loss"]) and 0 <= res["validation_accuracy"] <= 1


def test_non_finite_loss_stops_naming_the_step_and_saves_nothing_bad(tmp_path):
  cfg = fake_config(steps=8, checkpoint_every=2, log_every=4, eval_every=0)
  with pytest.raises(train.NonFiniteLossError, match="step 4"):
    train.train_and_evaluate(cfg, str(tmp_path), dataset=FakeDataset(nan_at=3), verbose=False)
  assert sorted(os.listdir(tmp_path / "checkpoints")) == ["2"]
  assert not (tmp_path / "final_metrics.json").exists()
  assert all(r["step"] < 4 for r in train.metrics.read_metrics(str(tmp_path)))


def test_errors_before_anything_is_written(tmp_path):
  wd = tmp_path / "run"
  with pytest.raises(ValueError, match="unknown mixer 'nope'.*gla"):
    train.train_and_evaluate(fake_config(mixer="nope"), str(wd), dataset=FakeDataset())
  assert not wd.exists()
  blocker = tmp_path / "file"
  blocker.write_text("x")
  with pytest.raises(ValueError, match="workdir"):
    train.train_and_evaluate(fake_config(), str(blocker / "run"), dataset=FakeDataset())
  cfg = fake_config()
  cfg.optim.lr = -1.0
  with pytest.raises(ValueError, match="optim.lr"):
    train.train_and_evaluate(cfg, str(wd), dataset=FakeDataset())
  assert not wd.exists()


def test_logits_at_counted_positions_only_give_the_same_loss_and_gradient():
  model = models.LanguageModel(16, 8, 1, mixer="gla", num_heads=2, rngs=nnx.Rngs(0))
  b = FakeDataset().batch(0)
  b["mask"][1, -3:] = 0.0  # rows with fewer counted positions than the bound
  k = int(b["mask"].sum(1).max())

  def loss(m, bound):
    return train.loss_and_metrics(m, b, "lm", bound)

  (l_dense, a_dense), g_dense = nnx.value_and_grad(loss, has_aux=True)(model, None)
  (l_sparse, a_sparse), g_sparse = nnx.value_and_grad(loss, has_aux=True)(model, k)
  np.testing.assert_allclose(float(l_sparse), float(l_dense), rtol=1e-6)
  for key in a_dense:
    np.testing.assert_allclose(float(a_sparse[key]), float(a_dense[key]), rtol=1e-6)
  for x, y in zip(_leaves(g_sparse), _leaves(g_dense)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)


def test_evaluate_checkpoint_reproduces_validation_and_changes_the_data(tmp_path):
  from configs import mqar
  cfg = mqar.get_config("mixer=gla,size=smoke")
  cfg.train.steps, cfg.train.eval_every, cfg.train.eval_batches = 3, 0, 2
  wd = str(tmp_path / "run")
  final = train.train_and_evaluate(cfg, wd, verbose=False)
  again = train.evaluate_checkpoint(wd, num_batches=2)
  assert again["step"] == 3
  np.testing.assert_allclose(again["loss"], final["validation_loss"], rtol=1e-6)
  assert again["accuracy"] == final["validation_accuracy"]
  longer = train.evaluate_checkpoint(wd, {"seq_len": 128, "num_kv_pairs": 8}, num_batches=1,
                                     split="test")
  assert np.isfinite(longer["loss"]) and 0 <= longer["accuracy"] <= 1
  assert longer["loss"] != again["loss"]
  with pytest.raises(ValueError, match="vocabulary"):
    train.evaluate_checkpoint(wd, {"vocab_size": 128})
  with pytest.raises(ValueError, match="num_kv_pairs"):
    train.evaluate_checkpoint(wd, {"num_kv_pairs": 0})
  with pytest.raises(ValueError, match="config.json"):
    train.evaluate_checkpoint(str(tmp_path))


class _Interrupted(Exception):
  pass


class _RecordingDataset(FakeDataset):
  """Records the training steps it is asked for; raises at ``crash_at`` (a killed run)."""

  def __init__(self, crash_at=None):
    super().__init__()
    self.crash_at, self.steps = crash_at, []

  def batch(self, step, split="train"):
    if split == "train":
      self.steps.append(step)
      if step == self.crash_at:
        raise _Interrupted(step)
    return super().batch(step, split)


@pytest.mark.parametrize("scan", [False, True])
def test_resume_restores_the_optimiser_state_and_the_data_position(tmp_path, scan):
  cfg = fake_config(steps=6, checkpoint_every=2, keep_checkpoints=3, eval_every=0)
  if scan:  # two blocks stored stacked (model.scan_layers): the checkpoint holds the stack
    cfg.model.num_layers, cfg.model.scan_layers = 2, True
  full = train.train_and_evaluate(cfg, str(tmp_path / "full"), dataset=FakeDataset(),
                                  verbose=False)
  wd = str(tmp_path / "cut")
  with pytest.raises(_Interrupted):
    train.train_and_evaluate(cfg, wd, dataset=_RecordingDataset(crash_at=4), verbose=False)
  # The optimiser's moments and step counts are in the checkpoint, not only the parameters.
  opt_state = {jax.tree_util.keystr(p): np.asarray(x) for p, x in
               jax.tree_util.tree_leaves_with_path(train.load_checkpoint(wd, 4)["1"])}
  counts = [v for k, v in opt_state.items() if "count" in k or "'step'" in k]
  assert counts and all(int(c) == 4 for c in counts)
  assert scan == any("stacked_layers" in k for k in opt_state)
  assert all(np.any(v != 0) for k, v in opt_state.items() if "['mu']" in k)
  ds = _RecordingDataset()
  resumed = train.train_and_evaluate(cfg, wd, dataset=ds, verbose=False)
  assert ds.steps == [0, 4, 5]  # the first-batch check, then the data from step 4 on
  for k in ("train_loss", "validation_loss", "validation_accuracy"):
    assert resumed[k] == full[k], k
  # Bit for bit: a resume that dropped the optimiser state would differ in parameters.
  for x, y in zip(_leaves(train.load_checkpoint(str(tmp_path / "full"), 6)),
                  _leaves(train.load_checkpoint(wd, 6))):
    np.testing.assert_array_equal(x, y)
