"""A tiny word-level ``tokenizer.json`` trained here (no network) for the fine-tuning,
sampling and perplexity tests on the fixtures, whose vocabulary is 64."""

from __future__ import annotations

import pathlib
import shutil

FIXTURES = pathlib.Path(__file__).parent / "fixtures"
# 63 words and [UNK]: the fixtures' 64 ids, so that every id a fixture model writes decodes.
WORDS = ("the cat sat on mat . dog ran to and bird sang a fox saw ; in house tree by river "
         "old man sea big small red blue green sun moon star day night rain wind snow fish "
         "boat road hill town king queen horse song bread milk salt stone fire water gold "
         "silver door wall bell lamp book ink pen cup oak").split()
TEXT = "".join(
    " ".join(WORDS[(5 * i + 11 * j + j * j) % len(WORDS)] for j in range(12)) + "\n"
    for i in range(120))


def train_tokenizer(path, text: str = TEXT, vocab_size: int = 64) -> str:
  """Writes a word-level ``tokenizer.json`` of at most ``vocab_size`` ids trained on ``text``
  to ``path`` (a file); returns it."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
  tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.decoder = decoders.WordPiece()  # joins the words with spaces
  tok.train_from_iterator([text], trainers.WordLevelTrainer(vocab_size=vocab_size,
                                                            special_tokens=["[UNK]"]))
  tok.save(str(path))
  return str(path)


def checkpoint_with_tokenizer(tmp_path, family: str = "mamba") -> pathlib.Path:
  """A copy of ``tests/hub/fixtures/<family>`` with a tiny ``tokenizer.json`` and ``text.txt``
  (the text it was trained on) beside it."""
  d = pathlib.Path(tmp_path) / f"{family}_tok"
  shutil.copytree(FIXTURES / family, d)
  (d / "expected.npz").unlink()
  train_tokenizer(d / "tokenizer.json")
  (pathlib.Path(tmp_path) / "text.txt").write_text(TEXT)
  return d
