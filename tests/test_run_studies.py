"""``experiments/studies/run_studies.py --collect``: what it collects, and a clear refusal when there
is nothing to collect."""

from __future__ import annotations

import json

import pytest

from linear_attention import sweep
from tests import helpers

rs = helpers.load_experiment("run_studies")


@pytest.fixture
def runs(tmp_path, monkeypatch):
  root = tmp_path / "runs"
  monkeypatch.setattr(rs, "RUNS", str(root))
  monkeypatch.setattr(rs, "LOGS", str(root / "logs"))
  return root


def _run(root, rel: str, status: str) -> None:
  d = root / rel
  d.mkdir(parents=True)
  (d / sweep.STATUS_FILE).write_text(json.dumps({"status": status, "overrides": {}}))


@pytest.mark.parametrize("make", ["missing", "empty", "unfinished"])
def test_collect_with_no_finished_run_says_where_it_looked_and_exits_1(runs, tmp_path, capsys,
                                                                        make):
  # Before: every collecting study wrote an empty table, then 25 "not measured" claims, exit 0.
  if make != "missing":
    runs.mkdir()
  if make == "unfinished":
    _run(runs, "mqar/000-mixer=gla", "failed")
    (runs / "synthetic" / "001-x").mkdir(parents=True)  # started, no status yet
  results = tmp_path / "results"
  assert rs.main(["--collect", "--results", str(results), "--no-notebooks"]) == 1
  err = capsys.readouterr().err
  assert "error: --collect found no finished training run" in err
  for study in ("mqar", "synthetic", "extrapolation", "hybrid"):  # the studies that collect
    assert f"runs/{study}" in err
  assert "Train first: python experiments/studies/run_studies.py" in err
  assert not results.exists()  # nothing written, no claims


def test_collect_names_smoke_runs_and_the_chosen_studies(runs, capsys):
  assert rs.main(["--collect", "--smoke", "--only", "mqar", "--results", "/unused",
                  "--dry-run"]) == 1
  err = capsys.readouterr().err
  assert "runs/mqar-smoke" in err and "synthetic" not in err
  assert err.rstrip().endswith("run_studies.py --only mqar --smoke (a stopped run resumes; "
                               "--collect then writes what finished).")


def test_collect_of_a_partial_folder_collects_the_studies_with_a_finished_run(runs, capsys):
  _run(runs, "mqar/000-mixer=gla", "done")
  _run(runs, "mqar/001-mixer=softmax", "failed")
  _run(runs, "hybrid/lm/000-pattern=SSSA", "done")  # one sweep per task, a level down
  _run(runs, "synthetic/copying/000-mixer=gla", "failed")
  assert rs.main(["--collect", "--results", "/unused", "--dry-run"]) == 0
  out = capsys.readouterr().out
  ran = [ln.split("]")[0][1:] for ln in out.splitlines() if ln.startswith("[")]
  assert ran == ["mqar", "hybrid"]
  assert ("leaving synthetic, extrapolation, selective_copying as they are (no finished run "
          "under") in out
  assert "leaving cost, approximation, lm, listops as they are (no --collect" in out


def test_collect_of_only_studies_without_collect_exits_1(runs, capsys):
  assert rs.main(["--collect", "--only", "cost", "--results", "/unused", "--dry-run"]) == 1
  assert "none of cost takes --collect (those that do: mqar, synthetic" in capsys.readouterr().err


def test_finished_runs_counts_done_records_at_any_depth(tmp_path):
  _run(tmp_path, "a/000", "done")
  _run(tmp_path, "a/000/checkpoints/9", "done")  # inside a run: not another run
  _run(tmp_path, "b/c/001", "done")
  _run(tmp_path, "b/002", "failed")
  (tmp_path / "d" / "003").mkdir(parents=True)
  (tmp_path / "d" / "003" / sweep.STATUS_FILE).write_text("{cut")
  assert rs.finished_runs(str(tmp_path)) == 2
  assert rs.finished_runs(str(tmp_path / "nowhere")) == 0
