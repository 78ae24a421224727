"""``experiments/demo.py`` prints its table and writes a file only when asked (issue 29, bug 7:
it rewrote the committed ``results/demo.json`` on every run)."""

from __future__ import annotations

import importlib.util
import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _demo():
  spec = importlib.util.spec_from_file_location("demo", os.path.join(ROOT, "experiments", "demo.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_demo_writes_nothing_unless_asked(tmp_path, monkeypatch, capsys):
  demo = _demo()
  monkeypatch.chdir(tmp_path)
  demo.main(["--batch", "1", "--seq", "8", "--heads", "1", "--dim", "4"])
  assert os.listdir(tmp_path) == []  # before: results/demo.json in the working directory
  assert "all forms agree" in capsys.readouterr().out
  demo.main(["--batch", "1", "--seq", "8", "--heads", "1", "--dim", "4", "--out", "mine"])
  rows = json.loads((tmp_path / "mine" / "demo.json").read_text())
  assert {r["op"] for r in rows} >= {"softmax attention (causal)", "linear attention (favor+)"}
