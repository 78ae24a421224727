"""ListOps (Nangia & Bowman 2018), as generated for Long Range Arena (Tay et al. 2021).

An expression is a random tree. Each node below ``max_depth`` is an operator
with probability 1/4 (else a digit 0-9); an operator takes a uniform number of
arguments in ``[2, max_args]`` and is one of ``MIN``, ``MAX``, ``MED`` (the
median, truncated to an int) and ``SM`` (sum modulo 10). Nodes at depth
``max_depth`` are digits; the root has depth 1. An expression is kept when its
length in tokens (2 per operator, ``[OP`` and ``]``, and 1 per digit) is
strictly between ``min_length`` and ``max_length``; the label is its value.
This is the distribution of LRA's ``lra_benchmarks/data/listops.py`` (with its
defaults ``max_depth=10, max_args=10, min_length=500, max_length=2000``),
generated on the fly from the (seed, split, step) generator instead of a fixed
file. LRA's brackets ``(``/``)`` only mark the binary tree it builds and are
dropped by its input pipeline, so they are not tokens here.

Tokens: 0 pad, 1-10 the digits 0-9, 11 ``[MIN``, 12 ``[MAX``, 13 ``[MED``,
14 ``[SM``, 15 ``]``. Expressions are left-aligned and padded with 0 up to
``seq_len``; ``mask`` is True on the expression.

Rejection sampling stops building a tree as soon as it reaches
``max_length`` tokens (such a tree would be rejected anyway), which keeps a
batch cheap without changing the distribution of the accepted ones.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from linear_attention.data.base import SyntheticDataset

PAD = 0
DIGIT_OFFSET = 1  # digit d is token d + 1
OPERATORS: tuple[str, ...] = ("[MIN", "[MAX", "[MED", "[SM")
OP_TOKENS: dict[str, int] = {name: 11 + i for i, name in enumerate(OPERATORS)}
END = 15
VOCAB: tuple[str, ...] = ("<pad>",) + tuple(str(d) for d in range(10)) + OPERATORS + ("]",)
VOCAB_SIZE = len(VOCAB)
VALUE_P = 0.25  # LRA: probability that a node above max_depth is an operator


def decode(tokens) -> str:
  """The space-separated expression string of a token row (padding dropped)."""
  return " ".join(VOCAB[int(t)] for t in tokens if int(t) != PAD)


class _TooLong(Exception):
  pass


class _Uniforms:
  """Uniform [0, 1) floats from a numpy generator, drawn in blocks (one Python call each)."""

  def __init__(self, rng: np.random.Generator, block: int = 4096):
    self._rng, self._block = rng, block
    self._buf: list[float] = []
    self._i = 0

  def __call__(self) -> float:
    if self._i == len(self._buf):
      self._buf = self._rng.random(self._block).tolist()
      self._i = 0
    self._i += 1
    return self._buf[self._i - 1]


def _apply(op: int, args: list[int]) -> int:
  if op == 0:
    return min(args)
  if op == 1:
    return max(args)
  if op == 2:  # int(np.median(args)) for non-negative ints
    s = sorted(args)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) // 2
  return sum(args) % 10


def sample_expression(u, max_depth: int, max_args: int, min_length: int,
                      max_length: int, max_tries: int = 1_000_000) -> tuple[list[int], int, int]:
  """Draws trees until one has ``min_length < length < max_length``.

  Args:
    u: a callable returning uniform [0, 1) floats.
    max_tries: give up (``ValueError``) after this many rejected trees.

  Returns: (tokens, value, number of trees drawn).
  """
  tries = 0
  while True:
    tries += 1
    if tries > max_tries:
      raise ValueError(
          f"no ListOps expression with min_length={min_length} < length < max_length={max_length} "
          f"in {max_tries} trees (max_depth={max_depth}, max_args={max_args}); widen the range.")
    out: list[int] = []

    def node(depth: int) -> int:
      if depth < max_depth and u() <= VALUE_P:
        nargs = 2 + int(u() * (max_args - 1))
        at = len(out)
        out.append(PAD)  # the operator is drawn after its arguments, as in LRA
        args = [node(depth + 1) for _ in range(nargs)]
        op = int(u() * 4)
        out[at] = 11 + op
        out.append(END)
        if len(out) >= max_length:
          raise _TooLong
        return _apply(op, args)
      value = int(u() * 10)
      out.append(DIGIT_OFFSET + value)
      if len(out) >= max_length:
        raise _TooLong
      return value

    try:
      value = node(1)
    except _TooLong:
      continue
    if len(out) > min_length:
      return out, value, tries


class ListOps(SyntheticDataset):
  """ListOps classification: ``label`` (0-9) is the value of the expression in ``inputs``."""

  kind = "classify"
  num_classes = 10

  def __init__(self, config: Mapping[str, Any]):
    super().__init__(config)
    c = self.config
    for name in ("max_depth", "max_args"):
      if c[name] < 2:
        raise ValueError(f"config field {name!r} must be >= 2, got {c[name]}.")
    if c["min_length"] < 0:
      raise ValueError(f"config field 'min_length' must be >= 0, got {c['min_length']}.")
    if c["max_length"] < c["min_length"] + 2:
      raise ValueError(
          f"config field 'max_length' must be >= min_length + 2 = {c['min_length'] + 2} "
          f"(lengths are strictly between them), got {c['max_length']}.")
    if c["max_length"] - 1 > c["seq_len"]:
      raise ValueError(
          f"config field 'seq_len' must be >= max_length - 1 = {c['max_length'] - 1} "
          f"(the longest expression), got {c['seq_len']}.")
    # Trees cannot exceed this many tokens; if that is not above min_length no
    # sample would ever be accepted.
    longest = 1
    for _ in range(c["max_depth"] - 1):
      longest = 2 + c["max_args"] * longest
    if longest <= c["min_length"]:
      raise ValueError(
          f"config field 'min_length' must be below the longest possible expression "
          f"({longest} tokens for max_depth={c['max_depth']}, max_args={c['max_args']}), "
          f"got {c['min_length']}.")
    self.vocab_size = VOCAB_SIZE
    self.max_depth, self.max_args = c["max_depth"], c["max_args"]
    self.min_length, self.max_length = c["min_length"], c["max_length"]

  def _generate(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
    b, t = self.batch_size, self.seq_len
    u = _Uniforms(rng)
    inputs = np.zeros((b, t), np.int32)
    mask = np.zeros((b, t), bool)
    label = np.zeros((b,), np.int32)
    for i in range(b):
      tokens, value, _ = sample_expression(u, self.max_depth, self.max_args, self.min_length,
                                           self.max_length)
      inputs[i, :len(tokens)] = tokens
      mask[i, :len(tokens)] = True
      label[i] = value
    return {"inputs": inputs, "mask": mask, "label": label}
