"""The delta-rule family's chunk form against its own recurrent form on this backend.

Issue 27 item 5: the chunk form should be at least as fast as the recurrent form, forward
and forward+backward, and the default ``form`` never the slower one. For Gated DeltaNet
(the delta engine, a scalar gate), KDA, RWKV-7 and Gated DeltaProduct with 2 steps a token
(the DPLR engine, per-channel decays), each form is timed at each T in one process, with
the inputs and shapes of ``experiments/bench/cases.py`` (B=1, H=4, K=V=64, float32), so
every ratio compares calls made under the same machine load; the machine's float32
2048^2 matmul rate is measured in the same run. ``default`` is the op called without
``form`` (what a model gets); the chunk form runs at each op's default ``chunk_size`` unless
``--chunk`` is given. Each call's wall time and process CPU time (``time.process_time``) are
recorded; the table printed at the end is in CPU time, the fair measure of a one-thread
process on a shared machine (wall time there includes waiting for a core).

  python experiments/bench/bench_delta_forms.py                       # T = 1k, 4k, 16k
  python experiments/bench/bench_delta_forms.py --seq_lens 1024 --variants kda --chunk 32
  # one core (XLA_FLAGS are recorded in the JSON). Every flag with its "--": a bare
  # "intra_op_parallelism_threads=1" made XLA drop the flags after it, among them the
  # --xla_cpu_experimental_ynn_fusion_type= the package adds, and the chunk form's
  # backward then segfaulted in a YNNPACK fusion (jaxlib 0.10.2, seen here):
  XLA_FLAGS="--xla_cpu_multi_thread_eigen=false" python experiments/bench/bench_delta_forms.py
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [ROOT, os.path.join(ROOT, "experiments")]  # the package, configs/, bench/

import linear_attention  # noqa: E402,F401  first: its XLA flags need a backend not yet started
import jax  # noqa: E402

from experiments import outputs  # noqa: E402
from bench.cases import CASES, Dims  # noqa: E402
from bench.measure import grad_fn, matmul_gflops, time_calls  # noqa: E402

from linear_attention import ops  # noqa: E402
from linear_attention.io import write_json  # noqa: E402
from linear_attention import common  # noqa: E402
from linear_attention.ops import delta, dplr  # noqa: E402

VARIANTS = ("gated_deltanet", "kda", "rwkv7", "gated_deltaproduct")
FORMS = ("chunk", "recurrent", "default")  # "default": the op called without form


def _case(variant: str, form: str, own_chunk: bool):
  """The bench case of ``variant`` in ``form``; ``default`` drops the ``form`` and
  ``chunk_size`` arguments, ``own_chunk`` the ``chunk_size`` (the op's default length)."""
  case = CASES[f"{variant}_{'chunk' if form == 'default' else form}"]
  drop = ("form", "chunk_size") if form == "default" else ("chunk_size",) if own_chunk else ()
  return dataclasses.replace(case, kwargs={k: v for k, v in case.kwargs.items() if k not in drop})


def default_chunk(variant: str) -> int:
  """The ``chunk_size`` the op of ``variant`` uses when called without it on this backend."""
  default = inspect.signature(getattr(ops, CASES[f"{variant}_chunk"].op)).parameters
  return dplr.resolve_chunk_size(default["chunk_size"].default)


def default_form(variant: str) -> tuple[str, str]:
  """``(values form, gradient form)`` the op of ``variant`` runs when called without ``form``
  on this backend (``form="auto"`` may pair two, ``common.with_gradient_of``)."""
  default = inspect.signature(getattr(ops, CASES[f"{variant}_chunk"].op)).parameters["form"]
  if variant == "gated_deltanet":
    return common.resolve_auto_form(default.default, delta.DEFAULT_FORMS)
  return dplr.resolve_form(default.default, 2 if variant == "gated_deltaproduct" else 1)


def time_forms(variant: str, forms, t: int, dims: Dims, repeats: int, own_chunk: bool) -> dict:
  """``{form: [best fwd s, best fwd+bwd s, best fwd CPU s, best fwd+bwd CPU s]}``, compiled
  ahead of time; CPU seconds are the process's (``time.process_time``, all threads).

  The calls are interleaved (each round times every form once, after one warm-up round), so
  on a shared machine a burst of load hits all forms alike rather than one, and the order
  rotates each round: a call timed right after the chunk form measured up to 2x slower
  (Gated DeltaProduct's scan, 116 against 50 ms forward at 4k in one run, the same program),
  so a fixed order biased the comparison.
  """
  fns = {}
  for form in forms:
    fn, args, argnums = _case(variant, form, own_chunk).build(t, dims, jax.random.PRNGKey(t))
    args = jax.block_until_ready(args)
    fns[form] = (args, jax.jit(fn).lower(*args).compile(),
                 jax.jit(grad_fn(fn, argnums)).lower(*args).compile())
  best = {form: [float("inf")] * 4 for form in forms}
  order = list(fns)
  for round_ in range(repeats + 1):
    shift = round_ % len(order)
    for form in order[shift:] + order[:shift]:
      args, *compiled = fns[form]
      for i, f in enumerate(compiled):
        wall, cpu = time_calls(f, *args, repeats=1, warmup=False)
        if round_:  # the first round warms up
          best[form][i] = min(best[form][i], wall)
          best[form][i + 2] = min(best[form][i + 2], cpu)
  return best


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--seq_lens", default="1024,4096,16384", help="comma-separated lengths")
  p.add_argument("--variants", default=",".join(VARIANTS))
  p.add_argument("--forms", default="chunk,recurrent,default",
                 help=f"of {FORMS}; without 'default', the default call's times are read off "
                 "the forms it resolves to (default_form in the JSON: values/gradient)")
  p.add_argument("--chunk", type=int, default=None,
                 help="chunk_size of the chunk form (default: each op's own default)")
  p.add_argument("--repeats", type=int, default=3, help="timed calls per case (best kept)")
  outputs.add_out(p, "bench_delta_forms_cpu.json")
  a = p.parse_args(argv)
  lens = [int(x) for x in a.seq_lens.split(",")]
  forms = a.forms.split(",")
  dims = Dims() if a.chunk is None else Dims(chunk=a.chunk)

  mm = matmul_gflops()
  rows = []
  for variant in a.variants.split(","):
    for t in lens:
      row = dict(variant=variant, T=t,
                 chunk_size=default_chunk(variant) if a.chunk is None else a.chunk)
      for form, (f, fb, fc, fbc) in time_forms(variant, forms, t, dims,
                                               a.repeats,
                                               a.chunk is None).items():
        row[f"{form}_fwd_s"], row[f"{form}_fwdbwd_s"] = f, fb
        row[f"{form}_fwd_cpu_s"], row[f"{form}_fwdbwd_cpu_s"] = fc, fbc
        print(f"{variant} T={t} {form}: fwd {f*1e3:.1f} ms (CPU {fc*1e3:.1f}), fwd+bwd "
              f"{fb*1e3:.1f} ms (CPU {fbc*1e3:.1f})", flush=True)
      values, gradient = default_form(variant)
      row["default_form"] = values if values == gradient else f"{values}/{gradient}"
      for part in ("fwd", "fwdbwd", "fwd_cpu", "fwdbwd_cpu"):
        form = gradient if part.startswith("fwdbwd") else values
        if f"{form}_{part}_s" in row and "default" not in forms:
          row[f"default_{part}_s"] = row[f"{form}_{part}_s"]
        if "default" in forms and "chunk" in forms and "recurrent" in forms:
          # <= 1 (up to timing noise): the default call is as fast as the faster named form.
          row[f"{part}_default_over_best"] = row[f"default_{part}_s"] / min(
              row[f"chunk_{part}_s"], row[f"recurrent_{part}_s"])
        if "chunk" in forms and "recurrent" in forms:
          # > 1: the chunk form is faster.
          row[f"{part}_recurrent_over_chunk"] = row[f"recurrent_{part}_s"] / row[f"chunk_{part}_s"]
      rows.append(row)

  out = dict(machine=platform.processor() or platform.machine(), cpus=os.cpu_count(),
             backend=jax.default_backend(), jax=jax.__version__, matmul_gflops=mm,
             xla_flags=os.environ.get("XLA_FLAGS", ""),
             omp_num_threads=os.environ.get("OMP_NUM_THREADS", ""),
             B=dims.B, H=dims.H, D=dims.D, chunk=a.chunk or "each op's default", dtype="float32",
             repeats=a.repeats, rows=rows, time=time.strftime("%Y-%m-%d %H:%M:%S"))
  write_json(a.out, out)
  print(f"\nmatmul {mm:.1f} GFLOP/s (2048^2 float32, same run); B={dims.B} H={dims.H} "
        f"D={dims.D} chunk={out['chunk']}; XLA_FLAGS={out['xla_flags']!r}")
  # Process CPU seconds: under load, the fair measure of a one-thread process.
  nan = float("nan")
  for unit, cpu in (("wall", ""), ("CPU", "_cpu")):
    print(f"\n{'variant':20s} {'T':>6s} {'C':>3s} | {'fwd chunk':>9s} {'rec':>8s} {'default':>8s} | "
          f"{'f+b chunk':>9s} {'rec':>8s} {'default':>8s} | default form  ({unit} ms)")
    for r in rows:
      g = lambda k: r.get(k, nan) * 1e3
      print(f"{r['variant']:20s} {r['T']:6d} {r['chunk_size']:3d} | {g(f'chunk_fwd{cpu}_s'):9.1f} "
            f"{g(f'recurrent_fwd{cpu}_s'):8.1f} {g(f'default_fwd{cpu}_s'):8.1f} | "
            f"{g(f'chunk_fwdbwd{cpu}_s'):9.1f} {g(f'recurrent_fwdbwd{cpu}_s'):8.1f} "
            f"{g(f'default_fwdbwd{cpu}_s'):8.1f} | {r['default_form']}")
  print(f"wrote {a.out}")


if __name__ == "__main__":
  main()
