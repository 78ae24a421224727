"""ListOps (Long Range Arena): classify the value (0-9) of a nested MIN/MAX/MED/SUM_MOD expression.

``--config=configs/listops.py:mixer=gla,size=small``. Arguments: ``mixer``, ``pattern``,
``pooling`` (``mean``, ``last``, ``cls``), ``size`` (``smoke``: < 1 min on 2 CPU cores;
``small``: expressions up to 512 tokens; ``lra``: LRA's 500-2000 tokens, depth 10).
"""

from __future__ import annotations

from configs import common

SIZES = {
    "smoke": dict(d_model=64, num_layers=2, num_heads=2, seq_len=128, batch_size=16,
                  max_depth=4, max_args=5, min_length=16, max_length=128, steps=100, lr=3e-3,
                  warmup_steps=10, eval_every=50, eval_batches=4, log_every=25),
    "small": dict(d_model=128, num_layers=4, num_heads=4, seq_len=512, batch_size=32,
                  max_depth=10, max_args=10, min_length=100, max_length=512, steps=5000,
                  lr=1e-3, warmup_steps=500, eval_every=500, eval_batches=16, log_every=50),
    "lra": dict(d_model=128, num_layers=4, num_heads=4, seq_len=2000, batch_size=32,
                max_depth=10, max_args=10, min_length=500, max_length=2000, steps=5000,
                lr=1e-3, warmup_steps=1000, eval_every=500, eval_batches=32, log_every=50),
}


def get_config(arg: str | None = None):
  """The config for ``arg`` (``"mixer=gla,size=small"``); see the module docstring."""
  args = common.parse_arg(arg, dict(mixer="gla", pattern="", size="small", pooling="mean"))
  common.check_choice("size", args.size, SIZES)
  s = SIZES[args.size]
  c = common.base_config("listops")
  for k in ("seq_len", "batch_size", "max_depth", "max_args", "min_length", "max_length"):
    c.data[k] = s[k]
  c.model.pooling = args.pooling
  common.apply_size(c, s)
  common.apply_model_args(c, args)
  return common.finalize(c)
