"""The MQAR study's learning-rate sweep: later rates go only where the first did not solve."""

from __future__ import annotations

import os

from tests import helpers

mqar = helpers.load_experiment("study_mqar")


def test_later_learning_rates_only_for_unsolved_points():
  size = dict(mqar.SMOKE, mixers=("softmax", "gla", "mamba"), lrs=(3e-3, 1e-3))
  points = mqar.points_of(size)
  first = [p for p in points if p["optim.lr"] == 3e-3]
  assert len(first) == len(points) // 2 == 4  # 3 mixers with the conv, softmax without

  def row(p, status, acc):
    return {"overrides": p, "status": status, "metrics": {"validation_accuracy": acc}}

  by_mixer = {(p["model.mixer"], p["model.short_conv"]): p for p in first}
  rows = [row(by_mixer[("softmax", 3)], "done", 0.995),  # solved: no second rate
          row(by_mixer[("gla", 3)], "done", 0.90),       # below 0.99: second rate
          row(by_mixer[("mamba", 3)], "failed", 0.999),  # unfinished: second rate
          row(by_mixer[("softmax", 0)], "done", 0.25)]
  later = mqar.later_lr_points(points, rows, threshold=size["early_stop"])
  assert all(p["optim.lr"] == 1e-3 for p in later)
  assert sorted((p["model.mixer"], p["model.short_conv"]) for p in later) == [
      ("gla", 3), ("mamba", 3), ("softmax", 0)]
  # With nothing finished yet every later point is due.
  assert len(mqar.later_lr_points(points, [], 0.99)) == 4


def test_init_sweep_adds_points_only_for_the_mixers_it_names():
  size = dict(mqar.SMOKE, mixers=("softmax", "gla", "mamba2", "hawk"), inits=("default", "slow"))
  points = mqar.points_of(size)
  slow = [p for p in points if mqar.init_of(p) == "slow"]
  assert sorted(p["model.mixer"] for p in slow) == ["hawk", "mamba2"]
  assert len(points) == 5 + 2  # 4 mixers with the conv and softmax without, then 2 slow
  m2 = next(p for p in slow if p["model.mixer"] == "mamba2")
  assert m2["model.mixer_kwargs.mamba2.a_init_range"] == mqar.INITS["slow"]["mamba2"]["a_init_range"]
  # A JSON round trip (tuples -> lists) keeps the init's name; other overrides are not an init.
  assert mqar.init_of({**m2, "model.mixer_kwargs.mamba2.a_init_range": [1 / 32, 0.5]}) == "slow"
  assert mqar.init_of({**m2, "model.mixer_kwargs.mamba2.a_init_range": [1.0, 2.0]}) == "default"
  # Each init is its own grid point for the later learning rates.
  assert mqar.setting_key(m2) != mqar.setting_key({k: v for k, v in m2.items()
                                                    if "mixer_kwargs" not in k})


def _run(mixer, acc, init="default", lr=3e-3, status="done", **extra):
  o = {"model.mixer": mixer, "model.short_conv": 3, "data.seq_len": 64, "data.num_kv_pairs": 4,
       "model.d_model": 64, "optim.lr": lr, **mqar.init_overrides(mixer, init)}
  return {"overrides": o, "status": status, "init": init, "test_accuracy": acc, "test_se": 0.01,
          **extra,
          "test_queries": 1024, "state_floats": 10, "steps_run": 1000,
          "metrics": {"num_params": 1, "validation_accuracy": acc}}


def test_best_table_tunes_the_init_and_shows_the_default_beside():
  rows = [_run("mamba2", 0.25), _run("mamba2", 0.9, "slow"), _run("mamba2", 0.2, lr=1e-3),
          _run("gla", 0.8)]
  table = {r["mixer"]: r for r in mqar.best_table(rows, mqar.FULL)}
  assert table["mamba2"]["accuracy"] == 0.9 and table["mamba2"]["best_init"] == "slow"
  assert table["mamba2"]["default_init_accuracy"] == 0.25
  assert table["mamba2"]["lr_accuracies"] == {"0.003": 0.25, "0.001": 0.2}
  assert table["mamba2"]["init_accuracies"] == {"default@0.003": 0.25, "slow@0.003": 0.9,
                                                "default@0.001": 0.2}
  assert table["gla"]["best_init"] == "default" and table["gla"]["default_init_accuracy"] == 0.8
  assert list(table) == ["gla", "mamba2"]  # registry order


