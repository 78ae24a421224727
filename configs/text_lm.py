"""Byte-level language model on real text (King James Bible, or Python's stdlib source).

``--config=configs/text_lm.py:mixer=gla,size=small`` (defaults). Arguments:
  mixer   a name from ``linear_attention.nn.MIXERS`` (causal ones), default ``gla``;
  pattern hybrid letters (e.g. ``RRA``), overrides ``mixer`` when given;
  corpus  ``kjv`` or ``python_stdlib``;
  size    ``smoke`` (< 1 min on 2 CPU cores), ``small`` (the README quick start: about 4.3
          CPU-minutes of work, 2-4.5 min on an idle 2-core machine, 9-32 min measured on
          a loaded one), ``medium`` (an accelerator).
"""

from __future__ import annotations

from configs import common

SIZES = {
    # d_model, layers, heads, seq_len, batch, steps, lr, warmup, eval_every, eval batches
    "smoke": dict(d_model=64, num_layers=2, num_heads=2, seq_len=128, batch_size=8, steps=60,
                  lr=3e-3, warmup_steps=10, eval_every=30, eval_batches=4, log_every=10),
    "small": dict(d_model=128, num_layers=2, num_heads=4, seq_len=256, batch_size=16, steps=500,
                  lr=3e-3, warmup_steps=50, eval_every=250, eval_batches=16, log_every=25),
    "medium": dict(d_model=512, num_layers=8, num_heads=8, seq_len=1024, batch_size=32,
                   steps=20000, lr=1e-3, warmup_steps=1000, eval_every=1000, eval_batches=0,
                   log_every=100),
}


def get_config(arg: str | None = None):
  """The config for ``arg`` (``"mixer=gla,size=small,corpus=kjv"``); see the module docstring."""
  args = common.parse_arg(arg, dict(mixer="gla", pattern="", size="small", corpus="kjv"))
  common.check_choice("size", args.size, SIZES)
  s = SIZES[args.size]
  c = common.base_config("text")
  c.data.corpus = args.corpus
  c.data.seq_len, c.data.batch_size = s["seq_len"], s["batch_size"]
  c.model.tie_embeddings = True
  common.apply_size(c, s)
  common.apply_model_args(c, args)
  return common.finalize(c)
