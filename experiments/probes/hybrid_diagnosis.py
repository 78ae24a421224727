"""Why the Mamba-2 hybrid ``SSSA`` learned MQAR so slowly: the diagnosis runs of the hybrid study.

``study_hybrid.py`` found the hybrid with its softmax layer last (``SSSA``) at 0.031 after 500
steps of MQAR (T=128, 8 pairs, vocabulary 8192, width 64), barely above pure Mamba-2, while
pure softmax (``AAAA``) solved it. Each run here changes one thing of that setting (same data,
optimiser, short convolution before every mixer, early stopping at 0.99; MLP ratio 2 for
every model instead of the study's parameter matching) and is read by its learning curve and
by where its attention layers look (``study_hybrid.value_slot_attention``: the best head's
mean weight from a query to its key's value slot; about 0.9 once a one-layer lookup has
formed). Hypotheses and their runs:

* one attention layer alone learns the lookup (``A``, one layer);
* the Mamba-2 output scale (its gated RMSNorm makes each layer add an O(1) vector to a
  residual stream whose embeddings have rms 0.125) drowns the tokens (``SSSA_nonorm``);
* a GLA stack (Zoology's and Based's choice) instead of Mamba-2 (``GGGA``);
* the attention layer's place: first, where it reads the embeddings (``study_hybrid.py``'s
  ``ASSS`` point), against last.

Found (``diagnosis.json``; the study's table has ``ASSS``): the place decides. One softmax
layer alone solves the task (0.97 at step 300) and ``ASSS`` learns as fast as ``AAAA``, whose
first layer does the lookup; ``SSSA``'s last layer never forms it in 1000 steps (its attention
on the queried value slot stays near 0.10, about one eighth: the value slots, not the one
queried), and its accuracy creeps to about 0.1. Neither the Mamba-2 output scale nor Mamba-2
itself is the cause as far as the shorter runs reach.

Runs were stopped by hand once they had answered (the time on the shared cores was the
budget); each is reported at its newest checkpoint with ``stopped_at``.

    python experiments/probes/hybrid_diagnosis.py --train A1 --runs DIR   # train one (resumes)
    python experiments/probes/hybrid_diagnosis.py --runs DIR              # collect -> diagnosis.json
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "studies"))
import _study_utils as su  # noqa: E402
import study_hybrid  # noqa: E402

# name -> its design; "from": a study run (under --study-runs) copied and trained on.
RUNS = {
    "A1": dict(pattern="A", num_layers=1, steps=600, mlp_ratio=2.0, flags=(),
               hypothesis="one softmax layer alone (+ conv, + MLP)"),
    "SSSA_nonorm": dict(pattern="SSSA", num_layers=4, steps=400, mlp_ratio=2.0,
                        flags=("--config.model.mixer_kwargs.mamba2.norm=False",),
                        hypothesis="Mamba-2 without its gated RMSNorm: mixer output rms 0.05 "
                                   "at init instead of 1.0"),
    "GGGA": dict(pattern="GGGA", num_layers=4, steps=400, mlp_ratio=2.0, flags=(),
                 hypothesis="GLA instead of Mamba-2 (a Zoology/Based-style hybrid)"),
    "SSSA_1000": dict(pattern="SSSA", num_layers=4, steps=1000, mlp_ratio=1.25, flags=(),
                      start="mqar/000-pattern=SSSA,mlp_ratio=1.25",
                      hypothesis="the study's SSSA run (500 steps) trained on to 1000: does "
                                 "it only need more steps?"),
}
MQAR = dict(seq_len=128, num_kv_pairs=8, vocab=8192, batch=64, d_model=64, num_heads=2,
            short_conv=3, lr=3e-3, warmup=50)


def command(name: str, workdir: str) -> list[str]:
  """The trainer's command line of run ``name``."""
  r, m = RUNS[name], MQAR
  return [sys.executable, "-m", "linear_attention.main", "--config=configs/mqar.py:size=small",
          f"--workdir={workdir}", "--quiet", f"--config.data.vocab_size={m['vocab']}",
          "--config.data.random_non_queries=False", f"--config.data.batch_size={m['batch']}",
          f"--config.data.seq_len={m['seq_len']}", f"--config.data.num_kv_pairs={m['num_kv_pairs']}",
          f"--config.model.d_model={m['d_model']}", f"--config.model.num_layers={r['num_layers']}",
          f"--config.model.num_heads={m['num_heads']}", f"--config.model.short_conv={m['short_conv']}",
          f"--config.optim.lr={m['lr']}", "--config.optim.schedule=constant",
          f"--config.train.steps={r['steps']}", f"--config.optim.warmup_steps={m['warmup']}",
          "--config.train.eval_every=100", "--config.train.log_every=25",
          "--config.train.eval_batches=2", "--config.train.checkpoint_every=100",
          "--config.train.early_stop_metric=accuracy", "--config.train.early_stop_value=0.99",
          f"--config.model.pattern={r['pattern']}", f"--config.model.mlp_ratio={r['mlp_ratio']}",
          *r["flags"]]


