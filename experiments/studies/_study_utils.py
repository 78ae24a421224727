"""Helpers shared by the study scripts: run metadata, result files, slope fits.

Every study writes ``<out>/<name>.json`` (config, environment, results; through
``linear_attention.io.write_json``: atomic, NaN/inf -> null) and,
where the results are a flat table, ``<out>/<name>.csv``. The notebooks in
``notebooks/`` read only these files.
"""

from __future__ import annotations

import csv
import datetime
import math
import os
import platform
import subprocess
import sys

# The one results writer (atomic, NaN/inf -> null), re-exported for the study scripts.
from linear_attention.io import write_json  # noqa: F401

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_RESULTS = os.path.join(REPO_ROOT, "results", "studies")  # the committed results
# Where a full-size run writes unless --out names another folder (gitignored): the committed
# results are replaced only when asked (experiments/outputs.py states the rule).
FULL_RESULTS = os.path.join(REPO_ROOT, "runs", "results", "studies")
# Where --smoke writes its results unless --out says otherwise (gitignored): a smoke run never
# replaces the committed full-size files.
SMOKE_RESULTS = os.path.join(REPO_ROOT, "runs", "smoke", "studies")


def default_out(name: str, smoke: bool) -> str:
  """A study's default results folder: ``runs/results/studies/<name>`` at full size,
  ``runs/smoke/studies/<name>`` for ``--smoke``; the committed ``results/studies/<name>``
  only when ``--out`` names it."""
  return os.path.join(SMOKE_RESULTS if smoke else FULL_RESULTS, name)


def environment(shared_machine: bool | None = None) -> dict:
  """What the numbers were measured on: versions, backend, cores, load, commit, time.

  Args:
    shared_machine: whether other jobs were using the CPU at the time (only
      the caller knows); ``None`` leaves it out.

  Returns:
    A JSON-ready dict.
  """
  import jax
  env = {
      "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
      "python": platform.python_version(),
      "jax": jax.__version__,
      "backend": jax.default_backend(),
      "devices": [str(d) for d in jax.devices()],
      "cpu_count": os.cpu_count(),
      "platform": platform.platform(),
  }
  try:
    env["load_average"] = list(os.getloadavg())
  except OSError:
    pass
  try:
    env["git_commit"] = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
        text=True, timeout=10).stdout.strip() or None
  except (OSError, subprocess.SubprocessError):
    env["git_commit"] = None
  if shared_machine is not None:
    env["shared_machine"] = shared_machine
  env["command"] = " ".join([os.path.basename(sys.argv[0])] + [_portable_arg(a) for a in sys.argv[1:]])
  return env


def _portable_arg(arg: str) -> str:
  """A command-line argument (``--out=PATH`` or ``PATH``) with its path as
  :func:`relative_path` stores it: results are committed, the machine's paths mean nothing
  elsewhere."""
  flag, eq, value = arg.partition("=") if arg.startswith("--") else ("", "", arg)
  if not eq:
    flag, value = "", arg
  return flag + eq + relative_path(value)


