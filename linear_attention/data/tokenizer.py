"""A checkpoint's own tokenizer: ``tokenizer.json`` read through the ``tokenizers`` package.

Transformers checkpoints ship their tokenizer as ``tokenizer.json`` (the ``tokenizers``
library's format) next to ``config.json``; :func:`load_tokenizer` reads it, from the file or
from the checkpoint directory, with no network. ``tokenizers`` is imported only here and only
when a tokenizer is used (``pip install tokenizers``; transformers installs it too).

Example::

    tok = load_tokenizer("ckpt/mamba-130m")          # the directory or its tokenizer.json
    ids = tok.encode("In the beginning")              # int32 [n]
    text = tok.decode(ids)
"""

from __future__ import annotations

import os

import numpy as np

TOKENIZER_FILE = "tokenizer.json"


def find_tokenizer(directory: str) -> str | None:
  """``<directory>/tokenizer.json`` when it exists, else None."""
  path = os.path.join(os.fspath(directory), TOKENIZER_FILE)
  return path if os.path.isfile(path) else None


class Tokenizer:
  """Text to token ids and back with a ``tokenizers.Tokenizer``.

  Attributes:
    path: the ``tokenizer.json`` it was read from.
    vocab_size: one more than the largest id it produces (added tokens included).
  """

  def __init__(self, path: str, tokenizer):
    self.path, self._tok = path, tokenizer
    self.vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))

  def encode(self, text: str) -> np.ndarray:
    """``text`` as token ids, int32 ``[n]``, without the special tokens a template adds."""
    return np.asarray(self._tok.encode(text, add_special_tokens=False).ids, np.int32)

  def decode(self, ids) -> str:
    """Token ids (any int sequence) as text."""
    return self._tok.decode([int(i) for i in np.asarray(ids).reshape(-1)],
                            skip_special_tokens=False)


def load_tokenizer(path: str) -> Tokenizer:
  """Reads a ``tokenizer.json`` (or the one in the checkpoint directory ``path``).

  Raises:
    ValueError: no such file, or one ``tokenizers`` cannot read (naming the path).
    ModuleNotFoundError: the ``tokenizers`` package is not installed (saying how to add it).
  """
  path = os.path.expanduser(os.fspath(path))
  if os.path.isdir(path):
    found = find_tokenizer(path)
    if found is None:
      raise ValueError(f"tokenizer: {path!r} has no {TOKENIZER_FILE}; copy the checkpoint's "
                       f"{TOKENIZER_FILE} there or name the file itself.")
    path = found
  if not os.path.isfile(path):
    raise ValueError(f"tokenizer: no such file {path!r} (expected a {TOKENIZER_FILE}).")
  try:
    import tokenizers
  except ModuleNotFoundError:
    raise ModuleNotFoundError("reading a tokenizer.json needs the 'tokenizers' package: "
                              "pip install tokenizers", name="tokenizers") from None
  try:
    tok = tokenizers.Tokenizer.from_file(path)
  except Exception as e:  # noqa: BLE001 -- the library raises a bare Exception on bad JSON
    raise ValueError(f"tokenizer: {path!r} is not a tokenizer.json the 'tokenizers' package "
                     f"reads ({str(e).splitlines()[0] if str(e) else type(e).__name__}).") from None
  return Tokenizer(path, tok)