def stopped_early(workdir: str) -> bool:
  """Whether the trainer ended the run itself at the early-stopping accuracy."""
  final = su.read_json(os.path.join(workdir, "final_metrics.json")) or {}
  return bool(final.get("stopped_early"))


def collect(runs: str) -> list[dict]:
  """One row per run found under ``runs``: curves, newest step, value-slot attention."""
  from linear_attention.train import checkpoint, metrics
  rows = []
  for name, design in RUNS.items():
    wd = os.path.join(runs, name)
    step = checkpoint.newest_step_on_disk(wd)
    if not step:
      rows.append({"name": name, "status": "not run"})
      continue
    keep = ("step", "loss", "accuracy")
    curves = {s: [{k: r[k] for k in keep if k in r} for r in metrics.read_metrics(wd, s)]
              for s in ("train", "validation")}
    rows.append({"name": name, **design, "stopped_at": step,
                 "status": "done" if step >= design["steps"] or stopped_early(wd) else "stopped",
                 "value_slot_attention": study_hybrid.value_slot_attention(wd),
                 "train_curve": curves["train"], "validation_curve": curves["validation"]})
  return rows


def main() -> int:
  p = argparse.ArgumentParser(description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--runs", default=os.path.join(su.REPO_ROOT, "runs", "hybrid-diagnosis"),
                 help="one folder per run")
  p.add_argument("--study-runs", default=os.path.join(su.REPO_ROOT, "runs", "studies", "hybrid"),
                 help="study_hybrid.py's --runs folder (where a run that starts from a study "
                      "run copies it from)")
  p.add_argument("--train", choices=sorted(RUNS), help="train this run (resumes), then exit")
  p.add_argument("--out", default=os.path.join(su.FULL_RESULTS, "hybrid"),
                 help="folder of diagnosis.json (default: runs/results/studies/hybrid; the "
                      "committed one only when named: --out results/studies/hybrid)")
  args = p.parse_args()
  if args.train:
    wd = os.path.join(args.runs, args.train)
    start = RUNS[args.train].get("start")
    if start and not os.path.exists(wd):  # trains on from the study run's last checkpoint
      shutil.copytree(os.path.join(args.study_runs, start), wd)
      os.remove(os.path.join(wd, "final_metrics.json"))
    os.makedirs(wd, exist_ok=True)
    return subprocess.call(command(args.train, wd), cwd=su.REPO_ROOT)
  rows = collect(args.runs)
  su.write_json(os.path.join(args.out, "diagnosis.json"), su.portable(
      {"study": "hybrid_diagnosis", "mqar": MQAR, "runs": rows,
       "environment": su.environment(shared_machine=True)}))
  for r in rows:
    last = (r.get("validation_curve") or [{}])[-1]
    print(f"{r['name']:12s} {r['status']:8s} step {r.get('stopped_at')}  val acc "
          f"{last.get('accuracy')}  value-slot attention {r.get('value_slot_attention')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
