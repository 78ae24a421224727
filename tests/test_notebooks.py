"""Every study runs at its smoke size, and every notebook executes against the result.

The studies run once per session (all at the same time, each in its own
subprocess) into a temporary folder; each notebook is then executed top to
bottom with nbclient, ``LA_RESULTS_DIR`` pointing at that folder, so a study
whose output format drifts or a broken notebook fails here.

The kernel is ``python3``: jupyter_client starts a spec whose command is
``python`` with the current interpreter (``sys.executable``), and provides the
spec itself when ipykernel is importable, so the venv running pytest is the
one the notebooks run in.

The claims table (``experiments/studies/claims.py``) is checked on the same smoke
results: every study yields claim rows with a valid verdict, read from the
format its script writes today (a study whose JSON drifts from what the claims
read shows up as "older format"), and every notebook shows the table.

To add a study, append a :class:`Study` to ``STUDIES``; the index notebook
must link its notebook, and ``experiments/studies/claims.py`` needs its claims.
Training studies get a fresh ``--runs`` folder too, so that no finished run of
an earlier session is reused.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests import helpers

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("matplotlib")

REPO = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
STUDY_TIMEOUT_S = 600  # all studies at once on 2 cores


claims = helpers.load_experiment("claims")


@dataclasses.dataclass(frozen=True)
class Study:
  name: str  # results subfolder: <LA_RESULTS_DIR>/<name>/
  command: tuple[str, ...]  # run from the repo root with this interpreter; gets --out
  notebook: str  # under notebooks/
  result_file: str  # what the study must write in its subfolder
  trains: bool = False  # takes --runs (its training runs' folder)


STUDIES = [
    Study("cost", ("experiments/studies/study_cost.py", "--smoke"), "cost.ipynb", "cost.json"),
    Study("approximation", ("experiments/studies/study_approximation.py", "--smoke"),
          "approximation.ipynb", "approximation.json"),
    Study("mqar", ("experiments/studies/study_mqar.py", "--smoke"), "mqar.ipynb", "mqar.json", True),
    Study("synthetic", ("experiments/studies/study_synthetic.py", "--smoke"), "synthetic.ipynb",
          "synthetic.json", True),
    Study("lm", ("experiments/studies/study_lm.py", "--smoke"), "lm.ipynb", "lm.json", True),
    Study("listops", ("experiments/studies/study_listops.py", "--smoke"), "listops.ipynb",
          "listops.json", True),
    Study("extrapolation", ("experiments/studies/study_extrapolation.py", "--smoke"),
          "extrapolation.ipynb", "extrapolation.json", True),
    Study("hybrid", ("experiments/studies/study_hybrid.py", "--smoke"), "hybrid.ipynb", "hybrid.json",
          True),
]


def _run_smoke_studies(root: pathlib.Path) -> list[str]:
  """Runs every study's smoke size concurrently into ``root``; returns the failures."""
  procs = {}
  for s in STUDIES:
    log = open(root / f"{s.name}.log", "w")
    runs = ("--runs", str(root / f"{s.name}-runs")) if s.trains else ()
    procs[s.name] = (subprocess.Popen(
        [sys.executable, *s.command, "--out", str(root / s.name), *runs], cwd=REPO,
        stdout=log, stderr=subprocess.STDOUT), log)
  failed = []
  for name, (proc, log) in procs.items():
    try:
      rc = proc.wait(timeout=STUDY_TIMEOUT_S)
    except subprocess.TimeoutExpired:
      proc.kill()
      rc = "timeout"
    log.close()
    if rc != 0:
      failed.append(f"{name}: {rc}\n" + (root / f"{name}.log").read_text()[-2000:])
  return failed


@pytest.fixture(scope="module")
def smoke_results(tmp_path_factory):
  """Runs every study's smoke size concurrently, once per session; returns the results folder.

  Under pytest-xdist every worker that runs a test of this file asks for this fixture; the
  first one runs the studies in the session's shared temporary folder (the parent of the
  workers' own) while holding a lock, the others wait for it and reuse the results (and its
  failures), so the studies run once, not once per worker.
  """
  shared = tmp_path_factory.getbasetemp()
  if os.environ.get("PYTEST_XDIST_WORKER"):
    shared = shared.parent
  root = shared / "notebook-studies"
  with open(shared / "notebook-studies.lock", "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
    status = root / "status.json"
    if not status.exists():
      root.mkdir(exist_ok=True)
      status.write_text(json.dumps({"failed": _run_smoke_studies(root)}))
    failed = json.loads(status.read_text())["failed"]
  assert not failed, "smoke studies failed:\n" + "\n".join(failed)
  return root


def _execute(notebook: str, results, monkeypatch):
  """Executes ``notebooks/<notebook>`` against ``results``; returns the executed notebook."""
  monkeypatch.setenv("LA_RESULTS_DIR", str(results))  # the kernel inherits the environment
  nb = nbformat.read(NOTEBOOKS / notebook, as_version=4)
  client = nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                                   resources={"metadata": {"path": str(NOTEBOOKS)}})
  client.execute()  # raises CellExecutionError on the first failing cell
  return nb


