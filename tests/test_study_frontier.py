"""The recall-versus-state frontier: its grid order, its claim's arithmetic against values
worked out by hand, and its smoke size end to end (the JSON the claim and notebook read)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests import helpers

claims = helpers.load_experiment("claims")
frontier = helpers.load_experiment("study_frontier")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_points_run_each_lines_ends_first_and_windows_stay_below_t():
  pts = frontier.points_of(frontier.FULL, seeds=(0, 1))
  first = [(p["model.mixer"], frontier.state_of(p)[1]) for p in pts[:6]]
  # Every architecture's smallest then largest state, then the middle ones.
  assert first == [("gated_deltanet", 8), ("based", 4), ("local", 16),
                   ("gated_deltanet", 32), ("based", 16), ("local", 64)]
  assert [frontier.state_of(p)[1] for p in pts[6:9]] == [16, 8, 32]
  assert len(pts) == 18 and all(p["train.seed"] == 1 for p in pts[9:])
  assert frontier.state_of(pts[2]) == ("window", 16)
  frontier.check_size(frontier.FULL)
  with pytest.raises(ValueError, match="window >= T is full attention"):
    frontier.check_size(dict(frontier.FULL, grid={"local": ("window", (32, 128))}))


def _table(lines):
  """Rows of ``lines``: ``{mixer: [(state_floats, accuracy, se), ...]}``."""
  return [{"mixer": m, "state_option": "x", "state_value": i, "state_floats": f, "accuracy": a,
           "se": se, "n_seeds": 1}
          for m, pts in lines.items() for i, (f, a, se) in enumerate(pts)]


def _result(lines, runs=()):
  return {"config": {"smoke": False, "seq_len": 256, "num_kv_pairs": 16, "d_model": 64,
                     "vocab": 512, "steps": 1000, "batch": 16},
          "budget": {"fraction_of_paper_examples": 0.0015}, "table": _table(lines),
          "runs": list(runs)}


def _verdict(lines, runs=()):
  rows = claims.study_claims("frontier", _result(lines, runs))
  assert len(rows) == 1 and rows[0]["id"] == "C35"
  return rows[0]


def test_growth_verdict_flips_with_the_difference_se():
  # gla: 0.39 - 0.20 = 0.19 against 2 * sqrt(0.06^2 + 0.08^2) = 2 * 0.10 = 0.20: not
  # significant; with se 0.05 and 0.08 it is 2 * sqrt(0.0089) = 0.1887 < 0.19: significant.
  # (Twice the sum of the SEs, 0.28 or 0.26, would call neither significant.)
  big = {"based": [(10, 0.1, 0.01), (20, 0.5, 0.01), (40, 0.9, 0.01)],
         "local": [(64, 0.05, 0.01), (256, 0.6, 0.02)]}
  row = _verdict({"gla": [(8, 0.20, 0.06), (32, 0.39, 0.08)], **big})
  # 2 of 3 significant (more than half), none significantly negative: in shape.
  assert row["verdict"] == claims.INCONCLUSIVE and "by the numbers alone: reproduced in shape" \
      in row["reason"]
  assert "in 2 of 3 (based, local)" in row["reason"]
  row = _verdict({"gla": [(8, 0.20, 0.05), (32, 0.39, 0.08)], **big})
  assert "by the numbers alone: reproduced;" in row["reason"]  # all 3 significant
  assert "gla 0->1 (8->32 floats): 0.200->0.390, 0.190 ± 0.094" in row["ours"]


def test_growth_leaves_out_solved_lines_and_needs_three():
  # based solved at its smallest state (0.96 >= 0.95): left out, 2 lines left: not measured.
  lines = {"based": [(10, 0.96, 0.01), (40, 0.99, 0.01)],
           "gla": [(8, 0.1, 0.01), (32, 0.5, 0.01)], "local": [(64, 0.1, 0.01), (256, 0.5, 0.01)]}
  row = _verdict(lines)
  assert row["verdict"] == claims.NOT_MEASURED and "left out" in row["reason"] and "based" in \
      row["reason"]
  # A third growing line makes it measurable; a significantly falling one: not reproduced
  # (1 of 3 significant: 0.5 - 0.1 = 0.4 > 2 * 0.0141; mamba -0.3 < -2 * 0.0141).
  lines["mamba"] = [(4, 0.4, 0.01), (64, 0.1, 0.01)]
  lines["local"] = [(64, 0.1, 0.1), (256, 0.2, 0.1)]  # 0.1 < 2 * 0.1414: not significant
  row = _verdict(lines)
  assert "by the numbers alone: not reproduced" in row["reason"]
  assert "significantly negative: mamba" in row["reason"]


def test_partial_results_are_named():
  lines = {m: [(8, 0.1, 0.01), (32, 0.5, 0.01)] for m in ("gla", "based", "local")}
  row = _verdict(lines, runs=[{"status": "done"}, {"status": "not run"}])
  assert "; partial results: 1 of 2 runs unfinished (not run 1); " in row["reason"]


def test_smoke_writes_the_json_the_claim_reads(tmp_path):
  out = tmp_path / "mqar_frontier"
  proc = subprocess.run(
      [sys.executable, "experiments/studies/study_frontier.py", "--smoke", "--workers", "1",
       "--out", str(out), "--runs", str(tmp_path / "runs")],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  res = json.loads((out / "frontier.json").read_text())
  assert res["study"] == "frontier" and res["config"]["smoke"] is True
  assert len(res["runs"]) == 2 and all(r["status"] == "done" for r in res["runs"])
  for r in res["runs"]:
    assert r["test_queries"] >= 16 and r["test_se"] >= 0 and r["seconds"] > 0
    assert not os.path.isabs(r["workdir"])
  floats = {(t["mixer"], t["state_value"]): t["state_floats"] for t in res["table"]}
  # The cache holds the window's tokens: a wider window, more floats.
  assert floats["local", 4] < floats["local", 8]
  assert (out / "frontier.csv").exists()
  rows = claims.study_claims("frontier", claims.load(str(tmp_path), "frontier"))
  assert rows[0]["reason"].startswith("smoke-size results")


def test_table_averages_finished_seeds_and_leaves_a_stopped_one_out():
  def run(seed, acc, status="done", value=16):
    return {"mixer": "local", "state_option": "window", "state_value": value, "seed": seed,
            "status": status, "test_accuracy": acc, "test_se": 0.01, "state_floats": 100,
            "test_queries": 1024, "steps_run": 1000, "seconds": 12.34, "overrides": (
                {"train.seed": seed} if seed else {}), "metrics": {"num_params": 7},
            "test_sequence_correct": [8, 8], "test_sequence_queries": [16, 16]}
  rows = [run(0, 0.5), run(1, 0.7), run(2, 0.1, "stopped"), run(2, 0.3, "stopped", value=32)]
  t16, t32 = frontier.table_of(rows, frontier.FULL)
  # Seeds 0 and 1: mean 0.6, between-seed SE stdev([0.5, 0.7]) / sqrt(2) = 0.1414 / 1.414 = 0.1.
  assert t16["accuracy"] == pytest.approx(0.6) and t16["se"] == pytest.approx(0.1)
  assert t16["se_kind"] == "between-seed" and t16["stopped_seeds_left_out"] == [2]
  assert t16["seconds"] == [12.3, 12.3]
  # A point with only a stopped seed is scored on it (clustered SE: 2 sequences of 8 of 16).
  assert t32["n_seeds"] == 1 and t32["accuracy"] == 0.3 and t32["se_kind"] == "clustered"


def test_merge_keeps_the_other_seeds_and_refuses_another_size(tmp_path):
  size = dict(frontier.FULL)
  cfg = json.loads(json.dumps({**size, "seeds": [0, 1], "xla_flags": "--flag"}))
  runs = [{"seed": 0, "workdir": "runs/a", "status": "done"},
          {"seed": 1, "workdir": "runs/b", "status": "done"}]
  path = tmp_path / "frontier.json"
  path.write_text(json.dumps({"config": cfg, "runs": runs}))
  rows = frontier.merge_rows(str(path), size, seeds=(1, 2))
  assert [r["seed"] for r in rows] == [0] and rows[0]["merged_from"]["xla_flags"] == "--flag"
  with pytest.raises(ValueError, match="no runs of seeds other than"):
    frontier.merge_rows(str(path), size, seeds=(0, 1))
  with pytest.raises(ValueError, match="steps=1000 here 500"):
    frontier.merge_rows(str(path), dict(size, steps=500), seeds=(2,))