def write_csv(path: str, rows: list[dict], columns: list[str]) -> None:
  """Writes ``rows`` (dicts) with the given ``columns``; missing values are empty."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  with open(path, "w", newline="") as f:
    w = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
    w.writeheader()
    for r in rows:
      w.writerow({c: r.get(c, "") for c in columns})


def read_json(path: str):
  """The JSON object at ``path``, or None when it is missing or unreadable."""
  import json
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def flag_text(v) -> str:
  """A config value as ``--config.*`` flags write it (tuples and JSON lists alike)."""
  from linear_attention import sweep
  return sweep.flag_value(v)


def relative_path(path: str) -> str:
  """``path`` as results files store it, without the machine's absolute prefix: relative to
  the repository root when under it, else from its last ``runs`` folder on (run folders live
  under ``runs/`` of a checkout or of ``/work``), else its relative path from the root."""
  if not os.path.isabs(path):
    return path
  rel = os.path.relpath(path, REPO_ROOT)
  if not rel.startswith(".."):
    return rel
  parts = path.split(os.sep)
  if "runs" in parts:
    i = len(parts) - 1 - parts[::-1].index("runs")
    return os.path.join(*parts[i:])
  return rel


def portable(obj):
  """``obj`` (JSON-ready) with every string that is an absolute path made relative
  (:func:`relative_path`): results files carry no machine's directories."""
  if isinstance(obj, dict):
    return {k: portable(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [portable(v) for v in obj]
  if isinstance(obj, str) and os.path.isabs(obj) and not any(c.isspace() for c in obj):
    return relative_path(obj)
  return obj


def binomial_se(p: float, n: int) -> float:
  """Standard error ``sqrt(p (1 - p) / n)`` of an accuracy ``p`` on ``n`` independent items;
  NaN for ``n = 0``."""
  return math.sqrt(p * (1 - p) / n) if n else float("nan")


def seed_mean_se(values) -> tuple[float, float | None]:
  """The mean of one figure over seeds and its between-seed standard error
  ``stdev(values, ddof=1) / sqrt(n)``; the error is None for a single seed (one run shows no
  spread).

  Args:
    values: the figure of each seed (an accuracy, a loss), at least one.

  Raises:
    ValueError: ``values`` is empty.

  Example: ``seed_mean_se([0.9, 0.8, 0.7])`` is ``(0.8, 0.0577...)``.
  """
  values = [float(v) for v in values]
  if not values:
    raise ValueError("values must hold at least one seed's figure, got none.")
  n = len(values)
  mean = sum(values) / n
  if n < 2:
    return mean, None
  var = sum((v - mean) ** 2 for v in values) / (n - 1)
  return mean, math.sqrt(var / n)


def clustered_se(correct, counts) -> tuple[float, float]:
  """An accuracy over items grouped in clusters (the queries of one MQAR sequence) and its
  cluster-robust standard error: items of one cluster share its sequence, so the cluster,
  not the item, is the independent unit.

  With ``p = sum(correct) / sum(counts)`` over ``G`` clusters, the error is
  ``sqrt(G / (G - 1) * sum((correct_i - p * counts_i) ** 2)) / sum(counts)``; with equal
  counts this is the standard error of the mean of the per-cluster accuracies.

  Args:
    correct: items right per cluster.
    counts: items scored per cluster (clusters with none are ignored).

  Raises:
    ValueError: lengths differ, or fewer than 2 clusters with items.

  Example: ``clustered_se([2, 0], [2, 2])`` is ``(0.5, 0.5)``.
  """
  if len(correct) != len(counts):
    raise ValueError(f"correct and counts must have one entry per cluster, got lengths "
                     f"{len(correct)} and {len(counts)}.")
  pairs = [(float(c), float(n)) for c, n in zip(correct, counts) if n > 0]
  if len(pairs) < 2:
    raise ValueError(f"clustered_se needs at least 2 clusters with items, got {len(pairs)}.")
  g, total = len(pairs), sum(n for _, n in pairs)
  p = sum(c for c, _ in pairs) / total
  ss = sum((c - p * n) ** 2 for c, n in pairs)
  return p, math.sqrt(g / (g - 1) * ss) / total


def seed_overrides(seed: int) -> dict:
  """The override of training seed ``seed``: none for seed 0 (the configs' default), so runs
  trained before seeds were an axis count as seed 0 and are reused."""
  return {"train.seed": int(seed)} if seed else {}


def seed_of(overrides: dict) -> int:
  """The training seed of a point's overrides (0 when they set none)."""
  return int(overrides.get("train.seed", 0))


def add_seeds_flag(parser) -> None:
  """``--seeds``, for the studies that train each point once per seed."""
  parser.add_argument("--seeds", default=None,
                      help="comma-separated training seeds, each point trained once per seed "
                           "(default: 0); result rows carry their seed and the table the "
                           "between-seed mean and standard error")


def parse_seeds(text: str | None) -> tuple[int, ...]:
  """``--seeds 0,1,2`` as a tuple of distinct non-negative ints (None: ``(0,)``).

  Raises:
    ValueError: a seed that is not a non-negative int, or one given twice.
  """
  if not text:
    return (0,)
  try:
    seeds = tuple(int(s) for s in text.split(","))
  except ValueError:
    raise ValueError(f"--seeds must be comma-separated non-negative ints, got {text!r}.") from None
  if any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
    raise ValueError(f"--seeds must be distinct non-negative ints, got {text!r}.")
  return seeds


def loglog_slope(xs, ys) -> float | None:
  """Least-squares slope of ``log y`` against ``log x``; None with under 2 distinct x.

  Args:
    xs, ys: equal-length sequences of positive numbers.
  """
  pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if x > 0 and y and y > 0]
  if len({p[0] for p in pts}) < 2:
    return None
  mx = sum(p[0] for p in pts) / len(pts)
  my = sum(p[1] for p in pts) / len(pts)
  sxx = sum((p[0] - mx) ** 2 for p in pts)
  return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx


# ----------------------------------------------------------------------------- training grids


def train_grid(config_arg: str, points: list[dict], runs_dir: str, workers: int = 1,
               extra_flags: tuple[str, ...] = (), collect_only: bool = False) -> list[dict]:
  """Trains every point (a ``--config`` override dict) as its own process; see ``sweep``.

  Running and collecting are :mod:`linear_attention.sweep`'s: finished points are skipped on
  a rerun (found by their overrides, so a grid that grew retrains nothing), and an
  interrupted study resumes. With ``workers`` >= the core count, each process runs XLA on one
  thread: small models scale poorly across threads, so independent runs use the cores better.

  Args:
    config_arg: ``configs/<task>.py:<args>``.
    points: override dicts (``{"model.mixer": "gla", "optim.lr": 1e-3}``).
    runs_dir: one sub-directory per point (checkpoints, logs); not a results folder.
    workers: concurrent training processes.
    extra_flags: ``--config.*`` flags given to every point.
    collect_only: train nothing; report the points as they stand (``sweep.collect``: done,
      failed, or ``not run``), so that a study stopped part-way can still write what it has.

  Raises:
    SystemExit(3): SIGTERM or SIGINT stopped the sweep; its ``error:`` line is printed.

  Returns:
    One row per point: ``point, status, overrides, metrics`` (``final_metrics.json``),
    ``workdir``, ``train_curve`` and ``validation_curve`` (the logged records), ``error``.
  """
  from linear_attention import sweep
  from linear_attention.train import lifeline, metrics

  lifeline.watch("run_studies.py")  # when it started this study: stop (trainers save) if it dies
  flags = os.environ.get("XLA_FLAGS", "")
  if workers >= (os.cpu_count() or 1) and "xla_cpu_multi_thread_eigen" not in flags:
    os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false").strip()
  if collect_only:
    rows = sweep.collect(runs_dir, points)
  else:
    try:
      rows = sweep.run_sweep(config_arg, runs_dir, workers, extra_flags, points=points)
    except sweep.SweepStoppedError as e:
      # A stopped study ends as the sweep command does: one line (the checkpoint each
      # stopped run saved) and exit 3; rerunning the study resumes them.
      print(f"error: {e}", file=sys.stderr, flush=True)
      raise SystemExit(3) from None
  for r in rows:
    wd = os.path.join(runs_dir, r["point"])
    r["workdir"] = wd
    keep = ("step", "loss", "accuracy", "tokens_per_s", "bits_per_byte", "elapsed")
    for split in ("train", "validation"):
      r[f"{split}_curve"] = [{k: m[k] for k in keep if k in m}
                             for m in metrics.read_metrics(wd, split)]
    r.pop("command", None)
    r.pop("log_tail", None)
  return rows


def schedule_flags(steps: int, eval_batches: int) -> tuple[str, ...]:
  """``--config.*`` flags for a run of ``steps``: 10% warmup, 4 evaluations, 20 log points."""
  return (f"--config.train.steps={steps}", f"--config.optim.warmup_steps={max(steps // 10, 1)}",
          f"--config.train.eval_every={max(steps // 4, 1)}",
          f"--config.train.log_every={max(steps // 20, 1)}",
          f"--config.train.eval_batches={eval_batches}")


def finish(out_dir: str, name: str, result: dict, table: list[dict],
           columns: list[tuple[str, str, str]], rows: list[dict]) -> int:
  """Writes ``<name>.json`` (``result``) and ``<name>.csv`` (``table``), prints the table.

  Returns:
    The exit status: 1 when a run in ``rows`` failed (listed on stderr), else 0.
  """
  write_json(os.path.join(out_dir, f"{name}.json"), portable(result))
  write_csv(os.path.join(out_dir, f"{name}.csv"), table, [c[0] for c in columns])
  print(format_table(table, columns))
  not_run = [r["point"] for r in rows if r["status"] == "not run"]
  if not_run:
    print(f"{len(not_run)} of {len(rows)} runs not run yet (rerun without --collect to train "
          "them):\n" + "\n".join(not_run), file=sys.stderr)
  failed = [f"{r['point']}: {r.get('error')}" for r in rows
            if r["status"] not in ("done", "not run")]
  if failed:
    print("failed runs:\n" + "\n".join(failed), file=sys.stderr)
  return 1 if failed else 0


def format_table(rows: list[dict], columns: list[tuple[str, str, str]]) -> str:
  """A plain-text table: ``columns`` are ``(key, header, format)`` (``"{:.3f}"``)."""
  head = [h for _, h, _ in columns]
  body = [[("-" if r.get(k) is None else f.format(r[k])) for k, _, f in columns] for r in rows]
  widths = [max(len(x) for x in col) for col in zip(head, *body)]
  line = lambda cells: "  ".join(c.rjust(w) for c, w in zip(cells, widths))  # noqa: E731
  return "\n".join([line(head)] + [line(b) for b in body])


def study_args(description: str, name: str):
  """The flags every training study shares: ``--smoke --out --runs --workers``."""
  import argparse

  class _Parser(argparse.ArgumentParser):
    def parse_args(self, *a, **kw):  # --out's default depends on --smoke
      args = super().parse_args(*a, **kw)
      if args.out is None:
        args.out = default_out(name, args.smoke)
      return args

  p = _Parser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--smoke", action="store_true", help="tiny size, for CI (under a minute)")
  p.add_argument("--out", default=None,
                 help=f"results folder (JSON, CSV); default runs/results/studies/{name}, or "
                      f"runs/smoke/studies/{name} with --smoke (the committed results are "
                      f"replaced only when asked: --out results/studies/{name})")
  p.add_argument("--runs", default=None,
                 help=f"training runs folder (default: runs/studies/{name}[-smoke]); finished "
                      "runs there are reused")
  p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                 help="concurrent training processes")
  p.add_argument("--collect", action="store_true",
                 help="train nothing: write the results of the runs finished so far")
  p.add_argument("--steps-scale", type=float, default=1.0,
                 help="multiply every run's training steps (more compute: closer to the papers)")
  return p


def scaled_steps(steps: int, args) -> int:
  """``steps`` times ``--steps-scale`` (at least 1).

  Raises:
    ValueError: a non-positive ``--steps-scale``.
  """
  if not args.steps_scale > 0:
    raise ValueError(f"--steps-scale must be > 0, got {args.steps_scale}.")
  return max(1, round(steps * args.steps_scale))


def runs_dir(args, name: str) -> str:
  """``--runs`` or ``runs/studies/<name>[-smoke]`` under the repository."""
  return args.runs or os.path.join(REPO_ROOT, "runs", "studies", name + ("-smoke" if args.smoke else ""))
