"""Associative recall study: multi-query associative recall (MQAR), Zoology's figure 2 at CPU scale.

The Zoology setting (Arora, Eyuboglu et al. 2023, "Zoology: measuring and
improving recall in efficient language models", section 3 and figure 2):
vocabulary 8192, two layers, one model per (mixer, width, setting) where a
setting is (sequence length, key-value pairs) = (64, 4) or (128, 8), zero
filler between the queries (Zoology's ``random_non_queries=False``), the
learning rate swept per point and the best one reported. Zoology's finding:
attention solves MQAR at every width, while the recurrent models need a large
state to approach it, and accuracy tracks the size of the recurrent state.

The recipe, the same for every mixer: a short causal convolution (width 3)
before every mixer (``model.short_conv``), which gives each mixer the
previous-token path that recall needs; Zoology's current configs wrap every
mixer the same way. A separate row group trains softmax attention without it,
to show what the path is worth. Constant learning rate after a 10% warmup
(the phase transition needs the rate still high when the previous-token head
forms) and early stopping at 0.99 validation accuracy, as Zoology does.

State size (the x axis of Zoology's figure) is measured, not computed by hand:
the floats in the model's decode cache (``model.init_cache(1, T)``) for one
sequence of ``T`` tokens: the key-value cache for attention (which grows with
``T``), the recurrent states and convolution windows otherwise.

Accuracy is on at least 1,024 fresh test queries per point, with its binomial
standard error ``sqrt(p (1 - p) / n)``.

Decay init: Mamba, Mamba-2 and Hawk sit near 1/pairs with their reference init at this
budget; ``--inits`` (``INITS``) adds points for them with another init, and the table keeps
the best init per point (as the learning rate), with the default init's accuracy beside it.
``FULL`` sweeps "default" and "slow".

Budget: 2 CPU cores. ``FULL`` trains at most 1,000 steps of 64 sequences
(64,000 examples) per point, against Zoology's 100,000 examples for 64 epochs
(6.4M examples); the JSON says so. The learning-rate sweep (``--lrs``) trains
the first rate on the whole grid, then each later rate only where the first did
not solve the point (validation accuracy below the early-stopping threshold):
a solved point cannot improve, so a second rate goes where it can change the
answer. Finished runs are reused when a study is rerun, so a larger grid can be
completed later with the same command. The committed table trained the second rate
only at four Mamba-family points at d=64 (it lost at each); its other points stay
``not run`` in the JSON and the claims name them as the budget's cut. Each run records
its step budget (``steps_max``; the table's ``init_steps`` per (init, rate)), since an
init sweep added later may train fewer steps than the grid (``--steps-scale``). A run stopped
before its budget's end (a checkpoint at every evaluation) is scored at its newest checkpoint
and says so (``stopped_at``); the table's ``same_step`` sets each other init's validation
accuracy beside the default init's at the same step, the equal-budget comparison.

    python experiments/studies/study_mqar.py              # full size
    python experiments/studies/study_mqar.py --lrs 1e-3,3e-3 --widths 64,128,256   # larger grid
    python experiments/studies/study_mqar.py --lrs 3e-3,1e-3 --mixers mamba,hawk --widths 64  # a subset
    python experiments/studies/study_mqar.py --mixers mamba,mamba2,hawk --lrs 3e-3 --inits slow \
        --seq-lens 64 --merge          # the decay-init sweep, added to the committed table
    python experiments/studies/study_mqar.py --smoke      # tiny, for CI

Writes ``<out>/mqar.json`` (every run with its curves and per-setting
accuracies, the best-learning-rate table and the budget against Zoology's)
and ``<out>/mqar.csv`` (the table), and prints the table.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _study_utils as su  # noqa: E402

from linear_attention.nn import registry  # noqa: E402

MIXERS = registry.select(study="mqar")

# Decay initialisations swept for the Mamba family (``--inits``). "default" is each layer's
# reference init (the grid's first points). "slow" starts with a decay about 30x slower:
# Mamba's and Mamba-2's ``A`` divided by 32 (``A * dt`` about 0.005 per step at the mean dt
# instead of 0.17), Hawk's ``a`` in [0.99, 0.9999] instead of [0.9, 0.999] (-log a about
# 10x smaller). A probe of Mamba-2 at T=64, d=64 found it reached 0.58 at 1000 steps with
# such an ``A`` against 0.25 with the default. "slow_dt" adds a larger starting ``dt``
# (log-uniform in [0.01, 0.1]) to the small ``A``: faster writes with the same slow decay.
INITS = {
    "default": {},
    "slow": {"mamba": {"a_init_scale": 1 / 32},
             "mamba2": {"a_init_range": (1 / 32, 0.5)},
             "hawk": {"min_rad": 0.99, "max_rad": 0.9999}},
    "slow_dt": {"mamba": {"a_init_scale": 1 / 32, "dt_min": 0.01},
                "mamba2": {"a_init_range": (1 / 32, 0.5), "dt_min": 0.01},
                "hawk": {"min_rad": 0.99, "max_rad": 0.9999, "c": 16.0}},
}

FULL = dict(mixers=MIXERS, widths=(64, 128), lrs=(3e-3, 1e-3), inits=("default", "slow"),
            settings=((64, 4), (128, 8)), vocab=8192, batch=64, steps=1000, eval_every=100,
            eval_batches=2, short_conv=3, no_conv_mixers=("softmax",), early_stop=0.99,
            test_queries=1024, eval_batch_size=64)
SMOKE = dict(mixers=("softmax", "gla"), widths=(32,), lrs=(3e-3,), inits=("default",),
             settings=((32, 4),),
             vocab=64, batch=8, steps=20, eval_every=10, eval_batches=1, short_conv=3,
             no_conv_mixers=("softmax",), early_stop=0.99, test_queries=16, eval_batch_size=8)
# Zoology's figure 2: 100k training examples, 64 epochs; widths 64-512; 4 learning rates.
PAPER = dict(train_examples=100_000 * 64, widths=(64, 128, 256, 512), learning_rates=4)


def state_floats(workdir: str, seq_len: int) -> int:
  """Floats in the decode cache of the run's model for one sequence of ``seq_len`` tokens."""
  import jax
  import numpy as np
  from linear_attention import data
  from linear_attention.train import results, trainer

  config = results.load_config(workdir)
  ds = data.make_dataset(config.data)

  def cache():
    model = trainer.create_model(config.model, ds.vocab_size, ds.kind, None, 0)
    return model.init_cache(1, seq_len)

  shapes = jax.eval_shape(cache)
  leaves = [x for x in jax.tree.leaves(shapes) if x.ndim > 0]  # skip position counters
  return int(sum(np.prod(x.shape) for x in leaves))