def _outputs(nb, kind):
  return [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
          if o.get("output_type") == kind]


def _claims_tables(nb):
  """The Markdown claims tables the notebook displayed (``claims.to_markdown``)."""
  header = "| " + " | ".join(claims.COLUMNS) + " |"
  tables = ["".join(o["data"]["text/markdown"]) for o in _outputs(nb, "display_data")
            if "text/markdown" in o.get("data", {})]
  return [t for t in tables if t.startswith(header)]


def test_claims_on_smoke_results(smoke_results):
  rows = claims.all_claims(smoke_results)
  for s in STUDIES:
    mine = [r for r in rows if r["study"] == s.name]
    assert mine, f"no claims for {s.name}"
    for r in mine:
      assert tuple(r)[:len(claims.COLUMNS)] == claims.COLUMNS  # then the rule's id and seeds
      assert r["verdict"] in claims.VERDICTS, r
      assert "no results file" not in r["reason"], r
      # The claims read the format the study writes today.
      assert "older format" not in r["reason"], r
      assert r["reason"].startswith("smoke-size results"), r


@pytest.mark.parametrize("study", STUDIES, ids=[s.name for s in STUDIES])
def test_study_notebook_runs_on_smoke_results(study, smoke_results, monkeypatch):
  result = json.loads((smoke_results / study.name / study.result_file).read_text())
  assert result["config"]["smoke"] is True
  nb = _execute(study.notebook, smoke_results, monkeypatch)
  images = [o for o in _outputs(nb, "display_data") if "image/png" in o.get("data", {})]
  assert images, f"{study.notebook} drew no figure"
  text = "".join(o["text"] for o in _outputs(nb, "stream"))
  assert str(smoke_results) in text, "the notebook did not read LA_RESULTS_DIR"
  tables = _claims_tables(nb)
  assert tables, f"{study.notebook} shows no claims table"
  assert f"| {study.name} |" in tables[-1]


def test_index_links_every_notebook_and_runs(smoke_results, monkeypatch):
  index = nbformat.read(NOTEBOOKS / "index.ipynb", as_version=4)
  links = "".join(c.source for c in index.cells if c.cell_type == "markdown")
  on_disk = {p.name for p in NOTEBOOKS.glob("*.ipynb")} - {"index.ipynb"}
  for name in on_disk | {s.notebook for s in STUDIES}:
    assert f"({name})" in links, f"index.ipynb does not link {name}"
  nb = _execute("index.ipynb", smoke_results, monkeypatch)
  lines = "".join(o["text"] for o in _outputs(nb, "stream")).splitlines()
  for s in STUDIES:
    status = [l for l in lines if l.split(" ", 1)[0] == s.name]
    assert status and "smoke" in status[0], f"index.ipynb does not see {s.name}: {status}"
  tables = _claims_tables(nb)
  assert tables, "index.ipynb shows no claims table"
  for s in STUDIES:
    assert f"| {s.name} |" in tables[-1], f"index.ipynb's claims table lacks {s.name}"


def test_real_models_notebook_runs(monkeypatch):
  """``real_models.ipynb`` on the checkpoint it generates (it reads no study results)."""
  monkeypatch.delenv("LA_CHECKPOINT", raising=False)
  nb = nbformat.read(NOTEBOOKS / "real_models.ipynb", as_version=4)
  nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                          resources={"metadata": {"path": str(NOTEBOOKS)}}).execute()
  text = "".join(o["text"] for o in _outputs(nb, "stream"))
  for line in ("qwen3_next: 15,420 parameters, 4 layers",
               "greedy tokens equal to the forward pass's argmax: 100%",
               "layers with a recurrent state: [0, 2]",
               "max |logit difference| after the round trip: 0.0"):
    assert line in text, text[-2000:]
  assert any("image/png" in o.get("data", {}) for o in _outputs(nb, "display_data"))