def test_merge_keeps_committed_runs_and_adds_new_ones():
  old = [_run("mamba2", 0.25), _run("gla", 0.8)]
  new = [_run("mamba2", 0.9, "slow"), _run("gla", 0.0, status="not run"),
         _run("hawk", 0.0, status="not run")]
  merged = mqar.merge_runs(old, new)
  accs = sorted((r["overrides"]["model.mixer"], r["init"], r["test_accuracy"]) for r in merged)
  # The unfinished gla rerun does not replace the committed one; hawk, never run, is not added.
  assert accs == [("gla", "default", 0.8), ("mamba2", "default", 0.25), ("mamba2", "slow", 0.9)]


def test_merged_runs_keep_their_own_step_budget():
  # Committed runs without a recorded budget get their study's; a shorter new run keeps its own,
  # and the table shows each (init, rate)'s budget beside its accuracy.
  old = [_run("mamba2", 0.25), _run("gla", 0.5, lr=1e-3, status="not run")]
  merged = mqar.merge_runs(old, [_run("mamba2", 0.6, "slow", steps_max=500)], old_steps=1000)
  steps = {(r["init"], r["status"]): r.get("steps_max") for r in merged}
  assert steps == {("default", "done"): 1000, ("slow", "done"): 500, ("default", "not run"): None}
  row = next(r for r in mqar.best_table(merged, mqar.FULL) if r["mixer"] == "mamba2")
  assert row["init_steps"] == {"default@0.003": 1000, "slow@0.003": 500}
  assert row["best_init"] == "slow" and row["default_init_accuracy"] == 0.25


su = helpers.load_experiment("_study_utils")


def test_smoke_results_go_elsewhere_unless_asked(tmp_path):
  p = su.study_args("doc", "mqar")
  assert p.parse_args([]).out == su.default_out("mqar", False)
  smoke = p.parse_args(["--smoke"]).out
  committed = os.path.join(su.REPO_ROOT, "results", "studies")
  assert not os.path.realpath(smoke).startswith(os.path.realpath(committed) + os.sep)
  assert os.path.relpath(smoke, su.REPO_ROOT).startswith("runs" + os.sep)  # gitignored
  assert p.parse_args(["--smoke", "--out", str(tmp_path)]).out == str(tmp_path)
  rs = helpers.load_experiment("run_studies")
  assert rs.study_command("mqar", "/x", smoke=True)[-1] == os.path.join("/x", "mqar")


def test_results_carry_no_machine_paths():
  root = su.REPO_ROOT
  assert su.relative_path(os.path.join(root, "runs", "studies", "mqar", "000")) == \
      os.path.join("runs", "studies", "mqar", "000")
  assert su.relative_path("/elsewhere/runs/studies/mqar/000") == "runs/studies/mqar/000"
  assert su.portable({"a": ["/x/runs/b", "not /a path"], "n": 3}) == \
      {"a": ["runs/b", "not /a path"], "n": 3}
  assert su._portable_arg(os.path.join(root, "results", "x")) == os.path.join("results", "x")
  assert su._portable_arg("--out=" + os.path.join(root, "r")) == "--out=r"
  assert su._portable_arg("3e-3") == "3e-3"
  # Every tracked file, the results included: tests/test_repo_hygiene.py.


def _curve(*accs, every=100):
  return [{"step": every * (i + 1), "accuracy": a} for i, a in enumerate(accs)]


