"""The MQAR study's learning-rate sweep: later rates go only where the first did not solve."""

from __future__ import annotations

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
