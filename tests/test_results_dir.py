"""The notebooks' results folder (``claims.results_dir``): a relative ``LA_RESULTS_DIR`` is
taken from the repository root, not from ``notebooks/`` where Jupyter runs the kernel."""

from __future__ import annotations

import json
import os
import pathlib

import pytest

from tests import helpers

claims = helpers.load_experiment("claims")
REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"


@pytest.mark.parametrize("value, expected", [
    (None, REPO / "results" / "studies"),
    ("", REPO / "results" / "studies"),
    ("runs/smoke/studies", REPO / "runs" / "smoke" / "studies"),
    ("/elsewhere/studies", pathlib.Path("/elsewhere/studies")),
])
def test_relative_paths_start_at_the_repository_root(value, expected, monkeypatch):
  monkeypatch.chdir(NOTEBOOKS)
  if value is None:
    monkeypatch.delenv("LA_RESULTS_DIR", raising=False)
  else:
    monkeypatch.setenv("LA_RESULTS_DIR", value)
  got = claims.results_dir()
  assert pathlib.Path(os.path.abspath(got)) == expected
  if value and os.path.isabs(value):
    assert str(got) == value  # as given: CI's printed path is the folder it set
  else:
    assert not got.is_absolute()  # a committed notebook's output names no machine's folder
  if not value:
    assert str(got) == os.path.join("..", "results", "studies")


def _setup_source(name: str) -> str:
  """The notebook's setup cell up to where it prints its results folder (some read results
  after that)."""
  nb = json.loads((NOTEBOOKS / name).read_text())
  src = "".join(nb["cells"][1]["source"])
  end = src.index('print("results directory:", RESULTS)\n')
  return src[:end] + 'print("results directory:", RESULTS)\n'



# Notebooks that read no study results: real_models runs a checkpoint ($LA_CHECKPOINT).
NOT_STUDY_NOTEBOOKS = {"real_models.ipynb"}


@pytest.mark.parametrize("name", sorted(p.name for p in NOTEBOOKS.glob("*.ipynb")
                                        if p.name not in NOT_STUDY_NOTEBOOKS))
def test_every_notebook_setup_cell_uses_it(name, monkeypatch, capsys):
  pytest.importorskip("matplotlib")
  pytest.importorskip("IPython")
  monkeypatch.chdir(NOTEBOOKS)  # where Jupyter starts the kernel
  monkeypatch.setenv("LA_RESULTS_DIR", "runs/smoke/studies")
  monkeypatch.setenv("MPLBACKEND", "Agg")
  scope: dict = {}
  exec(compile(_setup_source(name), name, "exec"), scope)  # noqa: S102 (the notebook's own cell)
  assert pathlib.Path(os.path.abspath(scope["RESULTS"])) == REPO / "runs" / "smoke" / "studies"
  assert "results directory: ../runs/smoke/studies" in capsys.readouterr().out
