"""Multi-query associative recall (Zoology's MQAR): recall the value bound to each queried key.

``--config=configs/mqar.py:mixer=gla,size=small``. Arguments: ``mixer``, ``pattern``,
``size`` (``smoke``: < 1 min on 2 CPU cores; ``small``: Zoology's 64-wide 2-layer models on
T=256 with 16 pairs; ``large``: T=512, 64 pairs, d_model 256).

``get_sweep()`` compares mixers over learning rates (Zoology sweeps the learning rate per
model, since the best one differs between architectures); with ``sweep=frontier`` it is the
recall-versus-state grid (the state size varied within each architecture at fixed width, as
in Zoology's and Based's figures; ``FRONTIER``), once per seed of ``seeds`` (``0/1/2``).
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


# The recall-versus-state frontier: per architecture, the option that sets its state size and
# three values (at d_model 64 with 2 heads: GLA key dim 8/16/32 per head, Based's Taylor
# features 4/8/16, Mamba's SSM state 4/16/64, a sliding window of 32/64/128 tokens).
FRONTIER = {"gla": ("expand_k", (0.25, 0.5, 1.0)), "based": ("feature_dim", (4, 8, 16)),
            "mamba": ("d_state", (4, 16, 64)), "local": ("window", (32, 64, 128))}
ARGS = dict(mixer="gla", pattern="", size="small", sweep="mixers", seeds="0")


def get_config(arg: str | None = None):
  """The config for ``arg`` (``"mixer=gla,size=small"``); see the module docstring."""
  args = common.parse_arg(arg, ARGS)
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
  """Mixers x learning rates, or with ``sweep=frontier`` the ``FRONTIER`` grid, times the
  ``seeds`` (``"0/1/2"``; seed 0 sets no override) (override dicts for
  ``linear_attention.sweep``).

  Raises:
    ValueError: an unknown ``sweep`` or a malformed ``seeds``.
  """
  args = common.parse_arg(arg, ARGS)
  common.check_choice("sweep", args.sweep, ("mixers", "frontier"))
  try:
    seeds = [int(x) for x in str(args.seeds).split("/")]
  except ValueError:
    raise ValueError(f"seeds must be ints joined by '/', got {args.seeds!r}.") from None
  seed_axis = [{"train.seed": x} if x else {} for x in seeds]
  if args.sweep == "frontier":
    points = [{"model.mixer": m, f"model.mixer_kwargs.{m}.{key}": v}
              for m, (key, values) in FRONTIER.items() for v in values]
  else:
    points = sweep.product({"model.mixer": list(registry.select(study="mqar"))},
                           {"optim.lr": [1e-3, 3e-3]})
  return sweep.product(seed_axis, points)
