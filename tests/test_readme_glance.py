"""The README's "Results at a glance" block is the one claims.json gives (no hand-kept numbers)."""

from __future__ import annotations

import json
import pathlib

from tests import helpers

REPO = pathlib.Path(__file__).resolve().parents[1]
claims = helpers.load_experiment("claims")


def test_readme_glance_matches_claims_json():
  text = (REPO / "README.md").read_text()
  block = text.split(claims.GLANCE_START, 1)[1].split(claims.GLANCE_END, 1)[0].strip()
  rows = json.loads((REPO / "results" / "studies" / "claims.json").read_text())["claims"]
  assert block == claims.glance_markdown(rows), (
      "README.md's results at a glance differ from results/studies/claims.json: run "
      "python experiments/studies/claims.py --results results/studies --readme README.md")


def test_write_glance_rewrites_only_the_block(tmp_path):
  readme = tmp_path / "README.md"
  readme.write_text(f"intro\n{claims.GLANCE_START}\nold\n{claims.GLANCE_END}\nafter\n")
  rows = [{"id": "C1", "study": "mqar", "claim": "a | b", "verdict": claims.INCONCLUSIVE,
           "seeds": 1, "required_seeds": 3}]
  assert claims.write_glance(str(readme), rows)
  text = readme.read_text()
  assert text.startswith("intro\n") and text.endswith(f"{claims.GLANCE_END}\nafter\n")
  assert "| C1 | mqar | a \\| b | inconclusive | 1 (3) |" in text
  assert "1 claims: 0 reproduced, 0 reproduced in shape, 0 not reproduced, 1 inconclusive" in text
  assert not claims.write_glance(str(readme), rows)  # unchanged the second time
  (tmp_path / "bare.md").write_text("no markers")
  try:
    claims.write_glance(str(tmp_path / "bare.md"), rows)
  except ValueError as e:
    assert "glance:start" in str(e)
  else:
    raise AssertionError("no ValueError for a README without markers")
