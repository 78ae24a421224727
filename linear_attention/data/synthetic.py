"""Synthetic recall tasks: MQAR (Zoology), selective copying and induction heads (Mamba).

All three are kind ``"lm"``: per-position targets with a mask that is 1 only
where the task asks a question. Batches are generated on the fly with numpy,
vectorised over the batch.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from linear_attention.data.base import SyntheticDataset, choose_distinct, lm_batch


def _require(cond: bool, field: str, expected: str, got: Any) -> None:
  if not cond:
    raise ValueError(f"config field {field!r} must be {expected}, got {got!r}.")


class MQAR(SyntheticDataset):
  """Multi-query associative recall (Arora, Eyuboglu et al. 2023, "Zoology").

  Layout of one row of length ``T`` with ``N = num_kv_pairs``:

  * positions ``0 .. 2N-1``: the pairs ``k_1 v_1 k_2 v_2 ... k_N v_N``, keys
    distinct and drawn from the lower half of the vocabulary ``[1, V/2)``,
    values distinct and drawn from the upper half ``[V/2, V)``;
  * after them, every key is asked once: key ``k_i`` sits at position
    ``2N + 2 g_i``, with gaps ``g_i`` distinct in ``[0, (T - 2N) / 2)`` and drawn
    without replacement from ``p(g) ~ (g + 1) ** (power_a - 1)`` (a power law:
    small ``power_a`` puts most queries right after the pairs, ``1.0`` is
    uniform);
  * the target at a query position is its key's value; the mask is 1 exactly
    there (``N`` ones per row);
  * every other position holds a uniform random token of ``[0, V)`` when
    ``random_non_queries`` (Zoology's default), else 0.

  ``mixture`` (e.g. ``"64:4,128:8,256:16"``, Zoology's way of training one model for
  several settings): each row is an example of one ``length:pairs`` setting, drawn
  uniformly, then filler up to ``seq_len`` (random tokens or 0, never scored), which a
  causal model does not see while answering. Empty: every row is ``seq_len:num_kv_pairs``.

  Sampling the gaps without replacement uses the Gumbel-top-k identity, which
  has the same law as drawing them one by one with ``p`` renormalised.
  """

  kind = "lm"

  def __init__(self, config: Mapping[str, Any]):
    super().__init__(config)
    c = self.config
    v, t = c["vocab_size"], c["seq_len"]
    _require(v >= 4, "vocab_size", ">= 4", v)
    _require(c["power_a"] > 0, "power_a", "> 0", c["power_a"])
    self.settings = parse_mixture(c["mixture"]) if c["mixture"] else [(t, c["num_kv_pairs"])]
    for length, n in self.settings:
      field = "mixture" if c["mixture"] else "num_kv_pairs"
      _require(n >= 1, field, "pairs >= 1", n)
      _require(n <= v // 2 - 1, field, f"pairs <= vocab_size // 2 - 1 = {v // 2 - 1} "
               "(keys are distinct tokens of [1, vocab_size // 2))", n)
      _require(length >= 4 * n, "mixture" if c["mixture"] else "seq_len",
               f"a length >= 4 * pairs = {4 * n} (the pairs, then room for a query every "
               "other slot)", length)
      _require(length <= t, "seq_len", f">= every mixture length ({length})", t)
    self.vocab_size = v
    self.num_kv_pairs = c["num_kv_pairs"]
    self.max_targets_per_row = max(n for _, n in self.settings)
    self.power_a = float(c["power_a"])
    self.random_non_queries = bool(c["random_non_queries"])

  def _gap_logp(self, length: int, n: int) -> np.ndarray:
    g = np.arange(1, (length - 2 * n) // 2 + 1, dtype=np.float64)
    p = self.power_a * g ** (self.power_a - 1.0)
    return np.log(p / p.sum())

  def _generate(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
    b, t, v = self.batch_size, self.seq_len, self.vocab_size
    if self.random_non_queries:
      inputs = rng.integers(0, v, size=(b, t), dtype=np.int64)
    else:
      inputs = np.zeros((b, t), np.int64)
    targets = np.zeros((b, t), np.int64)
    mask = np.zeros((b, t), np.float32)
    which = rng.integers(0, len(self.settings), size=b) if len(self.settings) > 1 \
        else np.zeros(b, np.int64)
    for i, (length, n) in enumerate(self.settings):
      rows = np.flatnonzero(which == i)
      if rows.size:
        self._fill(rng, rows, n, self._gap_logp(length, n), inputs, targets, mask)
    return lm_batch(inputs, targets, mask)

  def _fill(self, rng, rows, n, gap_logp, inputs, targets, mask) -> None:
    """Writes the pairs and queries of ``rows`` (an example with ``n`` pairs) in place."""
    b, half = rows.size, self.vocab_size // 2
    keys = choose_distinct(rng, b, 1, half, n)
    values = choose_distinct(rng, b, half, self.vocab_size, n)
    scores = gap_logp[None, :] + rng.gumbel(size=(b, gap_logp.shape[0]))
    gaps = np.argpartition(-scores, n - 1, axis=1)[:, :n]
    qpos = 2 * n + 2 * gaps
    sub = inputs[rows]
    sub[:, 0:2 * n:2] = keys
    sub[:, 1:2 * n:2] = values
    np.put_along_axis(sub, qpos, keys, axis=1)
    inputs[rows] = sub
    for arr, val in ((targets, values), (mask, 1.0)):
      sub = arr[rows]
      np.put_along_axis(sub, qpos, val, axis=1)
      arr[rows] = sub


def parse_mixture(text: str) -> list[tuple[int, int]]:
  """``"64:4,128:8"`` -> ``[(64, 4), (128, 8)]`` (MQAR's ``mixture`` field).

  Raises:
    ValueError: an item that is not ``length:pairs`` with positive ints.
  """
  out = []
  for item in text.split(","):
    parts = item.strip().split(":")
    try:
      length, n = (int(p) for p in parts)
    except ValueError:
      raise ValueError(f"config field 'mixture' must be 'length:pairs,...' with ints, got "
                       f"{text!r}.") from None
    _require(length >= 1 and n >= 1, "mixture", "positive lengths and pairs", text)
    out.append((length, n))
  return out


class SelectiveCopying(SyntheticDataset):
  """Selective copying (Gu & Dao 2023, "Mamba", section 3.1 and appendix E.1).

  Tokens: 0 is the noise (blank) token, ``1 .. V-2`` are data tokens and
  ``V-1`` is the marker that asks for output. A row of length ``T`` with
  ``N = num_tokens`` is: ``N`` random data tokens scattered, in order, at
  random distinct positions of the first ``T - N`` slots (noise elsewhere),
  then ``N`` markers. At the ``i``-th marker the target is the ``i``-th data
  token; the mask is 1 on the ``N`` marker positions only. (The Mamba paper
  uses ``T = 4096``, ``V = 16``, ``N = 16``; this is the S4 repository's
  ``torch_copying_data(..., variable=True)`` layout with ``T = L + 2N``.)
  """

  kind = "lm"

  def __init__(self, config: Mapping[str, Any]):
    super().__init__(config)
    c = self.config
    v, t, n = c["vocab_size"], c["seq_len"], c["num_tokens"]
    _require(v >= 3, "vocab_size", ">= 3 (noise, marker and at least one data token)", v)
    _require(n >= 1, "num_tokens", ">= 1", n)
    _require(t >= 2 * n, "seq_len", f">= 2 * num_tokens = {2 * n}", t)
    self.vocab_size = v
    self.num_tokens = n
    self.max_targets_per_row = n
    self.noise_token = 0
    self.marker_token = v - 1

  def _generate(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
    b, t, v, n = self.batch_size, self.seq_len, self.vocab_size, self.num_tokens
    tokens = rng.integers(1, v - 1, size=(b, n), dtype=np.int64)
    pos = np.sort(choose_distinct(rng, b, 0, t - n, n), axis=1)
    inputs = np.zeros((b, t), np.int64)
    np.put_along_axis(inputs, pos, tokens, axis=1)
    inputs[:, t - n:] = self.marker_token
    targets = np.zeros((b, t), np.int64)
    targets[:, t - n:] = tokens
    mask = np.zeros((b, t), np.float32)
    mask[:, t - n:] = 1.0
    return lm_batch(inputs, targets, mask)


class InductionHeads(SyntheticDataset):
  """Induction heads (Olsson et al. 2022; the Mamba paper's appendix E.1 setting).

  Tokens ``0 .. V-2`` are ordinary and ``V-1`` is the trigger. A row of length
  ``T`` is uniform random ordinary tokens, except that the trigger sits at one
  random position ``p`` in ``[0, T-3]`` followed by a random ordinary target
  token at ``p + 1``, and the trigger appears again at the last position
  ``T - 1``. The only target is there: the token that followed the first
  trigger (mask 1 at ``T - 1`` only). The trigger occurs exactly twice.
  (The Mamba paper trains at ``T = 256`` with ``V = 16``.)

  ``dense=True`` is a training variant with many scored tokens per row (the
  one-trigger task gives one label per sequence, too sparse for a small
  budget): a span of ``m`` random ordinary tokens, ``m`` uniform in
  ``[T/16, T/4]``, starts at a uniform position ``a`` and is repeated at a
  uniform ``b >= a + m``; the trigger sits at one random place inside the span
  (so it is met again in the repeat, as in the test task). Every token of the
  repeat but its last is scored on the next token, which equals the token
  after its first occurrence. ``a``, ``b`` and ``m`` vary per row, so no
  fixed position or offset predicts the answers: only looking back at what
  followed the current token does.
  """

  kind = "lm"

  def __init__(self, config: Mapping[str, Any]):
    super().__init__(config)
    c = self.config
    v, t = c["vocab_size"], c["seq_len"]
    _require(v >= 3, "vocab_size", ">= 3 (a trigger and at least two ordinary tokens)", v)
    _require(t >= 3, "seq_len", ">= 3 (trigger, target, trigger)", t)
    self.vocab_size = v
    self.trigger_token = v - 1
    self.dense = bool(c.get("dense", False))
    self.span = (max(2, t // 16), max(2, t // 4))
    if self.dense:
      _require(t >= 8, "seq_len", ">= 8 with dense=True (a span of 2 and its repeat)", t)
    self.max_targets_per_row = self.span[1] - 1 if self.dense else 1

  def _generate(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
    if self.dense:
      return self._generate_dense(rng)
    b, t, v = self.batch_size, self.seq_len, self.vocab_size
    inputs = rng.integers(0, v - 1, size=(b, t), dtype=np.int64)
    p = rng.integers(0, t - 2, size=(b, 1))
    answer = rng.integers(0, v - 1, size=(b, 1), dtype=np.int64)
    np.put_along_axis(inputs, p, self.trigger_token, axis=1)
    np.put_along_axis(inputs, p + 1, answer, axis=1)
    inputs[:, t - 1] = self.trigger_token
    targets = np.zeros((b, t), np.int64)
    targets[:, t - 1] = answer[:, 0]
    mask = np.zeros((b, t), np.float32)
    mask[:, t - 1] = 1.0
    return lm_batch(inputs, targets, mask)

  def _generate_dense(self, rng: np.random.Generator) -> dict[str, np.ndarray]:
    b, t, v = self.batch_size, self.seq_len, self.vocab_size
    inputs = rng.integers(0, v - 1, size=(b, t), dtype=np.int64)
    targets = np.zeros((b, t), np.int64)
    mask = np.zeros((b, t), np.float32)
    for r in range(b):  # a handful of rows; the per-row draws read more clearly than masks
      m = int(rng.integers(self.span[0], self.span[1] + 1))
      first = int(rng.integers(0, t - 2 * m + 1))
      second = int(rng.integers(first + m, t - m + 1))
      inputs[r, first + int(rng.integers(0, m - 1))] = self.trigger_token
      inputs[r, second:second + m] = inputs[r, first:first + m]
      targets[r, second:second + m - 1] = inputs[r, second + 1:second + m]
      mask[r, second:second + m - 1] = 1.0
    return lm_batch(inputs, targets, mask)
