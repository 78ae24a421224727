"""``linear_attention.eval.perplexity`` against a hand computation: every token's NLL from
the model's logits of the window that scores it, computed here in NumPy float64 (one model
call per window, on the unpadded window), on the Mamba fixture with a word-level tokenizer
trained in the test."""

from __future__ import annotations

import doctest
import json
import math

import numpy as np
import pytest

from linear_attention import hub
from linear_attention.data.tokenizer import load_tokenizer
from linear_attention.eval import perplexity as ppl
from tests.hub.tiny_tokenizer import FIXTURES, checkpoint_with_tokenizer

pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def model():
  return hub.from_pretrained(FIXTURES / "mamba")


def hand_nlls(model, ids, seq_len, stride):
  """Token t (t >= 1) is scored by the first window of tokens [b, b + seq_len + 1) holding
  it after the last token the previous window scored: NLL = logsumexp(logits) -
  logits[target], from the logits at t - 1."""
  n, out, scored_to = len(ids), {}, 1
  for b in range(0, n - 1, stride):
    e = min(b + seq_len + 1, n)
    lg = np.asarray(model(np.asarray(ids[b:e])[None]), np.float64)[0]
    for t in range(max(scored_to, b + 1), e):
      row = lg[t - b - 1]
      out[t] = math.log(np.exp(row - row.max()).sum()) + row.max() - row[ids[t]]
    scored_to = e
    if e == n:
      break
  return np.array([out[t] for t in range(1, n)])


@pytest.mark.parametrize("seq_len,stride", [(None, None), (12, 12), (12, 5), (39, 39)])
def test_token_nlls_match_a_hand_computation(model, seq_len, stride):
  ids = np.random.default_rng(0).integers(0, 64, 41)
  got = ppl.token_nlls(model, ids, seq_len=seq_len, stride=stride)
  want = hand_nlls(model, ids, seq_len or len(ids) - 1, stride or seq_len or len(ids) - 1)
  assert got.shape == (40,)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  res = ppl.perplexity(model, ids, seq_len=seq_len, stride=stride, num_bytes=100)
  assert res["tokens"] == 40 and res["mean_nll"] == pytest.approx(want.mean(), rel=1e-6)
  assert res["perplexity"] == pytest.approx(math.exp(want.mean()), rel=1e-6)
  assert res["bits_per_byte"] == pytest.approx(want.sum() / math.log(2) / 100, rel=1e-6)


def test_bad_arguments_name_themselves(model):
  with pytest.raises(ValueError, match="stride must be in 1..seq_len \\(8\\), got 9"):
    ppl.token_nlls(model, np.arange(20), seq_len=8, stride=9)
  with pytest.raises(ValueError, match="seq_len must be >= 1, got 0"):
    ppl.token_nlls(model, np.arange(20), seq_len=0)
  with pytest.raises(ValueError, match="at least 2 tokens.*got 1"):
    ppl.token_nlls(model, [3])


def test_command_line_on_a_text_file(tmp_path, capsys):
  ckpt = checkpoint_with_tokenizer(tmp_path)
  text = tmp_path / "text.txt"
  out = tmp_path / "ppl.json"
  assert ppl.main([str(ckpt), str(text), "--seq_len", "512", "--stride", "256",
                   "--out", str(out)]) == 0
  line = capsys.readouterr().out
  res = json.loads(out.read_text())
  ids = load_tokenizer(str(ckpt)).encode(text.read_text())
  want = hand_nlls(hub.from_pretrained(ckpt), ids, 512, 256)
  assert res["tokens"] == len(ids) - 1 and res["mean_nll"] == pytest.approx(want.mean(), rel=1e-5)
  assert res["bits_per_byte"] == pytest.approx(
      want.sum() / math.log(2) / len(text.read_bytes()), rel=1e-5)
  assert f"{res['tokens']} tokens" in line and "perplexity" in line
  # No tokenizer: one error line, exit 2.
  (ckpt / "tokenizer.json").unlink()
  assert ppl.main([str(ckpt), str(text)]) == 2
  assert "has no tokenizer.json" in capsys.readouterr().err


def test_docstring_examples_run(monkeypatch):
  monkeypatch.chdir(FIXTURES.parents[2])  # the examples name the fixture from the repo root
  assert doctest.testmod(ppl).failed == 0


def test_help_imports_no_jax():
  import os
  import subprocess
  import sys
  root = FIXTURES.parents[2]
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["PYTHONPATH"] = str(root)
  p = subprocess.run([sys.executable, "-X", "importtime", "-m", "linear_attention.eval.perplexity",
                      "--help"], cwd=root, env=env, capture_output=True, text=True, timeout=120)
  assert p.returncode == 0 and "--seq_len" in p.stdout and "--stride" in p.stdout
  imported = {ln.rpartition("|")[2].strip().split(".")[0] for ln in p.stderr.splitlines()
              if ln.startswith("import time:")}
  assert "jax" not in imported