def init_overrides(mixer: str, init: str) -> dict:
  """The ``model.mixer_kwargs.<mixer>.*`` overrides of decay init ``init`` (``{}`` for the
  default, or for a mixer the init does not name)."""
  return {f"model.mixer_kwargs.{mixer}.{k}": v for k, v in INITS[init].get(mixer, {}).items()}


def init_of(overrides: dict) -> str:
  """The name of the decay init a point's overrides set ("default" when they set none)."""
  m = overrides["model.mixer"]
  for name, per_mixer in INITS.items():
    if name != "default" and per_mixer.get(m) and all(
        k in overrides and _same(overrides[k], v) for k, v in init_overrides(m, name).items()) \
        and sum(k.startswith("model.mixer_kwargs.") for k in overrides) == len(per_mixer[m]):
      return name
  return "default"


def _same(a, b) -> bool:
  """Equal after a JSON round trip (tuples come back as lists)."""
  if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
    return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
  return a == b


def points_of(size: dict) -> list[dict]:
  """Every (learning rate, seed, init, width, setting, recipe, mixer) as override dicts, in
  the order they run: an interrupted study has whole (rate, width) grids over every mixer, the
  smallest width, the first rate and the first seed first. An init other than "default" adds
  points only for the mixers it names; seed 0 sets no override (the config's default)."""
  pts = []
  for lr in size["lrs"]:
    for seed in size.get("seeds", (0,)):
      for init in size.get("inits", ("default",)):
        for d in size["widths"]:
          for t, n in size["settings"]:
            for conv, mixers in ((size["short_conv"], size["mixers"]),
                                 (0, size["no_conv_mixers"])):
              for m in mixers:
                if init != "default" and m not in INITS[init]:
                  continue
                pts.append({"model.mixer": m, "model.short_conv": conv, "data.seq_len": t,
                            "data.num_kv_pairs": n, "model.d_model": d, "optim.lr": lr,
                            **init_overrides(m, init), **su.seed_overrides(seed)})
  return pts


