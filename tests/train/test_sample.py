"""Sampling text from a trained run: ``results.sample_text`` and ``main --sample`` (the
README's recipe). Two training steps of the smoke-size byte-level model: the text is
nonsense, but every byte comes from the restored checkpoint through ``models.generate``."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from linear_attention import train
from linear_attention.train import results

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def text_run(tmp_path_factory):
  from configs import text_lm
  cfg = text_lm.get_config("size=smoke")
  with cfg.unlocked():
    cfg.train.steps, cfg.train.eval_every, cfg.train.eval_batches = 2, 0, 1
  wd = str(tmp_path_factory.mktemp("sample") / "run")
  train.train_and_evaluate(cfg, wd, verbose=False)
  return wd


def test_sample_text_continues_the_prompt(text_run):
  text = results.sample_text(text_run, "In the beginning", 30, seed=1)
  assert text.startswith("In the beginning") and len(text.encode()) >= 30
  assert text == results.sample_text(text_run, "In the beginning", 30, seed=1)  # seeded
  greedy = results.sample_text(text_run, "In", 5, temperature=0.0)
  assert greedy.startswith("In")
  with pytest.raises(ValueError, match="prompt must be non-empty"):
    results.sample_text(text_run, "", 5)


def test_sample_flag_of_the_command_line(text_run, tmp_path):
  cmd = [sys.executable, "-m", "linear_attention.main", f"--workdir={text_run}",
         "--sample=And God said", "--sample_tokens=20"]
  p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert p.returncode == 0, p.stderr[-2000:]
  assert p.stdout.startswith("And God said") and p.stderr.strip() == ""
  # Not a run directory: one line, exit 2.
  p = subprocess.run(cmd[:3] + [f"--workdir={tmp_path}", "--sample=x"], cwd=ROOT,
                     capture_output=True, text=True, timeout=300)
  assert p.returncode == 2 and p.stderr.strip().splitlines() == [
      f"error: no config.json in {str(tmp_path)!r}: not a training run directory."]
