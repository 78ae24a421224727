"""``experiments/studies/study_selective_copying.py``: its smoke size runs and writes the JSON the
synthetic study's long-spread claim reads, and ``run_studies.py`` runs it like the others."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from tests import helpers

claims = helpers.load_experiment("claims")
rs = helpers.load_experiment("run_studies")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _long_spread(rows):
  found = [r for r in rows if "long spread" in r["claim"]]
  assert len(found) <= 1, found
  return found[0] if found else None


def test_smoke_writes_the_json_the_claim_reads(tmp_path):
  results = tmp_path / "studies"
  # One worker: the two smoke runs one after the other (CI shares 2 cores).
  proc = subprocess.run(
      [sys.executable, "experiments/studies/study_selective_copying.py", "--smoke", "--workers", "1",
       "--out", str(results / "selective_copying"), "--runs", str(tmp_path / "runs")],
      cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
  out = json.loads((results / "selective_copying" / "selective_copying.json").read_text())
  assert out["study"] == "selective_copying" and out["config"]["smoke"] is True
  assert [r["mixer"] for r in out["runs"]] == ["mamba", "s4d"]
  for r in out["runs"]:
    assert r["status"] == "done" and r["step"] == out["config"]["steps"]
    assert r["test_tokens"] == 8 * 1 * 2  # test batch x batches x data tokens
    assert 0.0 <= r["test_accuracy"] <= 1.0 and r["validation_curve"]
    assert not os.path.isabs(r["workdir"])
  assert (results / "selective_copying" / "selective_copying.csv").exists()

  # The claim sits in the synthetic study's table and reads the file from its own folder.
  (results / "synthetic").mkdir()
  shutil.copy(os.path.join(ROOT, "results", "studies", "synthetic", "synthetic.json"),
              results / "synthetic")
  syn = claims.load(str(results), "synthetic")
  assert syn["selective_copying_probe"] == out
  assert _long_spread(claims.synthetic_claims(syn)) is None  # smoke size: no row
  syn["selective_copying_probe"]["config"]["smoke"] = False
  row = _long_spread(claims.synthetic_claims(syn))
  assert row["study"] == "synthetic" and "T=32, 2 data tokens" in row["claim"]
  assert row["ours"].startswith("mamba ") and "; s4d " in row["ours"]
  assert "mamba 10 steps = 80 sequences = 2,560 tokens" in row["reason"]


def test_committed_result_gives_the_long_spread_claim():
  syn = claims.load(os.path.join(ROOT, "results", "studies"), "synthetic")
  row = _long_spread(claims.synthetic_claims(syn))
  assert "T=128, 4 data tokens" in row["claim"]
  assert row["ours"] == ("mamba 0.987 ± 0.002 (n=2,048 tokens); "
                         "s4d 0.823 ± 0.008 (n=2,048 tokens)")
  assert row["verdict"] == claims.IN_SHAPE


def test_run_studies_runs_it_with_the_shared_flags():
  assert "selective_copying" in rs.STUDIES and rs.collects("selective_copying")
  cmd = rs.study_command("selective_copying", "/r", smoke=True, collect=True)
  assert cmd[1:] == ["experiments/studies/study_selective_copying.py", "--smoke", "--collect", "--out",
                     os.path.join("/r", "selective_copying")]
  assert rs.study_runs("selective_copying", smoke=False).endswith(
      os.path.join("runs", "studies", "selective_copying"))
