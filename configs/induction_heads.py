"""Induction heads (Mamba paper, appendix E): after the trigger, predict what followed it before.

``--config=configs/induction_heads.py:mixer=gla,size=small``. Arguments: ``mixer``,
``pattern``, ``size`` (``smoke``: < 1 min on 2 CPU cores; ``small``: T=256, the paper's
training length).
"""

from __future__ import annotations

from configs import common

SIZES = {
    "smoke": dict(d_model=64, num_layers=2, num_heads=2, seq_len=64, batch_size=16,
                  steps=150, lr=3e-3, warmup_steps=15, eval_every=75, eval_batches=4,
                  log_every=25),
    "small": dict(d_model=64, num_layers=2, num_heads=2, seq_len=256, batch_size=8,
                  steps=4000, lr=1e-3, warmup_steps=200, eval_every=500, eval_batches=16,
                  log_every=50),
}


def get_config(arg: str | None = None):
  """The config for ``arg`` (``"mixer=gla,size=small"``); see the module docstring."""
  args = common.parse_arg(arg, dict(mixer="gla", pattern="", size="small"))
  common.check_choice("size", args.size, SIZES)
  s = SIZES[args.size]
  c = common.base_config("induction_heads")
  c.data.seq_len, c.data.batch_size = s["seq_len"], s["batch_size"]
  c.model.mlp_ratio = 2.0
  common.apply_size(c, s)
  common.apply_model_args(c, args)
  return common.finalize(c)