def setting_key(overrides: dict) -> tuple:
  """A grid point without its learning rate: (mixer, short conv, T, width, init, seed)."""
  return tuple(overrides[k] for k in ("model.mixer", "model.short_conv", "data.seq_len",
                                      "model.d_model")) + (init_of(overrides),
                                                           su.seed_of(overrides))


def later_lr_points(points: list[dict], first_rows: list[dict], threshold: float) -> list[dict]:
  """The points at learning rates after the first whose first-rate run did not reach
  ``threshold`` validation accuracy (or has not finished)."""
  first_lr = points[0]["optim.lr"]
  solved = {setting_key(r["overrides"]) for r in first_rows if r["status"] == "done"
            and r["metrics"].get("validation_accuracy", 0.0) >= threshold}
  return [p for p in points if p["optim.lr"] != first_lr and setting_key(p) not in solved]


def merge_runs(old: list[dict], new: list[dict], old_steps: int | None = None) -> list[dict]:
  """``old`` runs (a previous ``mqar.json``) with ``new`` ones added: a new finished run
  replaces an old one of the same overrides; a new unfinished one does not replace a finished
  old one (its run folder may be gone, the committed result stays), and a point never run is
  not added. Old finished runs without ``steps_max`` get ``old_steps`` (their study's steps)."""
  key = lambda r: tuple(sorted((k, su.flag_text(v)) for k, v in r["overrides"].items()))  # noqa: E731
  out = {key(r): r for r in old}
  for r in old:
    r.setdefault("init", init_of(r["overrides"]))
    if r.get("status") == "done" and old_steps:
      r.setdefault("steps_max", old_steps)
  for r in new:
    k = key(r)
    if r["status"] == "not run" and k not in out:  # a --collect of a larger grid
      continue
    if k not in out or r["status"] == "done" or out[k].get("status") != "done":
      out[k] = r
  return list(out.values())


def mark_stopped(row: dict) -> bool:
  """Marks a run that did not finish but saved a checkpoint (stopped at the session's deadline,
  or still training elsewhere) as ``stopped`` at its newest checkpoint's step (``stopped_at``),
  so that it is scored there rather than dropped. Returns whether it has a checkpoint."""
  from linear_attention.train import checkpoint

  if row["status"] not in ("not run", "stopped"):
    return False
  step = checkpoint.newest_step_on_disk(row["workdir"])
  if not step:
    return False
  row.update(status="stopped", stopped_at=step)
  return True


def unfinished(rows: list[dict]) -> list[dict]:
  """The rows the study reports as not run or failed: a run stopped part-way and scored at its
  newest checkpoint (``stopped_at``) is a cut of the budget, named in the table, not a failure;
  one stopped before any checkpoint (unscored) still counts."""
  return [r for r in rows if not (r["status"] == "stopped" and "test_accuracy" in r)]