def test_same_step_compares_a_shorter_run_where_the_default_was_then():
  # The slow run stopped at step 300: it is set beside the default's step-300 accuracy, not
  # its final one; an unmatched step (curves logged at different steps) gives no comparison.
  default = _run("mamba2", 0.3, validation_curve=_curve(0.0, 0.1, 0.2, 0.25, 0.3))
  slow = _run("mamba2", 0.6, "slow", validation_curve=_curve(0.0, 0.4, 0.6), stopped_at=300)
  assert mqar.same_step(slow, default) == {"step": 300, "accuracy": 0.6, "default_accuracy": 0.2}
  assert mqar.curve_at(default["validation_curve"], 250) == {"step": 200, "accuracy": 0.1}
  assert mqar.curve_at(default["validation_curve"], 50) is None
  odd = _run("mamba2", 0.6, "slow", validation_curve=_curve(0.1, 0.5, 0.6, every=70))
  assert mqar.same_step(odd, default) is None
  assert mqar.same_step(slow, None) is None
  row = next(r for r in mqar.best_table([default, slow], mqar.SMOKE))
  assert row["best_init"] == "slow" and row["stopped_at"] == 300
  assert row["init_stopped_at"] == {"slow@0.003": 300}
  # Validation queries: 1 batch of 8 sequences with 4 pairs (SMOKE).
  assert row["same_step"] == {"slow@0.003": {"step": 300, "accuracy": 0.6,
                                             "default_accuracy": 0.2, "queries": 32}}


def test_a_stopped_run_is_scored_at_its_newest_checkpoint(tmp_path):
  ckpts = tmp_path / "checkpoints"
  for step in ("100", "300", "tmp-200"):  # an unfinished save is not a checkpoint
    (ckpts / step).mkdir(parents=True)
  row = {"status": "not run", "workdir": str(tmp_path)}
  assert mqar.mark_stopped(row) and row == {"status": "stopped", "stopped_at": 300,
                                            "workdir": str(tmp_path)}
  empty = {"status": "not run", "workdir": str(tmp_path / "never")}
  assert not mqar.mark_stopped(empty) and empty["status"] == "not run"
  failed = {"status": "failed", "workdir": str(tmp_path)}  # a failure stays a failure
  assert not mqar.mark_stopped(failed) and failed["status"] == "failed"


def test_a_run_scored_at_a_checkpoint_is_not_reported_as_failed():
  rows = [{"status": "done", "test_accuracy": 0.5}, {"status": "not run"},
          {"status": "stopped", "stopped_at": 300, "test_accuracy": 0.1},  # scored: a cut
          {"status": "stopped"}, {"status": "failed"}]  # no checkpoint to score; a failure
  assert mqar.unfinished(rows) == [rows[0], rows[1], rows[3], rows[4]]


def test_seeds_are_an_axis_and_seed_zero_sets_no_override():
  size = dict(mqar.SMOKE, mixers=("gla",), no_conv_mixers=(), seeds=(0, 1, 2))
  points = mqar.points_of(size)
  assert [p.get("train.seed") for p in points] == [None, 1, 2]
  # Each seed is its own point for the later learning rates.
  assert len({mqar.setting_key(p) for p in points}) == 3


def test_frontier_sweep_varies_the_state_within_each_architecture():
  from configs import mqar as mqar_config
  from linear_attention import nn

  points = mqar_config.get_sweep("sweep=frontier,seeds=0/1/2")
  assert len(points) == 4 * 3 * 3  # architectures x state sizes x seeds
  for m, (key, values) in mqar_config.FRONTIER.items():
    assert key in nn.mixer_kwargs(m)
    got = sorted(p[f"model.mixer_kwargs.{m}.{key}"] for p in points
                 if p["model.mixer"] == m and "train.seed" not in p)
    assert got == sorted(values)
  assert len(mqar_config.get_sweep(None)) == 2 * len(mqar.MIXERS)  # the default sweep unchanged
  import pytest
  with pytest.raises(ValueError, match="sweep"):
    mqar_config.get_sweep("sweep=nope")
  with pytest.raises(ValueError, match="seeds"):
    mqar_config.get_sweep("sweep=frontier,seeds=a/b")
