"""Selective copying (Mamba paper, appendix E): copy the scattered data tokens, in order.

``--config=configs/selective_copying.py:mixer=mamba2,size=small``. Arguments: ``mixer``,
``pattern``, ``size`` (``smoke``: < 1 min on 2 CPU cores; ``small``: T=512; ``paper``: the
paper's T=4096 with 16 data tokens).
"""

from __future__ import annotations

from configs import common

SIZES = {
    "smoke": dict(d_model=64, num_layers=2, num_heads=2, seq_len=64, batch_size=16,
                  num_tokens=4, steps=150, lr=3e-3, warmup_steps=15, eval_every=75,
                  eval_batches=4, log_every=25),
    "small": dict(d_model=64, num_layers=2, num_heads=2, seq_len=512, batch_size=32,
                  num_tokens=16, steps=4000, lr=1e-3, warmup_steps=200, eval_every=500,
                  eval_batches=8, log_every=50),
    "paper": dict(d_model=64, num_layers=2, num_heads=2, seq_len=4096, batch_size=64,
                  num_tokens=16, steps=400000 // 64, lr=1e-3, warmup_steps=500,
                  eval_every=1000, eval_batches=8, log_every=100),
}


def get_config(arg: str | None = None):
  """The config for ``arg`` (``"mixer=mamba2,size=small"``); see the module docstring."""
  args = common.parse_arg(arg, dict(mixer="mamba2", pattern="", size="small"))
  common.check_choice("size", args.size, SIZES)
  s = SIZES[args.size]
  c = common.base_config("selective_copying")
  for k in ("seq_len", "batch_size", "num_tokens"):
    c.data[k] = s[k]
  c.model.mlp_ratio = 2.0
  common.apply_size(c, s)
  common.apply_model_args(c, args)
  return common.finalize(c)