def curve_at(curve: list[dict], step: int) -> dict | None:
  """The newest record of ``curve`` (a run's validation curve) at or before ``step``."""
  before = [c for c in curve or [] if c["step"] <= step]
  return max(before, key=lambda c: c["step"]) if before else None


def same_step(run: dict, default: dict | None, queries: int | None = None) -> dict | None:
  """``run``'s validation accuracy beside ``default``'s at the same step: the newest step both
  curves reached (a run given fewer steps, or stopped part-way, is compared with the default
  init where the default was at that point of its training, not at its end). ``queries``: the
  validation queries behind each accuracy, recorded for its standard error."""
  if default is None or not run.get("validation_curve") or not default.get("validation_curve"):
    return None
  step = min(run["validation_curve"][-1]["step"], default["validation_curve"][-1]["step"])
  a, b = curve_at(run["validation_curve"], step), curve_at(default["validation_curve"], step)
  if a is None or b is None or a["step"] != b["step"]:
    return None
  out = {"step": a["step"], "accuracy": a["accuracy"], "default_accuracy": b["accuracy"]}
  return {**out, "queries": queries} if queries else out


def _seed_groups(cands: list[dict]) -> dict[tuple[str, float], list[dict]]:
  """``cands`` (the scored runs of one point) grouped by (init, learning rate): the seeds of
  one configuration."""
  out: dict[tuple[str, float], list[dict]] = {}
  for r in cands:
    out.setdefault((r.get("init", "default"), r["overrides"]["optim.lr"]), []).append(r)
  for runs in out.values():
    runs.sort(key=lambda r: su.seed_of(r["overrides"]))
  return out


def seed_summary(runs: list[dict]) -> dict:
  """The test accuracy of one configuration over its seeds (``runs``): the mean, its standard
  error and which kind it is: ``between-seed`` with 2 or more seeds, else ``clustered`` (by
  sequence, when the run stored its per-sequence scores) or ``binomial`` (queries taken as
  independent: it understates the error)."""
  accs = [r["test_accuracy"] for r in runs]
  mean, between = su.seed_mean_se(accs)
  if between is not None:
    se, kind = between, "between-seed"
  elif runs[0].get("test_sequence_correct"):
    se, kind = su.clustered_se(runs[0]["test_sequence_correct"],
                               runs[0]["test_sequence_queries"])[1], "clustered"
  else:
    se, kind = runs[0]["test_se"], "binomial"
  out = {"accuracy": mean, "se": se, "se_kind": kind, "seeds": [su.seed_of(r["overrides"])
                                                                 for r in runs],
         "seed_accuracies": accs}
  if runs[0].get("test_sequence_correct"):
    out["clustered_se"] = [su.clustered_se(r["test_sequence_correct"],
                                           r["test_sequence_queries"])[1]
                           if r.get("test_sequence_correct") else None for r in runs]
  return out


