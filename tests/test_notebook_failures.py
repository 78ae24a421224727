"""A notebook whose execution fails (issue 41 item 5): the cells it did not run lose the
outputs of the last run, and a missing results file is named with the command that writes
it, not as a raw ``FileNotFoundError``. One real kernel run of ``notebooks/lm.ipynb``
against an empty results folder."""

from __future__ import annotations

import json

import pytest

from tests import helpers

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")


def test_missing_results_message_names_the_command(tmp_path):
  claims = helpers.load_experiment("claims")
  msg = claims.missing_results_message(tmp_path / "mqar" / "mqar.json", tmp_path)
  assert "does not exist" in msg and "run_studies.py --only mqar" in msg, msg
  msg = claims.missing_results_message(tmp_path / "hybrid" / "diagnosis.json", tmp_path)
  assert "experiments/probes/hybrid_diagnosis.py --out" in msg, msg
  assert claims.missing_results_message("/elsewhere/x.json", tmp_path) is None


def test_a_failed_notebook_keeps_no_stale_outputs_and_names_the_command(tmp_path, monkeypatch):
  rs = helpers.load_experiment("run_studies")
  nb = nbformat.read(rs.os.path.join(rs.NOTEBOOKS, "lm.ipynb"), as_version=4)
  code = [c for c in nb.cells if c.cell_type == "code"]
  assert sum(bool(c.outputs) for c in code) > 3  # the committed outputs are there to clear
  results = tmp_path / "empty"
  results.mkdir()
  monkeypatch.setenv("LA_RESULTS_DIR", str(results))
  err = rs.execute_notebook("lm", str(results), str(tmp_path / "out"), 120)
  assert err is not None
  ran = nbformat.read(tmp_path / "out" / "lm.ipynb", as_version=4)
  code = [c for c in ran.cells if c.cell_type == "code"]
  failed = max(i for i, c in enumerate(code) if c.execution_count is not None)
  text = json.dumps(code[failed].outputs)
  assert "results missing" in text and "run_studies.py --only lm" in text, text
  assert "Traceback" not in text
  # Before: the later cells still showed the committed full-size tables and plots.
  assert all(not c.outputs and c.execution_count is None for c in code[failed + 1:])
