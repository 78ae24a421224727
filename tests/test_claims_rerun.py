"""Rerunning ``experiments/studies/claims.py`` on unchanged results leaves its JSON as it was (issue
29, bug 7: a plain rerun rewrote the committed ``results/studies/claims.json``, changing
only its date)."""

from __future__ import annotations

import json
import os
import shutil

from tests import helpers

claims = helpers.load_experiment("claims")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_rerun_on_unchanged_results_keeps_the_file(tmp_path, capsys):
  results = tmp_path / "studies"
  shutil.copytree(os.path.join(ROOT, "results", "studies"), results)
  out = results / "claims.json"
  claims.main(["--results", str(results)])
  doc = json.loads(out.read_text())
  doc["generated_utc"] = "2000-01-01T00:00:00+00:00"  # as if committed long ago
  out.write_text(json.dumps(doc))
  claims.main(["--results", str(results)])
  assert json.loads(out.read_text())["generated_utc"] == "2000-01-01T00:00:00+00:00"
  assert f"{out} unchanged" in capsys.readouterr().out
  doc["claims"] = doc["claims"][1:]  # a changed table is written, with today's date
  out.write_text(json.dumps(doc))
  claims.main(["--results", str(results)])
  rewritten = json.loads(out.read_text())
  assert rewritten["generated_utc"] != "2000-01-01T00:00:00+00:00"
  assert len(rewritten["claims"]) == len(doc["claims"]) + 1