def best_table(rows: list[dict], size: dict) -> list[dict]:
  """One row per (mixer, recipe, setting, width): the best mean test accuracy over learning
  rates and decay inits (Zoology tunes the rate per point; the Mamba family's init is tuned the
  same way), each (init, rate) averaged over its seeds (:func:`seed_summary`: ``se`` is the
  between-seed standard error with 2 or more seeds), with the default init's best beside it
  and every (init, rate) mean accuracy."""
  scored = [r for r in rows if "test_accuracy" in r]
  order = list(MIXERS) + sorted({r["overrides"]["model.mixer"] for r in scored} - set(MIXERS))
  keys = sorted({(r["overrides"]["model.mixer"], r["overrides"]["model.short_conv"],
                  r["overrides"]["data.seq_len"], r["overrides"]["model.d_model"])
                 for r in scored},
                key=lambda k: (k[1] == 0, order.index(k[0]), k[2], k[3]))
  table = []
  for m, conv, t, d in keys:
    cands = [r for r in scored if (r["overrides"]["model.mixer"], r["overrides"]["model.short_conv"],
                                   r["overrides"]["data.seq_len"], r["overrides"]["model.d_model"])
             == (m, conv, t, d)]
    groups = {k: (runs, seed_summary(runs)) for k, runs in _seed_groups(cands).items()}
    best_key = max(groups, key=lambda k: groups[k][1]["accuracy"])
    best_runs, best_sum = groups[best_key]
    best = best_runs[0]  # the first seed: its run folder, state size and curves
    default = {k: g for k, g in groups.items() if k[0] == "default"}
    d_key = max(default, key=lambda k: default[k][1]["accuracy"]) if default else None
    best_default = default[d_key][0][0] if d_key else None
    key_text = lambda k: f"{k[0]}@{k[1]:g}"  # noqa: E731
    table.append({
        "mixer": m, "short_conv": conv, "seq_len": t,
        "num_kv_pairs": best["overrides"]["data.num_kv_pairs"], "d_model": d,
        "best_lr": best_key[1], "best_init": best_key[0],
        **best_sum, "n_seeds": len(best_runs),
        "test_queries": best["test_queries"], "state_floats": best["state_floats"],
        "steps_run": best["steps_run"], "num_params": best["metrics"]["num_params"],
        "default_init_accuracy": default[d_key][1]["accuracy"] if d_key else None,
        "default_init_se": default[d_key][1]["se"] if d_key else None,
        "default_init_seeds": len(default[d_key][0]) if d_key else None,
        "lr_accuracies": {str(k[1]): g[1]["accuracy"] for k, g in default.items()},
        "init_accuracies": {key_text(k): g[1]["accuracy"] for k, g in groups.items()},
        "init_seed_accuracies": {key_text(k): g[1]["seed_accuracies"] for k, g in groups.items()},
        "init_se": {key_text(k): g[1]["se"] for k, g in groups.items()},
        # The training budget of each (init, rate): a later init sweep may train fewer steps.
        "init_steps": {key_text(k): g[0][0].get("steps_max") for k, g in groups.items()},
        # Runs scored at a checkpoint before their budget's end (stopped at the deadline).
        "stopped_at": best.get("stopped_at"),
        "init_stopped_at": {key_text(k): g[0][0]["stopped_at"] for k, g in groups.items()
                            if g[0][0].get("stopped_at")},
        # Each other init against the default init's best rate at the same training step
        # (validation accuracy, first seed of each): the equal-budget comparison.
        "same_step": {key_text(k): same_step(g[0][0], best_default, size["eval_batches"]
                                             * size["batch"]
                                             * best["overrides"]["data.num_kv_pairs"])
                      for k, g in groups.items() if k[0] != "default"}})
  return table


def sequence_scores(workdir: str, batch_size: int, num_batches: int) -> tuple[list, list]:
  """Queries right and queries scored per test sequence of a trained run (the clusters of
  :func:`_study_utils.clustered_se`): ``(correct, counts)``, one entry per sequence."""
  import numpy as np
  from flax import nnx
  from linear_attention import data
  from linear_attention.train import results

  model, config, _ = results.load_model(workdir)
  dcfg = config.data.to_dict()
  dcfg["batch_size"] = batch_size
  ds = data.make_dataset(dcfg)
  forward = nnx.jit(lambda mdl, x: mdl(x))
  correct, counts = [], []
  for b in ds.eval_batches(split="test", num_batches=num_batches):
    pred = np.asarray(forward(model, b["inputs"])).argmax(-1)
    mask = np.asarray(b["mask"]) > 0
    correct += ((pred == np.asarray(b["targets"])) & mask).sum(1).astype(int).tolist()
    counts += mask.sum(1).astype(int).tolist()
  return correct, counts


