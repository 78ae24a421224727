"""Multi-query associative recall (Zoology's MQAR): recall the value bound to each queried key.

``--config=configs/mqar.py:mixer=gla,size=small``. Arguments: ``mixer``, ``pattern``,
``size`` (``smoke``: < 1 min on 2 CPU cores; ``small``: Zoology's 64-wide 2-layer models on
T=256 with 16 pairs; ``large``: T=512, 64 pairs, d_model 256).

``get_sweep()`` compares mixers over learning rates (Zoology sweeps the learning rate per
model, since the best one differs between architectures).
"""

from __future__ import annotations

from configs import common
from linear_attention.nn import registry
from linear_attention import sweep

SIZES = {
    "smoke": dict(d_model=64, num_layers=2, num_heads=2, seq_len=64, batch_size=16,
                  num_kv_pairs=4, vocab_size=64, steps=150, lr=3e-3, warmup_steps=15,
                  eval_every=75, eval_batches=4, log_every=25),
    "small": dict(d_model=64, num_layers=2, num_heads=2, seq_len=256, batch_size=64,
                  num_kv_pairs=16, vocab_size=8192, steps=4000, lr=1e-3, warmup_steps=200,
                  eval_every=500, eval_batches=16, log_every=50),
    "large": dict(d_model=256, num_layers=2, num_heads=4, seq_len=512, batch_size=64,
                  num_kv_pairs=64, vocab_size=8192, steps=10000, lr=1e-3, warmup_steps=500,
                  eval_every=1000, eval_batches=16, log_every=100),
}


def get_config(arg: str | None = None):
  """The config for ``arg`` (``"mixer=gla,size=small"``); see the module docstring."""
  args = common.parse_arg(arg, dict(mixer="gla", pattern="", size="small"))
  common.check_choice("size", args.size, SIZES)
  s = SIZES[args.size]
  c = common.base_config("mqar")
  for k in ("seq_len", "batch_size", "num_kv_pairs", "vocab_size"):
    c.data[k] = s[k]
  c.model.mlp_ratio = 2.0
  c.optim.weight_decay = 0.1
  common.apply_size(c, s)
  common.apply_model_args(c, args)
  return common.finalize(c)


def get_sweep(arg: str | None = None) -> list[dict]:
  """Mixers x learning rates (override dicts for ``linear_attention.sweep``)."""
  del arg
  return sweep.product({"model.mixer": list(registry.select(study="mqar"))},
                       {"optim.lr": [1e-3, 3e-3]})
