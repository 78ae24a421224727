"""The delta-rule family's chunk form against its own recurrent form on this backend.

Issue 27 item 5: the chunk form should be at least as fast as the recurrent form, forward
and forward+backward, and the default ``form`` never the slower one. For Gated DeltaNet
(the delta engine, a scalar gate), KDA, RWKV-7 and Gated DeltaProduct with 2 steps a token
(the DPLR engine, per-channel decays), each form is timed at each T in one process, with
the inputs and shapes of ``experiments/bench/cases.py`` (B=1, H=4, K=V=64, float32), so
every ratio compares calls made under the same machine load; the machine's float32
2048^2 matmul rate is measured in the same run. ``default`` is the op called without
``form`` (what a model gets).

  python experiments/bench_delta_forms.py                       # T = 1k, 4k, 16k
  python experiments/bench_delta_forms.py --seq_lens 1024 --variants kda --chunk 32
  # one core (XLA_FLAGS and the thread count are recorded in the JSON):
  XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" \\
      python experiments/bench_delta_forms.py --out results/bench_delta_forms_cpu_1core.json
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import platform
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import linear_attention  # noqa: E402,F401  first: its XLA flags need a backend not yet started
import jax  # noqa: E402

from bench.cases import CASES, Dims  # noqa: E402
from bench.measure import grad_fn, matmul_gflops, time_calls  # noqa: E402

from linear_attention import ops  # noqa: E402
from linear_attention.io import write_json  # noqa: E402
from linear_attention.ops import dplr  # noqa: E402

VARIANTS = ("gated_deltanet", "kda", "rwkv7", "gated_deltaproduct")
FORMS = ("chunk", "recurrent", "default")  # "default": the op called without form


def _case(variant: str, form: str):
  """The bench case of ``variant`` in ``form``; ``default`` drops the ``form`` argument."""
  case = CASES[f"{variant}_{'chunk' if form == 'default' else form}"]
  if form == "default":
    case = dataclasses.replace(case, kwargs={k: v for k, v in case.kwargs.items()
                                             if k not in ("form", "chunk_size")})
  return case


def default_form(variant: str) -> str:
  """The form the op of ``variant`` runs when called without ``form`` on this backend."""
  default = inspect.signature(getattr(ops, CASES[f"{variant}_chunk"].op)).parameters["form"]
  return dplr.resolve_form(default.default)


def time_forms(variant: str, forms, t: int, dims: Dims, repeats: int) -> dict:
  """``{form: (best fwd s, best fwd+bwd s)}``, compiled ahead of time.

  The calls are interleaved (each round times every form once, after one warm-up round), so
  on a shared machine a burst of load hits all forms alike rather than one.
  """
  fns = {}
  for form in forms:
    fn, args, argnums = _case(variant, form).build(t, dims, jax.random.PRNGKey(t))
    args = jax.block_until_ready(args)
    fns[form] = (args, jax.jit(fn).lower(*args).compile(),
                 jax.jit(grad_fn(fn, argnums)).lower(*args).compile())
  best = {form: [float("inf")] * 2 for form in forms}
  for round_ in range(repeats + 1):
    for form, (args, *compiled) in fns.items():
      for i, f in enumerate(compiled):
        s = time_calls(f, *args, repeats=1, warmup=False)[0]
        if round_:  # the first round warms up
          best[form][i] = min(best[form][i], s)
  return best


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--seq_lens", default="1024,4096,16384", help="comma-separated lengths")
  p.add_argument("--variants", default=",".join(VARIANTS))
  p.add_argument("--forms", default="chunk,recurrent",
                 help=f"of {FORMS}; the default form's times are also read off the form it "
                 "resolves to (default_form in the JSON)")
  p.add_argument("--chunk", type=int, default=Dims().chunk, help="chunk_size of the chunk form")
  p.add_argument("--repeats", type=int, default=3, help="timed calls per case (best kept)")
  p.add_argument("--out", default="results/bench_delta_forms_cpu.json")
  a = p.parse_args(argv)
  lens = [int(x) for x in a.seq_lens.split(",")]
  forms = a.forms.split(",")
  dims = Dims(chunk=a.chunk)

  mm = matmul_gflops()
  rows = []
  for variant in a.variants.split(","):
    for t in lens:
      row = dict(variant=variant, T=t)
      for form, (f, fb) in time_forms(variant, forms, t, dims,
                                      a.repeats if t < 16384 else 1).items():
        row[f"{form}_fwd_s"], row[f"{form}_fwdbwd_s"] = f, fb
        print(f"{variant} T={t} {form}: fwd {f*1e3:.1f} ms, fwd+bwd {fb*1e3:.1f} ms", flush=True)
      row["default_form"] = default_form(variant)
      for part in ("fwd", "fwdbwd"):
        if f"{row['default_form']}_{part}_s" in row and "default" not in forms:
          row[f"default_{part}_s"] = row[f"{row['default_form']}_{part}_s"]
        if "chunk" in forms and "recurrent" in forms:
          # > 1: the chunk form is faster.
          row[f"{part}_recurrent_over_chunk"] = row[f"recurrent_{part}_s"] / row[f"chunk_{part}_s"]
      rows.append(row)

  out = dict(machine=platform.processor() or platform.machine(), cpus=os.cpu_count(),
             backend=jax.default_backend(), jax=jax.__version__, matmul_gflops=mm,
             xla_flags=os.environ.get("XLA_FLAGS", ""),
             omp_num_threads=os.environ.get("OMP_NUM_THREADS", ""),
             B=dims.B, H=dims.H, D=dims.D, chunk=dims.chunk, dtype="float32",
             repeats=a.repeats, rows=rows, time=time.strftime("%Y-%m-%d %H:%M:%S"))
  write_json(a.out, out)
  print(f"\nmatmul {mm:.1f} GFLOP/s (2048^2 float32, same run); B={dims.B} H={dims.H} "
        f"D={dims.D} chunk={dims.chunk}; XLA_FLAGS={out['xla_flags']!r}")
  print(f"{'variant':20s} {'T':>6s} | {'fwd chunk':>9s} {'rec':>8s} {'rec/ch':>6s} | "
        f"{'f+b chunk':>9s} {'rec':>8s} {'rec/ch':>6s} | default form  (ms)")
  for r in rows:
    g = lambda k: r.get(k, float("nan")) * 1e3
    print(f"{r['variant']:20s} {r['T']:6d} | {g('chunk_fwd_s'):9.1f} {g('recurrent_fwd_s'):8.1f} "
          f"{r.get('fwd_recurrent_over_chunk', float('nan')):6.2f} | {g('chunk_fwdbwd_s'):9.1f} "
          f"{g('recurrent_fwdbwd_s'):8.1f} {r.get('fwdbwd_recurrent_over_chunk', float('nan')):6.2f}"
          f" | {r['default_form']}")
  print(f"wrote {a.out}")


if __name__ == "__main__":
  main()
