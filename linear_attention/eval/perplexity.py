r"""Perplexity of a language model on a text file.

Command line::

    python -m linear_attention.eval.perplexity CKPT_DIR FILE.txt [--seq_len N] [--stride S]
        [--tokenizer PATH] [--dtype float32] [--out result.json]

``CKPT_DIR`` is a transformers checkpoint directory (``linear_attention.hub``); the text is
tokenized with its ``tokenizer.json`` (or ``--tokenizer``). Prints one line (tokens scored,
mean NLL in nats, perplexity, bits per byte) and with ``--out`` writes them as JSON.

Windows: the token stream is read in windows of ``seq_len`` predictions (``seq_len + 1``
tokens, as the trainer's) starting every ``stride`` tokens (transformers' sliding-window
recipe); each window scores only the tokens no earlier window scored, so every token but the
first is scored once, with at least ``seq_len - stride`` tokens of context after the first
window (all before it when ``seq_len`` covers the text, the default). Bits per byte is the
total NLL in bits over the UTF-8 bytes of the text.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys

import numpy as np


def _window_nll_fn():
  import jax
  import jax.numpy as jnp
  from flax import nnx

  @nnx.jit
  def nll(model, tokens):
    logits = model(tokens).astype(jnp.float32)  # [1, T, V]
    lse = jax.nn.logsumexp(logits[:, :-1], axis=-1)
    picked = jnp.take_along_axis(logits[:, :-1], tokens[:, 1:, None], axis=-1)[..., 0]
    return (lse - picked)[0]  # [T - 1]: the NLL of token t + 1 given tokens 0..t
  return nll


def token_nlls(model, ids, *, seq_len: int | None = None, stride: int | None = None) -> np.ndarray:
  """The NLL (nats) of every token after the first, ``[n - 1]`` float64, windowed as the
  module docstring says.

  Args:
    model: a language model, ``model(tokens [1, T]) -> logits [1, T, V]`` (causal).
    ids: int token ids ``[n]``, ``n >= 2``.
    seq_len: predictions per window (default: ``n - 1``, one window).
    stride: tokens between window starts (default: ``seq_len``), ``1 <= stride <= seq_len``.

  Raises:
    ValueError: fewer than 2 tokens, or a bad ``seq_len`` / ``stride`` (expected and got).

  Example:
    >>> from linear_attention import hub
    >>> model = hub.from_pretrained("tests/hub/fixtures/mamba")
    >>> token_nlls(model, np.arange(10) % 64, seq_len=8, stride=4).shape
    (9,)
  """
  import jax.numpy as jnp

  ids = np.asarray(ids).reshape(-1).astype(np.int32)
  n = len(ids)
  if n < 2:
    raise ValueError(f"ids must hold at least 2 tokens (the first is only context), got {n}.")
  seq_len = n - 1 if seq_len is None else int(seq_len)
  if seq_len < 1:
    raise ValueError(f"seq_len must be >= 1, got {seq_len}.")
  stride = seq_len if stride is None else int(stride)
  if not 1 <= stride <= seq_len:
    raise ValueError(f"stride must be in 1..seq_len ({seq_len}), got {stride}.")
  width = min(seq_len + 1, n)
  nll_fn = _window_nll_fn()
  out = np.zeros(n - 1, np.float64)
  scored_to = 1  # tokens [1, scored_to) are scored
  for begin in range(0, n - 1, stride):
    end = min(begin + seq_len + 1, n)  # the window's tokens; it predicts begin + 1 .. end - 1
    # Right padding to one window shape (one compile): a causal model's earlier logits
    # do not see it.
    window = np.zeros(width, np.int32)
    window[:end - begin] = ids[begin:end]
    nll = np.asarray(nll_fn(model, jnp.asarray(window)[None]), np.float64)
    first = max(scored_to, begin + 1)
    out[first - 1:end - 1] = nll[first - begin - 1:end - begin - 1]
    scored_to = end
    if end == n:
      break
  return out


def perplexity(model, ids, *, seq_len: int | None = None, stride: int | None = None,
               num_bytes: int | None = None) -> dict:
  """Scores ``ids`` with ``model`` (see :func:`token_nlls`).

  Returns:
    ``{"tokens": scored tokens (n - 1), "mean_nll": nats per token, "perplexity":
    exp(mean_nll), "seq_len", "stride"}`` and, given ``num_bytes`` (the text's UTF-8 bytes),
    ``"bits_per_byte"``: the total NLL in bits over them.

  Example:
    >>> from linear_attention import hub
    >>> model = hub.from_pretrained("tests/hub/fixtures/mamba")
    >>> round(perplexity(model, np.arange(10) % 64)["tokens"])
    9
  """
  nll = token_nlls(model, ids, seq_len=seq_len, stride=stride)
  seq_len = len(nll) if seq_len is None else int(seq_len)
  res = {"tokens": len(nll), "mean_nll": float(nll.mean()),
         "perplexity": float(math.exp(nll.mean())), "seq_len": seq_len,
         "stride": seq_len if stride is None else int(stride)}
  if num_bytes:
    res["bits_per_byte"] = float(nll.sum() / math.log(2) / num_bytes)
  return res


def evaluate_file(checkpoint: str, text_file: str, *, seq_len: int | None = None,
                  stride: int | None = None, tokenizer: str | None = None,
                  dtype: str | None = None) -> dict:
  """:func:`perplexity` of the transformers checkpoint directory ``checkpoint`` on the UTF-8
  text file ``text_file``, tokenized with ``tokenizer`` (default: the checkpoint's
  ``tokenizer.json``); the result also names the checkpoint and the file.

  Raises:
    ValueError: a missing file, no tokenizer, a text of fewer than 2 tokens, a token id
      outside the model's vocabulary, or a checkpoint ``linear_attention.hub`` cannot load.
  """
  from linear_attention import hub
  from linear_attention.data.tokenizer import find_tokenizer, load_tokenizer

  if not os.path.isfile(text_file):
    raise ValueError(f"text file {text_file!r} does not exist.")
  tok_path = tokenizer or find_tokenizer(os.path.expanduser(checkpoint))
  if not tok_path:
    raise ValueError(f"{checkpoint!r} has no tokenizer.json: copy the checkpoint's "
                     "tokenizer.json there or pass --tokenizer PATH.")
  tok = load_tokenizer(tok_path)
  with open(text_file, "rb") as f:
    raw = f.read()
  ids = tok.encode(raw.decode("utf-8", errors="replace"))
  model = hub.from_pretrained(checkpoint, dtype=dtype)
  if ids.size and int(ids.max()) >= model.vocab_size:
    raise ValueError(f"the tokenizer {tok_path!r} gives id {int(ids.max())}, outside the "
                     f"model's vocabulary of {model.vocab_size}: not this checkpoint's tokenizer.")
  res = perplexity(model, ids, seq_len=seq_len, stride=stride, num_bytes=len(raw))
  return {"checkpoint": str(checkpoint), "text_file": str(text_file), **res}


def main(argv=None) -> int:
  """The command line (module docstring); returns the exit status (2: bad input)."""
  p = argparse.ArgumentParser(prog="python -m linear_attention.eval.perplexity",
                              description="Perplexity of a transformers checkpoint on a text file.")
  p.add_argument("checkpoint", help="transformers checkpoint directory (config.json, safetensors)")
  p.add_argument("text_file", help="UTF-8 text file")
  p.add_argument("--seq_len", type=int, default=None, help="predictions per window (default: the whole text)")
  p.add_argument("--stride", type=int, default=None, help="tokens between windows (default: seq_len)")
  p.add_argument("--tokenizer", default=None, help="tokenizer.json (default: the checkpoint's)")
  p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the checkpoint's)")
  p.add_argument("--out", default=None, help="also write the result as JSON here")
  args = p.parse_args(argv)
  try:
    res = evaluate_file(args.checkpoint, args.text_file, seq_len=args.seq_len,
                        stride=args.stride, tokenizer=args.tokenizer, dtype=args.dtype)
  except (ValueError, ModuleNotFoundError) as e:
    print(f"error: {str(e).strip().splitlines()[0]}", file=sys.stderr)
    return 2
  print(f"{res['tokens']} tokens  mean NLL {res['mean_nll']:.4f} nats  perplexity "
        f"{res['perplexity']:.3f}  bits/byte {res['bits_per_byte']:.4f}", flush=True)
  if args.out:
    with open(args.out, "w") as f:
      json.dump(res, f, indent=2)
  return 0


if __name__ == "__main__":
  sys.exit(main())
