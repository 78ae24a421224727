"""The recall-versus-state frontier: MQAR accuracy against state size within each architecture.

Zoology (Arora, Eyuboglu et al. 2023, figures 2-3) and Based (Arora et al. 2024, figure 2)
plot MQAR accuracy against the floats of the recurrent state, one line per architecture, the
state varied **within** an architecture at a fixed width (GLA's key dimension, Based's
feature dimension, Mamba's state size, a sliding window's size). Their finding: within each
architecture recall grows with the state, and architectures differ in how much recall a float
of state buys. The paper setup: vocabulary 8192, T up to 512 with up to 64 key-value pairs,
widths 64-512, 100,000 training examples for 64 epochs (6.4M), the learning rate swept per
point, on GPUs.

This budget: one shared CPU core for about an hour (issue 40, item 4), so the grid is cut to
what fits, chosen by a pilot (one XLA thread, vocabulary 512, d=64, 4,096 tokens a step;
seconds per step): at T=256 with batch 16 Mamba (d_state 64) 2.3 s, GLA 0.36 s, a sliding
window 0.3 s, Based 0.6 s; at T=128 with batch 32 gated DeltaNet 0.28 s. GLA (expand_k 1.0)
was still at chance (loss log 256) after 240 steps at both T=256 (batch 16) and T=128 (batch
32), and in the committed MQAR study it needed 800-1,000 steps of 64 to pass 0.5, where
softmax, Based and gated DeltaNet solved it in 300-700; Mamba sat at 0.26 after 1,000 steps
even at T=64 there. Both lines would likely sit at chance at this budget, so the grid takes
the three faster learners. ``FULL``: T=128 (not 256: at T=256 even one line's three points
did not fit), 16 pairs, d_model 64, 2 layers, the
short convolution of width 3 before every mixer (``study_mqar``'s recipe), zero filler,
vocabulary 512 (Zoology uses 8192; at d=64 the output head dominates the step, and 16
distinct keys of [1, 256) and values of [256, 512) keep the task well-defined, chance 1/256),
batch 16, at most 1,000 steps (16,000 sequences, 0.25% of Zoology's 6.4M examples; gated
DeltaNet was still at chance after 300 steps of 32 in the pilot, so steps, not batch, get the
budget), lr 3e-3 constant after a 10% warmup, early stop at 0.99 validation accuracy, seed 0, three
architectures x three state sizes (``GRID``): gated DeltaNet's key dimension per head (as
GLA's in the papers), Based's Taylor feature dimension, a softmax sliding window (windows
below T: a window >= T is full attention).

The runs are ordered so that a study stopped part-way has whole architectures' extremes first:
every architecture's smallest and largest state, then the middle ones, then the next seed.

State size is ``study_mqar.state_floats`` (the model's decode cache for one sequence of T
tokens); test accuracy is on >= 1,024 fresh test queries with the standard error clustered by
sequence (``study_mqar.sequence_scores``); with more than one seed the table carries the
between-seed mean and standard error (``study_mqar.seed_summary``).

    python experiments/studies/study_frontier.py --workers 1 --out results/studies/mqar_frontier
    python experiments/studies/study_frontier.py --collect --out results/studies/mqar_frontier
    python experiments/studies/study_frontier.py --seeds 0,1,2 --workers 1   # more seeds
    python experiments/studies/study_frontier.py --smoke --workers 1         # tiny, seconds
    # seeds 1 and 2 here, seed 0 from the committed results:
    python experiments/studies/study_frontier.py --seeds 1,2 --workers 1 \
        --merge results/studies/mqar_frontier/frontier.json --out results/studies/mqar_frontier

Writes ``<out>/frontier.json`` (every run with its curves, per-sequence test scores, state
floats, steps and seconds; the table per (mixer, state value); the budget against the
papers') and ``<out>/frontier.csv`` (the table), and prints the table.
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _study_utils as su  # noqa: E402
import study_mqar as mq  # noqa: E402

# Per architecture, the option that sets its state size and its values, smallest first (at
# d_model 64 with 2 heads: gated DeltaNet's key dim 8/16/32 per head, Based's 4/8/16 Taylor
# features, a window of 16/32/64 tokens); configs/mqar.py's FRONTIER with gated DeltaNet for
# GLA and Mamba, which stay at chance at this budget (see the docstring).
GRID = {"gated_deltanet": ("head_k_dim", (8, 16, 32)), "based": ("feature_dim", (4, 8, 16)),
        "local": ("window", (16, 32, 64))}
FULL = dict(grid=GRID, seq_len=128, num_kv_pairs=16, d_model=64, vocab=512, batch=16,
            steps=1000, lr=3e-3, eval_every=100, eval_batches=4, short_conv=3, early_stop=0.99,
            test_queries=1024, eval_batch_size=64)
# One line of two points: the cheapest mixer to compile (the test's minute is mostly compiles).
SMOKE = dict(grid={"local": ("window", (4, 8))}, seq_len=32,
             num_kv_pairs=4, d_model=16, vocab=64, batch=8, steps=6, lr=3e-3, eval_every=3,
             eval_batches=1, short_conv=3, early_stop=0.99, test_queries=16, eval_batch_size=8)
# Zoology's figures 2-3 and Based's figure 2: 100k examples x 64 epochs, vocabulary 8192.
PAPER = dict(train_examples=100_000 * 64, vocab=8192, widths=(64, 128, 256, 512),
             seq_lens=(64, 128, 256, 512), max_kv_pairs=64, learning_rates=4)


def points_of(size: dict, seeds=(0,)) -> list[dict]:
  """The grid's override dicts in run order: per seed, every architecture's smallest then
  largest state, then the states between (a study stopped part-way has each line's ends)."""
  orders = {m: ([0, len(v) - 1] if len(v) > 1 else [0]) + list(range(1, len(v) - 1))
            for m, (_, v) in size["grid"].items()}
  pts = []
  for seed in seeds:
    for i in range(max(len(o) for o in orders.values())):
      for m, (opt, values) in size["grid"].items():
        if i < len(orders[m]):
          pts.append({"model.mixer": m, f"model.mixer_kwargs.{m}.{opt}": values[orders[m][i]],
                      "model.short_conv": size["short_conv"], "data.seq_len": size["seq_len"],
                      "data.num_kv_pairs": size["num_kv_pairs"],
                      "model.d_model": size["d_model"], "optim.lr": size["lr"],
                      **su.seed_overrides(seed)})
  return pts


def state_of(overrides: dict) -> tuple[str, float]:
  """The state option a point sets and its value: ``("window", 64)``."""
  (key, value), = [(k, v) for k, v in overrides.items() if k.startswith("model.mixer_kwargs.")]
  return key.rsplit(".", 1)[1], value


def check_size(size: dict) -> None:
  """Raises ValueError for a grid the task cannot honour: a window >= T (full attention, not
  a sliding window), an unknown mixer, or an option with no values."""
  from linear_attention.nn import registry
  for m, (opt, values) in size["grid"].items():
    if m not in registry.select():
      raise ValueError(f"grid mixer must be a registered mixer, got {m!r}.")
    if not values:
      raise ValueError(f"grid option {m}.{opt} must have at least one value, got none.")
    if m == "local" and max(values) >= size["seq_len"]:
      raise ValueError(f"local windows must be < seq_len {size['seq_len']} (a window >= T is "
                       f"full attention), got {max(values)}.")


def table_of(rows: list[dict], size: dict) -> list[dict]:
  """One row per (mixer, state value), its seeds averaged (``study_mqar.seed_summary``: the
  clustered SE with one seed, the between-seed SE with more), ordered by mixer then state; a
  seed stopped part-way enters only where no seed of the point finished."""
  scored = [r for r in rows if "test_accuracy" in r]
  groups: dict[tuple, list[dict]] = {}
  for r in scored:
    groups.setdefault((r["mixer"], r["state_value"]), []).append(r)
  order = list(size["grid"])
  table = []
  for (m, v), runs in sorted(groups.items(), key=lambda kv: (
      order.index(kv[0][0]) if kv[0][0] in order else len(order), kv[0][0], kv[0][1])):
    # A seed stopped part-way (the deadline) is not averaged with finished seeds of fewer or
    # more steps; it stands for the point only when no seed finished.
    finished = [r for r in runs if r["status"] == "done"]
    left_out = [r["seed"] for r in runs if r["status"] != "done"] if finished else []
    runs = sorted(finished or runs, key=lambda r: r["seed"])
    first = runs[0]
    table.append({"mixer": m, "state_option": first["state_option"], "state_value": v,
                  "state_floats": first["state_floats"], **mq.seed_summary(runs),
                  "n_seeds": len(runs), "test_queries": first["test_queries"],
                  "steps_run": [r["steps_run"] for r in runs],
                  "seconds": [None if r["seconds"] is None else round(r["seconds"], 1)
                              for r in runs],
                  "stopped_at": [r.get("stopped_at") for r in runs],
                  "stopped_seeds_left_out": left_out,
                  "num_params": first["metrics"]["num_params"]})
  return table


# The size keys an earlier result must share with this run to be merged into its table.
MERGE_KEYS = ("grid", "seq_len", "num_kv_pairs", "d_model", "vocab", "batch", "steps", "lr",
              "short_conv", "early_stop", "test_queries", "eval_batch_size")


def merge_rows(path: str, size: dict, seeds) -> list[dict]:
  """The runs of ``path`` (an earlier ``frontier.json``) whose seeds are not in ``seeds``,
  each marked with the file and the XLA flags it was trained under (``merged_from``).

  Raises:
    ValueError: ``path`` was run at another size (any of :data:`MERGE_KEYS` differs), or
      holds none of the other seeds.
  """
  with open(path) as f:
    earlier = json.load(f)
  cfg = earlier["config"]
  mine = json.loads(json.dumps({k: size[k] for k in MERGE_KEYS}))  # tuples as JSON lists
  differ = [k for k in MERGE_KEYS if cfg.get(k) != mine[k]]
  if differ:
    raise ValueError(f"--merge {path} was run at another size: {', '.join(differ)} differ "
                     f"({', '.join(f'{k}={cfg.get(k)!r} here {mine[k]!r}' for k in differ)}).")
  rows = [dict(r, merged_from={"file": su.relative_path(os.path.abspath(path)),
                               "xla_flags": cfg.get("xla_flags", "")})
          for r in earlier["runs"] if r.get("seed") not in seeds]
  if not rows:
    raise ValueError(f"--merge {path} holds no runs of seeds other than {list(seeds)}.")
  return rows


def main() -> int:
  t0 = time.time()
  p = su.study_args(__doc__, "mqar_frontier")
  su.add_seeds_flag(p)
  p.add_argument("--mixers", help="comma-separated architectures among the size's grid "
                 "(default: all of it)")
  p.add_argument("--merge", help="an earlier frontier.json of the same size: its runs of the "
                 "seeds not given to --seeds join this run's in the table (seeds trained on "
                 "another machine or in another session)")
  args = p.parse_args()
  size = dict(SMOKE if args.smoke else FULL)
  if args.mixers:
    chosen = args.mixers.split(",")
    unknown = sorted(set(chosen) - set(size["grid"]))
    if unknown:
      raise ValueError(f"--mixers must be among {', '.join(size['grid'])}; got {unknown}.")
    size["grid"] = {m: size["grid"][m] for m in chosen}
  if args.workers < 1:
    raise ValueError(f"--workers must be >= 1, got {args.workers}.")
  check_size(size)
  size["steps"] = su.scaled_steps(size["steps"], args)
  seeds = su.parse_seeds(args.seeds)
  steps = size["steps"]
  flags = mq.train_flags(size, steps)
  rows = su.train_grid("configs/mqar.py:size=small", points_of(size, seeds),
                       su.runs_dir(args, "mqar_frontier"), args.workers, flags,
                       collect_only=args.collect)

  from linear_attention import models
  from linear_attention.train import results
  n = size["num_kv_pairs"]
  per_batch = size["eval_batch_size"] * n
  num_batches = -(-size["test_queries"] // per_batch)
  for r in rows:
    o = r["overrides"]
    opt, value = state_of(o)
    r.update(mixer=o["model.mixer"], state_option=opt, state_value=value, seed=su.seed_of(o))
    if r["status"] != "done" and not mq.mark_stopped(r):
      continue
    res = results.evaluate_checkpoint(r["workdir"], {"batch_size": size["eval_batch_size"]},
                                      num_batches=num_batches, split="test")
    if r["status"] == "stopped":  # no final metrics: the checkpoint's step and size
      model, _, step = results.load_model(r["workdir"])
      r["metrics"] = {"step": step, "num_params": models.count_params(model)}
      r["stopped_at"] = step
    correct, counts = mq.sequence_scores(r["workdir"], size["eval_batch_size"], num_batches)
    curve = r.get("train_curve") or [{}]
    r.update(test_accuracy=res["accuracy"], test_queries=num_batches * per_batch,
             test_se=su.clustered_se(correct, counts)[1],
             test_binomial_se=su.binomial_se(res["accuracy"], num_batches * per_batch),
             test_sequence_correct=correct, test_sequence_queries=counts,
             test_loss=res["loss"], state_floats=mq.state_floats(r["workdir"], size["seq_len"]),
             steps_run=r["metrics"]["step"], stopped_early=r["metrics"].get("stopped_early"),
             # Training seconds: the trainer's own clock (the last logged record's when stopped).
             seconds=r["metrics"].get("elapsed", curve[-1].get("elapsed")),
             steps_max=steps)
  merged = merge_rows(args.merge, size, seeds) if args.merge else []
  rows += merged
  table = table_of(rows, size)
  for r in rows:
    r["workdir"] = su.relative_path(r["workdir"])
  examples = size["batch"] * steps
  done = [r for r in rows if "seconds" in r and r["seconds"] is not None]
  all_seeds = sorted(set(seeds) | {r["seed"] for r in merged})
  out = {"study": "frontier", "config": {"smoke": args.smoke, **size, "seeds": all_seeds,
                                         "workers": args.workers,
                                         "xla_flags": os.environ.get("XLA_FLAGS", "")},
         "elapsed_s": time.time() - t0,
         "budget": {"training_examples_max": examples, "steps_max": steps,
                    "tokens_max": examples * size["seq_len"], "paper": PAPER,
                    "fraction_of_paper_examples": examples / PAPER["train_examples"],
                    "training_seconds_measured": sum(r["seconds"] for r in done),
                    "note": f"vocabulary {size['vocab']} instead of Zoology's 8192 (the output "
                            "head dominates the step at d=64); one shared CPU core; early "
                            "stopping at the accuracy threshold ends solved runs sooner"},
         "environment": su.environment(shared_machine=True), "table": table, "runs": rows}
  cols = [("mixer", "mixer", "{}"), ("state_option", "option", "{}"),
          ("state_value", "value", "{:g}"), ("state_floats", "state", "{:,}"),
          ("accuracy", "acc", "{:.3f}"), ("se", "se", "{:.3f}"), ("se_kind", "se kind", "{}"),
          ("n_seeds", "seeds", "{}"), ("steps_run", "steps", "{}"), ("seconds", "seconds", "{}")]
  return su.finish(args.out, "frontier", out, table, cols, mq.unfinished(rows))


if __name__ == "__main__":
  sys.exit(main())
