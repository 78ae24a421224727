"""Training throughput (tokens/s) of a language model per mixer and sequence length.

Default: a 4-layer, d_model-256 byte-level LM (random tokens) at T=512 and T=4096 for
softmax, gla, mamba2 and hawk, one jitted AdamW step (the trainer's own step) timed after
compilation. Writes JSON under ``--results`` and prints a table with ratios vs softmax.

  python experiments/bench/bench_train.py                      # the full setting (an accelerator)
  python experiments/bench/bench_train.py --seq_lens=64 --batch_tokens=512 --d_model=32 \\
      --num_layers=1 --steps=2                           # a quick check on CPU

``--small``: the studies' models (``configs/mqar.py:size=small``, d 64, 2 layers, vocab
8192, batch 64, ``model.short_conv=3``; T=64 with 4 pairs, T=256 with 16) trained through
``trainer.train_and_evaluate`` itself, so host work (data, dispatch, metrics) counts. Each
variant (``before``: one step per dispatch and ``jnp.argmax``, the trainer before the fused
loop; ``after``: ``steps_per_dispatch=10``; ``no_gather``: ``before`` with logits at every
position) runs in turn inside each repetition, and the table gives medians. XLA runs on one
core (``--xla_cpu_multi_thread_eigen=false``), as the studies' workers do.

  python experiments/bench/bench_train.py --small --reps=3     # before/after, softmax gla mamba2 deltanet
  python experiments/bench/bench_train.py --small --task=induction_heads --seq_lens=256
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # the package, configs/ and experiments/

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from experiments import outputs  # noqa: E402
from linear_attention import models  # noqa: E402
from linear_attention.io import write_json  # noqa: E402
from linear_attention.nn import registry  # noqa: E402
from linear_attention.train import optim, trainer  # noqa: E402


def bench_one(mixer: str, seq_len: int, batch: int, d_model: int, num_layers: int,
              num_heads: int, steps: int, dtype: str, vocab: int = 256) -> dict:
  """Tokens/s of ``steps`` timed train steps (after one warm-up step that compiles)."""
  mcfg = dict(mixer=mixer, pattern="", d_model=d_model, num_layers=num_layers,
              num_heads=num_heads, mlp_ratio=8 / 3, tie_embeddings=True, mixer_kwargs={},
              pooling="mean", dtype=dtype)
  model = trainer.create_model(mcfg, vocab, "lm", None, seed=0)
  ocfg = dict(lr=1e-3, warmup_steps=10, final_lr_ratio=0.1, weight_decay=0.1, b1=0.9,
              b2=0.95, eps=1e-8, clip_norm=1.0)
  opt = optim.make_optimizer(model, ocfg, total_steps=steps + 1)
  graphdef, state = nnx.split((model, opt))
  train_fn, _ = trainer._make_steps(graphdef, "lm", None, None, None)
  rng = np.random.default_rng(0)
  toks = rng.integers(0, vocab, (batch, seq_len + 1)).astype(np.int32)
  b = {"inputs": jax.numpy.asarray(toks[:, :-1]), "targets": jax.numpy.asarray(toks[:, 1:]),
       "mask": jax.numpy.ones((batch, seq_len), np.float32)}
  t0 = time.perf_counter()
  state, m = train_fn(state, b)
  jax.block_until_ready(m["loss"])
  compile_s = time.perf_counter() - t0
  t0 = time.perf_counter()
  for _ in range(steps):
    state, m = train_fn(state, b)
  jax.block_until_ready(m["loss"])
  dt = (time.perf_counter() - t0) / steps
  return {"mixer": mixer, "seq_len": seq_len, "batch": batch, "step_s": dt,
          "tokens_per_s": batch * seq_len / dt, "compile_s": compile_s,
          "loss": float(m["loss"]), "num_params": models.count_params(model)}


# ----------------------------------------------------------------------------- --small


# The studies' models: configs/mqar.py:size=small (d 64, 2 layers, vocab 8192, batch 64) with
# the MQAR study's overrides, at T=64 (4 pairs) and T=256 (16 pairs).
SMALL_PAIRS = {64: 4, 128: 8, 256: 16}
# Log windows of 10 steps (a multiple of the fused length); the first window, which follows
# the compiling dispatch, is left out of the medians.
SMALL_LOG_EVERY = 10

# What each variant sets: ``steps_per_dispatch``, whether the loss head is gathered at the
# scored positions, and whether accuracy uses ``jnp.argmax`` (the trainer before the fused
# loop) or the trainer's max + first-index form.
VARIANTS = {
    "before": dict(steps_per_dispatch=1, gather=True, argmax=True, prefetch=True),
    "no_gather": dict(steps_per_dispatch=1, gather=False, argmax=True, prefetch=True),
    "after": dict(steps_per_dispatch=10, gather=True, argmax=False, prefetch=True),
    # ``after`` with the batches made on the main thread: on a loaded machine a second thread
    # also buys a larger share of the CPU, which this variant leaves out.
    "after_no_prefetch": dict(steps_per_dispatch=10, gather=True, argmax=False, prefetch=False),
}


def small_config(task: str, mixer: str, seq_len: int, steps: int, log_every: int):
  """The study config of ``task`` at ``seq_len`` for ``steps`` steps, logging every
  ``log_every`` (evaluation and checkpoints only at the end, outside the timed windows)."""
  if task == "mqar":
    from configs import mqar as mod
    cfg = mod.get_config(f"mixer={mixer},size=small")
    cfg.data.num_kv_pairs = SMALL_PAIRS.get(seq_len, seq_len // 16)
    cfg.model.short_conv = 3
  else:
    import importlib
    mod = importlib.import_module(f"configs.{task}")
    cfg = mod.get_config(f"mixer={mixer},size=small")
  cfg.data.seq_len = seq_len
  cfg.train.steps, cfg.train.log_every = steps, log_every
  cfg.train.eval_every, cfg.train.checkpoint_every, cfg.train.eval_batches = 0, 0, 1
  cfg.mesh.data = 1
  return cfg


def run_small(task: str, mixer: str, seq_len: int, variant: str, steps: int, log_every: int,
              workdir: str) -> dict:
  """Trains ``steps`` steps through ``trainer.train_and_evaluate`` and returns the median
  tokens/s of the log windows after the first (the first holds the compilation's dispatch)."""
  import contextlib
  import shutil

  import jax.numpy as jnp

  from linear_attention import data
  from linear_attention.train import metrics as metrics_lib

  v = VARIANTS[variant]
  cfg = small_config(task, mixer, seq_len, steps, log_every)
  cfg.train.steps_per_dispatch = v["steps_per_dispatch"]
  ds = data.make_dataset(cfg.data)
  if not v["gather"]:
    ds.max_targets_per_row = None  # logits at every position
  shutil.rmtree(workdir, ignore_errors=True)
  patch = contextlib.nullcontext()
  if v["argmax"]:
    patch = _patched(trainer, "first_argmax", lambda logits: jnp.argmax(logits, -1))
  host = original = trainer._HostBatches
  if not v["prefetch"]:
    host = lambda ds, chunk_end, prefetch: original(ds, chunk_end, False)
  t0 = time.perf_counter()
  with patch, _patched(trainer, "_HostBatches", host):
    final = trainer.train_and_evaluate(cfg, workdir, dataset=ds, verbose=False)
  wall = time.perf_counter() - t0
  windows = [r["tokens_per_s"] for r in metrics_lib.read_metrics(workdir, "train")][1:]
  shutil.rmtree(workdir, ignore_errors=True)
  return {"task": task, "mixer": mixer, "seq_len": seq_len, "variant": variant,
          "batch": ds.batch_size, "steps": steps, "tokens_per_s": float(np.median(windows)),
          "windows_tokens_per_s": windows, "run_wall_s": wall,
          "train_loss": final.get("train_loss"), "load_avg": os.getloadavg()}


class _patched:
  """Sets ``obj.name = value`` for the duration of a ``with`` block."""

  def __init__(self, obj, name, value):
    self.obj, self.name, self.value = obj, name, value

  def __enter__(self):
    self.old = getattr(self.obj, self.name)
    setattr(self.obj, self.name, self.value)

  def __exit__(self, *exc):
    setattr(self.obj, self.name, self.old)


def main_small(a) -> None:
  """``--small``: the studies' models, the variants interleaved (in turn, the order reversed
  every other repetition), medians."""
  import tempfile
  mixers, lens = a.mixers.split(","), [int(x) for x in a.seq_lens.split(",")]
  variants = a.variants.split(",")
  for v in variants:
    if v not in VARIANTS:
      raise ValueError(f"--variants must name entries of {list(VARIANTS)}, got {v!r}.")
  tmp = tempfile.mkdtemp(prefix="bench_train_")
  # Repetitions compile the same programs again: keep the executables between runs.
  jax.config.update("jax_compilation_cache_dir", os.path.join(tmp, "xla_cache"))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  load_start = os.getloadavg()
  rows = []
  for rep in range(a.reps):  # variants interleaved inside each repetition: drift hits both
    for t in lens:
      steps = max(a.steps or 30, 2 * SMALL_LOG_EVERY)
      for mx in mixers:
        for v in (variants if rep % 2 == 0 else variants[::-1]):  # ABBA: drift cancels
          r = run_small(a.task, mx, t, v, steps, SMALL_LOG_EVERY, os.path.join(tmp, "run"))
          r["rep"] = rep
          rows.append(r)
          print(f"rep {rep} {a.task} {mx:>8} T={t:<4} {v:>9} {r['tokens_per_s']:>10,.0f} tok/s "
                f"(load {r['load_avg'][0]:.1f})", flush=True)
  table = []
  for t in lens:
    for mx in mixers:
      med = {v: float(np.median([r["tokens_per_s"] for r in rows if r["mixer"] == mx
                                 and r["seq_len"] == t and r["variant"] == v]))
             for v in variants}
      table.append({"mixer": mx, "seq_len": t, **{f"{v}_tokens_per_s": med[v] for v in variants},
                    "speedup": (med["after"] / med["before"]
                                if "after" in med and "before" in med else None)})
  head = f"{'mixer':>8} {'T':>4} " + " ".join(f"{v + ' tok/s':>17}" for v in variants)
  print(f"\n{a.task}, median of {a.reps} interleaved repetitions "
        f"(load avg {load_start[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end)")
  print(head + f" {'after/before':>12}")
  for r in table:
    sp = f"{r['speedup']:.2f}x" if r["speedup"] else "-"
    print(f"{r['mixer']:>8} {r['seq_len']:>4} "
          + " ".join(f"{r[v + '_tokens_per_s']:>17,.0f}" for v in variants) + f" {sp:>12}")
  os.makedirs(a.results, exist_ok=True)
  out = os.path.join(a.results, f"bench_train_small_{a.task}_{jax.default_backend()}.json")
  write_json(out, {"args": vars(a), "backend": jax.default_backend(), "jax": jax.__version__,
                   "host": platform.node(), "cpu_count": os.cpu_count(),
                   "xla_flags": os.environ.get("XLA_FLAGS", ""), "variants": VARIANTS,
                   "load_avg_start": load_start, "load_avg_end": os.getloadavg(),
                   "table": table, "rows": rows})
  print(f"wrote {out}")


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--small", action="store_true", help="the studies' small models, before/after")
  p.add_argument("--task", default="mqar", help="--small: mqar, induction_heads, selective_copying")
  p.add_argument("--variants", default="before,after",
                 help=f"--small: a comma list of {list(VARIANTS)}")
  p.add_argument("--reps", type=int, default=3, help="--small: interleaved repetitions")
  p.add_argument("--mixers", default=None,
                 help="default: the registry's bench_train mixers (--small: softmax, gla, "
                 "mamba2, deltanet)")
  p.add_argument("--seq_lens", default=None, help="default 512,4096 (--small: 64,256)")
  p.add_argument("--batch_tokens", type=int, default=32768, help="batch = batch_tokens // T")
  p.add_argument("--d_model", type=int, default=256)
  p.add_argument("--num_layers", type=int, default=4)
  p.add_argument("--num_heads", type=int, default=4)
  p.add_argument("--steps", type=int, default=None,
                 help="timed steps (default 10; --small: 30 per run, logged every 10)")
  p.add_argument("--dtype", default="float32", choices=sorted(trainer.DTYPES))
  outputs.add_out(p, "", flag="--results", what="output folder")
  a = p.parse_args()
  if a.small:
    a.mixers = a.mixers or "softmax,gla,mamba2,deltanet"
    a.seq_lens = a.seq_lens or "64,256"
    # One core per process, as the studies' workers run; set before the backend starts.
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_multi_thread_eigen" not in flags:
      os.environ["XLA_FLAGS"] = (flags + " --xla_cpu_multi_thread_eigen=false").strip()
    return main_small(a)
  a.mixers = a.mixers or ",".join(registry.select(study="bench_train"))
  a.seq_lens, a.steps = a.seq_lens or "512,4096", a.steps or 10
  mixers = a.mixers.split(",")
  rows = []
  for t in [int(x) for x in a.seq_lens.split(",")]:
    batch = max(a.batch_tokens // t, 1)
    for mx in mixers:
      r = bench_one(mx, t, batch, a.d_model, a.num_layers, a.num_heads, a.steps, a.dtype)
      rows.append(r)
      print(f"{mx:>8} T={t:<6} {r['tokens_per_s']:>12,.0f} tok/s  (compile {r['compile_s']:.1f}s)",
            flush=True)
  base = {r["seq_len"]: r["tokens_per_s"] for r in rows if r["mixer"] == "softmax"}
  for r in rows:
    r["ratio_vs_softmax"] = r["tokens_per_s"] / base[r["seq_len"]] if r["seq_len"] in base else None
  print(f"\n{'mixer':>8} {'T':>6} {'tokens/s':>12} {'vs softmax':>10}")
  for r in rows:
    ratio = f"{r['ratio_vs_softmax']:.2f}x" if r["ratio_vs_softmax"] else "-"
    print(f"{r['mixer']:>8} {r['seq_len']:>6} {r['tokens_per_s']:>12,.0f} {ratio:>10}")
  out = os.path.join(a.results, f"bench_train_{jax.default_backend()}.json")
  write_json(out, {"args": vars(a), "backend": jax.default_backend(),
                   "device": str(jax.devices()[0]), "jax": jax.__version__,
                   "host": platform.node(), "rows": rows})
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
