"""Why Mamba-2 stays at chance on induction heads while Mamba learns it: one short run per
hypothesis, each changing one thing of Mamba-2 towards Mamba-1 (issue 30, item 3).

The synthetic study (``study_synthetic.py``) trains every mixer on the dense induction task
at T=256 (d 64, 2 layers, the short-conv recipe, lr 3e-3, batch 16) and tests on the paper's
sparse one-trigger task. There Mamba reached 0.994 on the sparse test after 800 steps and
Mamba-2 0.066 (chance 1/15). What differs between the two layers, and the variant that tests
it (``--variants``):

* ``slow_decay``: the decay's starting point. Mamba-1's ``A`` runs 1..16 over the state
  dimensions of every channel, so each channel holds a slowly decaying state dimension
  (``A = 1``); Mamba-2's one ``A`` per head is uniform in [1, 16]. A recalled token sits
  about 128 positions before its query, and ``exp(-A dt)`` over 128 steps is about
  ``exp(-0.17 * 128)`` for Mamba-2's mean: no gradient reaches the write. Variant:
  ``a_init_range = (1/32, 1/2)``.
* ``per_head_bc``: ``B, C`` shared by the heads (``ngroups = 1``) -> one group per head.
* ``small_heads``: the head dimension (64, so 2 ``dt`` values per token) -> 16 heads of 8:
  Mamba-1 selects with one ``dt`` per channel.
* ``no_norm``: the gated RMSNorm over the heads' output -> none (Mamba-1 has none).
* ``channel_dt``: head dimension 1 (one ``dt`` and one ``A`` per channel, as Mamba-1, with
  ``B, C`` still shared) plus the slow decay.
* ``linear_bc``: the SiLU after the conv on ``B, C`` (so keys and queries are mostly
  positive, and every key overlaps every query) -> on ``x`` only; Mamba-1's ``B, C`` are
  linear projections, signed.
* ``mamba``: Mamba-1 itself, the positive control at the same budget.

Each run keeps a checkpoint every ``--eval-every`` steps; each is tested on the sparse task
at the training length (``--test-examples`` sequences), which gives a learning curve per
hypothesis. Writes ``<out>/mamba2_induction_probe.json``.

    python experiments/probe_mamba2_induction.py                    # every variant
    python experiments/probe_mamba2_induction.py --variants slow_decay,mamba --steps 400
    python experiments/probe_mamba2_induction.py --smoke            # tiny, for CI
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _study_utils as su  # noqa: E402

_M1 = "model.mixer_kwargs.mamba."
_M2 = "model.mixer_kwargs.mamba2."
VARIANTS = {
    "default": {"model.mixer": "mamba2"},
    "slow_decay": {"model.mixer": "mamba2", _M2 + "a_init_range": (1 / 32, 0.5)},
    "per_head_bc": {"model.mixer": "mamba2", _M2 + "ngroups": 2},
    "small_heads": {"model.mixer": "mamba2", "model.num_heads": 16},
    "no_norm": {"model.mixer": "mamba2", _M2 + "norm": False},
    "channel_dt": {"model.mixer": "mamba2", "model.num_heads": 128,
                   _M2 + "a_init_range": (1 / 32, 0.5)},
    "linear_bc": {"model.mixer": "mamba2", _M2 + "bc_activation": False},
    "mamba": {"model.mixer": "mamba"},
    # Mamba-2 with every Mamba-1-like change at once, at Mamba-2's 2 heads of 64 ...
    "m2_as_m1_h2": {"model.mixer": "mamba2", _M2 + "dt_from_conv": True,
                    _M2 + "bc_from_conv": True, _M2 + "norm": False,
                    _M2 + "a_init_range": (1 / 32, 0.5)},
    # ... and at head dimension 1 (one dt and A per channel, Mamba-1's selection); chunk 8
    # only for speed (128 heads of 1 cost 3x Mamba-1 per step at chunk 8, 5x at 64).
    "m2_as_m1": {"model.mixer": "mamba2", "model.num_heads": 128, _M2 + "chunk_size": 8,
                 _M2 + "dt_from_conv": True, _M2 + "bc_from_conv": True, _M2 + "norm": False,
                 _M2 + "a_init_range": (1 / 32, 0.5)},
    # Mamba-1 with one Mamba-2 property at a time.
    "m1_scalar_a": {"model.mixer": "mamba", _M1 + "scalar_a": True},
    "m1_dt_input": {"model.mixer": "mamba", _M1 + "dt_from_input": True},
}
FULL = dict(seq_len=256, batch=16, d_model=64, lr=3e-3, short_conv=3, steps=600,
            eval_every=100, test_examples=128)
SMOKE = dict(seq_len=32, batch=8, d_model=32, lr=3e-3, short_conv=3, steps=20,
             eval_every=10, test_examples=8)


def main() -> int:
  t0 = time.time()
  p = su.study_args(__doc__, "synthetic")
  p.add_argument("--variants", default=",".join(v for v in VARIANTS if v != "default"),
                 help=f"comma-separated among {', '.join(VARIANTS)}")
  p.add_argument("--steps", type=int, help="training steps (default: the size's)")
  args = p.parse_args()
  size = dict(SMOKE if args.smoke else FULL)
  if args.steps:
    size["steps"] = args.steps
  names = args.variants.split(",")
  bad = sorted(set(names) - set(VARIANTS))
  if bad:
    raise ValueError(f"--variants must be among {', '.join(VARIANTS)}; got {bad}.")
  steps = size["steps"]
  flags = (f"--config.data.seq_len={size['seq_len']}", f"--config.data.batch_size={size['batch']}",
           f"--config.model.d_model={size['d_model']}", f"--config.optim.lr={size['lr']}",
           "--config.optim.schedule=constant", f"--config.train.steps={steps}",
           f"--config.optim.warmup_steps={max(steps // 10, 1)}",
           f"--config.train.eval_every={size['eval_every']}",
           f"--config.train.log_every={max(steps // 20, 1)}", "--config.train.eval_batches=4",
           f"--config.train.checkpoint_every={size['eval_every']}",
           f"--config.train.keep_checkpoints={steps // size['eval_every'] + 1}",
           f"--config.model.short_conv={size['short_conv']}", "--config.data.dense=True")
  runs = os.path.join(su.runs_dir(args, "synthetic"), "mamba2_induction_probe")
  rows = su.train_grid("configs/induction_heads.py:size=small", [VARIANTS[n] for n in names],
                       runs, args.workers, flags, collect_only=args.collect)

  from linear_attention.train import results
  b = min(size["test_examples"], 64)
  batches = -(-size["test_examples"] // b)
  for name, r in zip(names, rows):
    r["variant"] = name
    if r["status"] != "done":
      continue
    cache_path = os.path.join(r["workdir"], "sparse_curve.json")
    cache = su.read_json(cache_path) or {}
    curve = []
    for step in range(size["eval_every"], r["metrics"]["step"] + 1, size["eval_every"]):
      key = f"{step}:{size['seq_len']}:{b}x{batches}"
      if key not in cache:
        res = results.evaluate_checkpoint(r["workdir"], {"seq_len": size["seq_len"],
                                                         "batch_size": b, "dense": False},
                                          num_batches=batches, split="test", step=step)
        cache[key] = res["accuracy"]
        su.write_json(cache_path, cache)
      n = b * batches
      curve.append({"step": step, "accuracy": cache[key], "examples": n,
                    "se": su.binomial_se(cache[key], n)})
    r["sparse_test_curve"] = curve
    print(f"{name:>12}: sparse test " + " ".join(f"{c['step']}:{c['accuracy']:.2f}"
                                              for c in curve), flush=True)
    r["workdir"] = su.relative_path(r["workdir"])

  table = [{"variant": r["variant"], "mixer": r["overrides"]["model.mixer"],
            "dense_val": r["metrics"].get("validation_accuracy"),
            "sparse_test": r["sparse_test_curve"][-1]["accuracy"] if r.get("sparse_test_curve")
            else None,
            "sparse_se": r["sparse_test_curve"][-1]["se"] if r.get("sparse_test_curve") else None,
            "steps": r["metrics"].get("step")}
           for r in rows if r["status"] == "done"]
  out = {"study": "mamba2_induction_probe", "config": {"smoke": args.smoke, **size,
                                                      "variants": {n: VARIANTS[n] for n in names}},
         "chance": 1 / 15, "elapsed_s": time.time() - t0,
         "environment": su.environment(shared_machine=True), "table": table, "runs": rows}
  os.makedirs(args.out, exist_ok=True)
  su.write_json(os.path.join(args.out, "mamba2_induction_probe.json"), out)
  print(su.format_table(table, [("variant", "variant", "{}"), ("mixer", "mixer", "{}"),
                                ("dense_val", "dense val", "{:.3f}"),
                                ("sparse_test", "sparse test", "{:.3f}"),
                                ("sparse_se", "se", "{:.3f}"), ("steps", "steps", "{}")]))
  return 0 if all(r["status"] == "done" for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