def train_flags(size: dict, steps: int) -> tuple[str, ...]:
  """The trainer flags of every MQAR run of ``size`` (vocabulary, batch, eval cadence, early
  stop) for ``steps`` steps: constant rate after a 10% warmup, a checkpoint per evaluation."""
  return (f"--config.data.vocab_size={size['vocab']}", "--config.data.random_non_queries=False",
          f"--config.data.batch_size={size['batch']}", "--config.model.num_heads=2",
          "--config.optim.schedule=constant", f"--config.train.steps={steps}",
          f"--config.optim.warmup_steps={max(steps // 10, 1)}",
          f"--config.train.eval_every={size['eval_every']}",
          f"--config.train.log_every={max(steps // 20, 1)}",
          f"--config.train.eval_batches={size['eval_batches']}",
          # A checkpoint at every evaluation: a run stopped part-way is scored at its newest.
          f"--config.train.checkpoint_every={size['eval_every']}",
          "--config.train.early_stop_metric=accuracy",
          f"--config.train.early_stop_value={size['early_stop']}")


def main() -> int:
  t0 = time.time()
  p = su.study_args(__doc__, "mqar")
  p.add_argument("--widths", help="comma-separated model widths (default: the size's)")
  p.add_argument("--lrs", help="comma-separated learning rates, the first trained everywhere "
                 "(default: the size's)")
  p.add_argument("--mixers", help="comma-separated mixers (default: the size's)")
  p.add_argument("--seq-lens", help="comma-separated sequence lengths among the size's "
                 "settings (default: all)")
  p.add_argument("--inits", help="comma-separated decay inits among "
                 f"{', '.join(INITS)} (default: default); an init other than default adds "
                 "points only for the mixers it names")
  su.add_seeds_flag(p)
  p.add_argument("--early-stop", type=float, default=None,
                 help="validation accuracy that ends a run early (default: the size's 0.99; "
                      "above 1 trains every run for its whole budget: equal steps for all)")
  p.add_argument("--merge", action="store_true",
                 help="keep the runs of the existing <out>/mqar.json and add (or replace) "
                      "this invocation's points: a subset grid completes the full table")
  args = p.parse_args()
  size = dict(SMOKE if args.smoke else FULL)
  if args.mixers:
    chosen = tuple(args.mixers.split(","))
    unknown = sorted(set(chosen) - set(MIXERS))
    if unknown:
      raise ValueError(f"--mixers must be among {', '.join(MIXERS)}; got {unknown}.")
    size["mixers"] = chosen
    size["no_conv_mixers"] = tuple(m for m in size["no_conv_mixers"] if m in chosen)
  if args.widths:
    size["widths"] = tuple(int(w) for w in args.widths.split(","))
  if args.lrs:
    size["lrs"] = tuple(float(x) for x in args.lrs.split(","))
  if args.seq_lens:
    lens = {int(t) for t in args.seq_lens.split(",")}
    known = {t for t, _ in size["settings"]}
    if not lens <= known:
      raise ValueError(f"--seq-lens must be among {sorted(known)}; got {sorted(lens - known)}.")
    size["settings"] = tuple(s for s in size["settings"] if s[0] in lens)
  if args.inits:
    size["inits"] = tuple(args.inits.split(","))
    unknown = sorted(set(size["inits"]) - set(INITS))
    if unknown:
      raise ValueError(f"--inits must be among {', '.join(INITS)}; got {unknown}.")
  size["steps"] = su.scaled_steps(size["steps"], args)
  size["seeds"] = su.parse_seeds(args.seeds)
  if args.early_stop is not None:
    size["early_stop"] = args.early_stop
  points = points_of(size)
  steps = size["steps"]
  flags = train_flags(size, steps)
  grid = lambda pts: su.train_grid("configs/mqar.py:size=small", pts, su.runs_dir(args, "mqar"),
                                   args.workers, flags, collect_only=args.collect)
  first_lr = size["lrs"][0]
  previous = su.read_json(os.path.join(args.out, "mqar.json")) if args.merge else None
  rows = grid([p for p in points if p["optim.lr"] == first_lr])
  later = later_lr_points(points, rows, size["early_stop"])
  rows += grid(later) if later else []

  from linear_attention.train import results
  from linear_attention import models
  for r in rows:
    if r["status"] != "done" and not mark_stopped(r):
      continue
    o = r["overrides"]
    t, n = o["data.seq_len"], o["data.num_kv_pairs"]
    per_batch = size["eval_batch_size"] * n
    num_batches = -(-size["test_queries"] // per_batch)
    res = results.evaluate_checkpoint(r["workdir"], {"batch_size": size["eval_batch_size"]},
                                      num_batches=num_batches, split="test")
    queries = num_batches * per_batch
    if r["status"] == "stopped":  # no final metrics: the checkpoint's step and size
      model, _, step = results.load_model(r["workdir"])
      r["metrics"] = {"step": step, "num_params": models.count_params(model)}
      r["stopped_at"] = step
    correct, counts = sequence_scores(r["workdir"], size["eval_batch_size"], num_batches)
    r.update(test_accuracy=res["accuracy"], test_queries=queries,
             test_sequence_correct=correct, test_sequence_queries=counts,
             seed=su.seed_of(o),
             test_se=su.binomial_se(res["accuracy"], queries), test_loss=res["loss"],
             state_floats=state_floats(r["workdir"], t),
             steps_run=r["metrics"]["step"], stopped_early=r["metrics"].get("stopped_early"),
             steps_max=int(results.load_config(r["workdir"]).train.steps))

  for r in rows:
    r["init"] = init_of(r["overrides"])
    r["seed"] = su.seed_of(r["overrides"])
  if previous:
    rows = merge_runs(previous.get("runs", []), rows,
                      previous.get("budget", {}).get("steps_max"))
  table = best_table(rows, size)

  # The largest budget of any run: a merged table may hold runs of several step counts (each
  # table row has its own, ``init_steps``).
  steps = max([r["steps_max"] for r in rows if r.get("steps_max")] or [steps])
  examples = size["batch"] * steps
  config = {"smoke": args.smoke, **size, "init_overrides": INITS}
  if previous:
    config = {**previous.get("config", {}), "merged": previous.get("config", {}).get(
        "merged", []) + [{**size, "command": su.environment()["command"]}]}
  for r in rows:
    r["workdir"] = su.relative_path(r["workdir"])
  out = {"study": "mqar", "config": config,
         "elapsed_s": time.time() - t0,
         "budget": {"training_examples_max": examples, "steps_max": steps,
                    "tokens_max": {str(t): examples * t for t in sorted(
                        {t for t, _ in size["settings"]} | {r["seq_len"] for r in table})},
                    "paper": PAPER,
                    "fraction_of_paper_examples": examples / PAPER["train_examples"],
                    "note": "early stopping at the accuracy threshold ends solved runs sooner"},
         "environment": su.environment(shared_machine=True), "table": table, "runs": rows}
  cols = [("mixer", "mixer", "{}"), ("short_conv", "conv", "{}"), ("seq_len", "T", "{}"),
          ("num_kv_pairs", "pairs", "{}"), ("d_model", "d", "{}"), ("best_lr", "lr", "{:g}"),
          ("best_init", "init", "{}"), ("accuracy", "acc", "{:.3f}"), ("se", "se", "{:.3f}"),
          ("default_init_accuracy", "acc@default", "{:.3f}"), ("steps_run", "steps", "{}"),
          ("stopped_at", "stopped", "{}"),
          ("state_floats", "state", "{:,}")]
  for r in rows:
    if r["status"] == "stopped" and "test_accuracy" in r:
      print(f"stopped part-way, scored at its step-{r['stopped_at']} checkpoint: {r['point']}",
            file=sys.stderr)
  return su.finish(args.out, "mqar", out, table, cols, unfinished(rows))


if __name__ == "__main__":
  sys.exit(main())
