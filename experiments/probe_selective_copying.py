"""Selective copying at a length where a time-invariant model should fail (issue 30, item 4).

The synthetic study (``study_synthetic.py``) trains selective copying at T=64 (16 data tokens
in 48 slots, then 16 markers): there Mamba and S4D end level (about 0.78 each), because 48
slots hold few enough offsets for a fixed kernel to learn them. At T=256 with 16 tokens a
pilot stayed at chance for 1000 steps, too slow for 2 shared cores. This probe keeps the
paper's layout (``data.SelectiveCopying``: data tokens at random ordered positions of the
first ``T - N`` slots, then ``N`` markers, vocabulary 16) and makes the spread large against
the number of tokens instead: ``N`` = 4 data tokens among ``T - N`` = 124 slots at T=128, so
where the i-th token sits varies over about 100 positions. The recipe is the study's (d 64,
2 layers, short conv 3, lr 3e-3 constant after a warmup), batch 32.

Every run keeps its validation curve (every ``eval_every`` steps). A run stopped before
its last step (``--collect`` while training, or a deadline) is tested at its newest
checkpoint and says so (``stopped_at``). Writes ``<out>/selective_copying_probe.json``.

    python experiments/probe_selective_copying.py            # Mamba and S4D at T=128, N=4
    python experiments/probe_selective_copying.py --collect  # the runs as they stand
    python experiments/probe_selective_copying.py --smoke    # tiny, for CI
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _study_utils as su  # noqa: E402

FULL = dict(mixers=("mamba", "s4d"), seq_len=128, num_tokens=4, batch=32, d_model=64,
            lr=3e-3, short_conv=3, steps=2000, warmup=50, eval_every=50, log_every=25,
            eval_batches=4, test_batches=8, test_batch=64)
SMOKE = dict(FULL, mixers=("mamba", "s4d"), seq_len=32, num_tokens=2, batch=8, d_model=16,
             steps=10, warmup=2, eval_every=5, log_every=5, eval_batches=1, test_batches=1,
             test_batch=8)
PAPER = dict(seq_len=4096, num_tokens=16, batch=64, steps=400_000)


def point_name(mixer: str, size: dict) -> str:
  return f"{mixer}-T{size['seq_len']}-N{size['num_tokens']}"


def command(mixer: str, size: dict, workdir: str) -> list[str]:
  """The trainer's command line for one run (the flags fix the run: rerunning resumes)."""
  s = size
  flags = {"model.mixer": mixer, "data.seq_len": s["seq_len"],
           "data.num_tokens": s["num_tokens"], "data.batch_size": s["batch"],
           "model.d_model": s["d_model"], "optim.lr": s["lr"], "optim.schedule": "constant",
           "train.steps": s["steps"], "optim.warmup_steps": s["warmup"],
           "train.eval_every": s["eval_every"], "train.log_every": s["log_every"],
           "train.eval_batches": s["eval_batches"], "train.checkpoint_every": s["eval_every"],
           "model.short_conv": s["short_conv"], "train.early_stop_metric": "accuracy",
           "train.early_stop_value": 0.99}
  return ([sys.executable, "-m", "linear_attention.main",
           "--config=configs/selective_copying.py:size=small", f"--workdir={workdir}", "--quiet"]
          + [f"--config.{k}={v}" for k, v in flags.items()])


def main() -> int:
  t0 = time.time()
  p = su.study_args(__doc__, "synthetic")
  p.add_argument("--mixers", default=None, help="comma-separated (default: mamba,s4d)")
  args = p.parse_args()
  size = dict(SMOKE if args.smoke else FULL)
  size["steps"] = su.scaled_steps(size["steps"], args)
  mixers = args.mixers.split(",") if args.mixers else list(size["mixers"])
  root = args.runs or os.path.join(su.REPO_ROOT, "runs", "studies",
                                   "selective_copying_probe" + ("-smoke" if args.smoke else ""))
  os.makedirs(root, exist_ok=True)
  env = dict(os.environ, PYTHONPATH=su.REPO_ROOT)
  # One XLA thread per run: small models scale poorly across threads (as train_grid does).
  env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false").strip()

  from linear_attention.train import metrics, results
  runs = []
  for m in mixers:
    wd = os.path.join(root, point_name(m, size))
    if not args.collect and not os.path.exists(os.path.join(wd, "final_metrics.json")):
      # A run stopped by SIGTERM (exit 3) saved a checkpoint: it is reported as stopped.
      rc = subprocess.run(command(m, size, wd), cwd=su.REPO_ROOT, env=env).returncode
      if rc not in (0, 3):
        raise RuntimeError(f"training {wd} exited with status {rc}; its log says why.")
    curve = [{k: r[k] for k in ("step", "loss", "accuracy")}
             for r in metrics.read_metrics(wd, "validation")]
    run = {"mixer": m, "workdir": wd, "validation_curve": curve,
           "train_curve": [{k: r[k] for k in ("step", "loss", "accuracy", "elapsed") if k in r}
                           for r in metrics.read_metrics(wd, "train")]}
    if not curve:
      run["status"] = "not run"
      runs.append(run)
      continue
    finished = os.path.exists(os.path.join(wd, "final_metrics.json"))
    res = results.evaluate_checkpoint(wd, {"batch_size": size["test_batch"]},
                                      num_batches=size["test_batches"], split="test")
    n = size["test_batch"] * size["test_batches"] * size["num_tokens"]
    run.update(status="done" if finished else "stopped", step=res["step"],
               test_accuracy=res["accuracy"], test_tokens=n,
               test_se=su.binomial_se(res["accuracy"], n),
               train_sequences=res["step"] * size["batch"])
    if not finished:
      run["stopped_at"] = res["step"]
    runs.append(run)
    print(f"selective copying T={size['seq_len']} N={size['num_tokens']} {m:>8}: step "
          f"{res['step']}, test accuracy {res['accuracy']:.3f} +- {run['test_se']:.3f} "
          f"({n} tokens){'' if finished else ' (stopped part-way)'}", flush=True)

  out = {"probe": "selective_copying", "config": {"smoke": args.smoke, **size},
         "chance": 1 / 14, "paper": PAPER, "elapsed_s": time.time() - t0,
         "environment": su.environment(shared_machine=True), "runs": runs}
  su.write_json(os.path.join(args.out, "selective_copying_probe.json"), su.portable(out))
  return 0


if __name__ == "__main__":
  sys.exit(main())
