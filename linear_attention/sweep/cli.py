"""``python -m linear_attention.sweep``: the command line (see README.md, "Sweeps")."""

from __future__ import annotations

import os
import sys
from typing import Sequence

from linear_attention.sweep import runner
from linear_attention.sweep.points import flag_value, point_dirs
from linear_attention.sweep.children import STOP_GRACE_S, SweepStoppedError
from linear_attention.sweep.runner import _describe


ARRAY_ENV = "SLURM_ARRAY_TASK_ID"  # the default source of --point in an array job


def _format_table(rows: list[dict]) -> str:
  keys = ["validation_loss", "validation_accuracy"]
  lines = [f"{'point':<40} {'status':<7} " + " ".join(f"{k:>20}" for k in keys)]
  for r in rows:
    m = r.get("metrics") or {}
    vals = " ".join(f"{m[k]:>20.4f}" if isinstance(m.get(k), (int, float)) else f"{'-':>20}"
                    for k in keys)
    lines.append(f"{r['point'][:40]:<40} {r['status']:<7} {vals}")
  return "\n".join(lines)


def _process_id(flags: Sequence[str]) -> int:
  """This host's process in a multi-host point: ``--process_id``, ``JAX_PROCESS_ID``, or with
  ``--distributed`` SLURM's task rank (what ``jax.distributed`` detects there); else 0."""
  for f in flags:
    if f.startswith("--process_id="):
      return int(f.partition("=")[2])
  if os.environ.get("JAX_PROCESS_ID"):
    return int(os.environ["JAX_PROCESS_ID"])
  if "--distributed" in flags and os.environ.get("SLURM_PROCID"):
    return int(os.environ["SLURM_PROCID"])
  return 0


def main(argv: Sequence[str] | None = None) -> int:
  """The command line; see the module docstring."""
  import argparse
  parser = argparse.ArgumentParser(prog="python -m linear_attention.sweep", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--config", required=True, help="config file with get_sweep(), [:arg]")
  parser.add_argument("--workdir", required=True)
  parser.add_argument("--workers", type=int, default=1, help="concurrent points (local runner)")
  mode = parser.add_mutually_exclusive_group()
  mode.add_argument("--list", action="store_true",
                    help="print each point's index, status, directory and overrides; run nothing")
  mode.add_argument("--point", type=int, default=None,
                    help="run only this point (0-based, as --list numbers them)")
  mode.add_argument("--collect", action="store_true",
                    help="write summary.csv/json from the points finished so far; run nothing")
  parser.add_argument("--stop-grace", type=float, default=STOP_GRACE_S, metavar="SECONDS",
                      help="after SIGTERM/SIGINT, seconds each running trainer has to save its "
                           f"checkpoint before it is killed (default {STOP_GRACE_S:g})")
  parser.add_argument("--array-env", default=ARRAY_ENV, metavar="VAR",
                      help="without --point, --list or --collect: when this environment variable "
                           f"is set, run the point it names (default {ARRAY_ENV})")
  args, rest = parser.parse_known_args(argv)
  bad = [a for a in rest
         if not a.startswith("--config.") and a.partition("=")[0] not in runner.TRAINER_FLAGS]
  if bad:
    parser.error(f"unknown arguments {bad}; only --config.<field>=value flags and the trainer's "
                 f"{', '.join(runner.TRAINER_FLAGS)} are passed on.")
  array_value = os.environ.get(args.array_env) if args.array_env else None
  point = args.point
  try:
    if point is None and not (args.list or args.collect) and array_value not in (None, ""):
      try:
        point = int(array_value)
      except ValueError:
        raise ValueError(f"{args.array_env} must be a point index, got {array_value!r}.") from None
      print(f"point {point} (from {args.array_env})", flush=True)
    distributed = any(a.partition("=")[0] in runner.TRAINER_FLAGS for a in rest)
    if distributed and args.workers > 1 and point is None and not (args.list or args.collect):
      raise ValueError(f"--workers must be 1 with the multi-host flags {runner.TRAINER_FLAGS}, got "
                       f"{args.workers}: every point's trainer would claim the same processes.")
    if args.list or args.collect:
      points = runner.load_sweep(args.config)
      if args.list:
        for i, (name, row) in enumerate(zip(point_dirs(args.workdir, points),
                                            runner.collect(args.workdir, points))):
          flags = " ".join(f"{k}={flag_value(v)}" for k, v in points[i].items())
          print(f"{i:4d}  {row['status']:<8} {name}  {flags}")
        print(f"{len(points)} points; --point takes 0..{len(points) - 1}", file=sys.stderr)
        return 0
      if not points:
        raise ValueError("the sweep has no points.")
      if not os.path.isdir(args.workdir):  # a typo, or nothing ran yet: say so, create nothing
        raise ValueError(f"--collect: the sweep directory {args.workdir!r} does not exist: no "
                         "point has run there (the same command without --collect runs them).")
      rows = runner.collect(args.workdir, points)
      runner.write_summary(args.workdir, rows)
      print(_format_table(rows))
      done = sum(r["status"] == "done" for r in rows)
      print(f"{done} of {len(rows)} points done; summary: "
            f"{os.path.join(args.workdir, 'summary.csv')}")
      return 0 if done == len(rows) else 1
    if point is not None:
      row = runner.run_one(args.config, args.workdir, point, extra_flags=rest,
                    process_id=_process_id(rest), stop_grace_s=args.stop_grace)
      print(_describe(row["point"], row), flush=True)
      code = row.get("returncode")
      if row["status"] == "done":
        return 0
      return code if isinstance(code, int) and code > 0 else 1
    rows = runner.run_sweep(args.config, args.workdir, args.workers, extra_flags=rest,
                     stop_grace_s=args.stop_grace)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  except SweepStoppedError as e:
    print(f"error: {e}", file=sys.stderr)
    return 3
  print(_format_table(rows))
  print(f"summary: {os.path.join(args.workdir, 'summary.csv')}")
  return 0 if all(r["status"] == "done" for r in rows) else 1
