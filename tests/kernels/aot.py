"""Deviceless ahead-of-time compilation of every kernel for GPU and TPU targets.

Interpret mode proves a kernel's arithmetic, not that it compiles for the
hardware. This module compiles each kernel case (forward and backward in one
``value_and_grad`` program) for a compile-only device built by
``jax.experimental.topologies.get_topology_desc``, on a host with no GPU or
TPU, and reports per Pallas kernel what the compiler reports: on GPU the
shared memory of each launch (from the XLA dump's thunk sequence) and the
registers and spills (from ``ptxas -v``); on TPU whether Mosaic accepted it.

Needs jax >= 0.11 (Python 3.12) with ``jax-cuda13-plugin``/``jax-cuda13-pjrt``
for the GPU targets (``ptxas`` from the CUDA toolkit on ``PATH``) and ``libtpu``
for the TPU targets; run with ``JAX_PLATFORMS=cpu`` (and ``TPU_SKIP_MDS_QUERY=1``).

Used by ``tests/kernels/test_compile_{gpu,tpu}.py`` and
``experiments/compile_report.py``::

    results = run_target("h200")            # {case name: result dict}
    python -m tests.kernels.aot --target h200 [--cases a,b]

Each target runs in a child process, and the cases one after another in it:
``ptxas`` prints its statistics to the child's stderr, which the parent splits
per case at markers; a Mosaic failure can abort the process, and then the
parent records the crash for that case and starts a new child at the next
case. :func:`run_targets` deals several targets' cases into children that run
concurrently, one a core; libtpu's one-process lock is lifted for them
(``ALLOW_MULTIPLE_LIBTPU_LOAD``), as a compile-only topology holds no chip.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import concurrent.futures
import resource
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Callable

import jax
import jax.numpy as jnp

from linear_attention.engines.decay import pallas as chunk_decay
from linear_attention.engines.delta import pallas as chunk_delta
from linear_attention.engines.dplr import pallas as chunk_dplr
from linear_attention.engines.scan import pallas as scan
from linear_attention.engines.softmax import pallas as flash_attention

# The repository root (this file is tests/kernels/aot.py).
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# ----------------------------------------------------------------------- targets

# GPU facts (NVIDIA's published specifications): compute capability, SM count,
# shared memory per SM and the opt-in maximum per block, registers, clock,
# memory size and bandwidth, L2. H200 has H100's SM (sm_90).
GPU_SPECS = {
    "h200": dict(name="NVIDIA H200", major=9, minor=0, sms=132, smem_per_sm=233472,
                 smem_optin=232448, clock_ghz=1.98, memory=150_000_000_000,
                 bandwidth=4_800_000_000_000, l2=52_428_800),
    "a100": dict(name="NVIDIA A100-SXM4-80GB", major=8, minor=0, sms=108, smem_per_sm=167936,
                 smem_optin=166912, clock_ghz=1.41, memory=85_000_000_000,
                 bandwidth=2_039_000_000_000, l2=41_943_040),
    "b200": dict(name="NVIDIA B200", major=10, minor=0, sms=148, smem_per_sm=233472,
                 smem_optin=232448, clock_ghz=1.965, memory=191_000_000_000,
                 bandwidth=8_000_000_000_000, l2=131_072_000),
}
TPU_TOPOLOGIES = {"v5e": "v5e:2x2", "v6e": "v6e:2x2", "v5p": "v5p:2x2x1"}
TARGETS = tuple(GPU_SPECS) + tuple(TPU_TOPOLOGIES)


def platform_of(target: str) -> str:
  """``"gpu"`` or ``"tpu"``; raises a ValueError naming ``target`` otherwise."""
  if target in GPU_SPECS:
    return "gpu"
  if target in TPU_TOPOLOGIES:
    return "tpu"
  raise ValueError(f"target must be one of {list(TARGETS)}, got {target!r}.")


def gpu_target_config(target: str) -> str:
  """A ``stream_executor.GpuTargetConfigProto`` in text form for ``target``."""
  s = GPU_SPECS[target]
  return f"""gpu_device_info {{
  threads_per_block_limit: 1024
  threads_per_warp: 32
  shared_memory_per_block: 49152
  shared_memory_per_core: {s['smem_per_sm']}
  threads_per_core_limit: 2048
  core_count: {s['sms']}
  fpus_per_core: 128
  block_dim_limit_x: 2147483647
  block_dim_limit_y: 65535
  block_dim_limit_z: 65535
  memory_bandwidth: {s['bandwidth']}
  l2_cache_size: {s['l2']}
  clock_rate_ghz: {s['clock_ghz']}
  device_memory_size: {s['memory']}
  shared_memory_per_block_optin: {s['smem_optin']}
  cuda_compute_capability {{ major: {s['major']} minor: {s['minor']} }}
  registers_per_core_limit: 65536
  registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: 9 minor: 10 patch: 0 }}
device_description_str: "{s['name']}"
"""


def compile_only_device(target: str):
  """A compile-only device for ``target`` (needs the plugin or libtpu)."""
  from jax.experimental import topologies  # pylint: disable=g-import-not-at-top
  if platform_of(target) == "gpu":
    topo = topologies.get_topology_desc(platform="cuda", topology="1x1x1",
                                        target_config=gpu_target_config(target))
  else:
    topo = topologies.get_topology_desc(topology_name=TPU_TOPOLOGIES[target], platform="tpu")
  return topo.devices[0]


# ------------------------------------------------------------------------- cases

# The experiments/gpu_check.py shapes; a small odd one (padding everywhere); and
# "small": the gpu_check tiles (K = V = 128, T a multiple of every block, scan channels
# a multiple of 128: the same Pallas kernel bodies, only the grid is smaller) at a size
# whose TPU compile costs less: chunk_decay per-channel bf16 on v6e 4.9 vs 28.4 CPU s;
# chunk_delta on v5e 43-59 CPU s, where at gpu_check it did not finish in 1200 s (wall,
# 2 loaded cores; 2026-12-03, compile_case's cpu_seconds).
SHAPES = {
    "gpu_check": dict(b=4, t=8192, h=16, k=128, v=128, hkv=16, scan_t=4096, scan_d=(2048,)),
    "odd": dict(b=1, t=333, h=4, k=40, v=72, hkv=2, scan_t=333, scan_d=(3, 40)),
    "small": dict(b=1, t=1024, h=4, k=128, v=128, hkv=2, scan_t=1024, scan_d=(256,)),
}
# The attention head sizes of the families that linear_attention.hub loads (issue 37), for
# flash attention with grouped KV heads: 64 to 256, and MLA's q/k head of 192 with a value
# head of 128 (Kimi Linear; no KV grouping after MLA's up-projection). Triton pads a head to
# a power of two (80 and 96 to 128, 192 to 256); Mosaic takes it as it is.
HEAD_SHAPES = {
    "d64": dict(b=1, t=1024, h=16, k=64, v=64, hkv=4),
    "d80": dict(b=1, t=1024, h=16, k=80, v=80, hkv=4),
    "d96": dict(b=1, t=1024, h=16, k=96, v=96, hkv=2),
    "d128": dict(b=1, t=1024, h=16, k=128, v=128, hkv=2),
    "d192v128": dict(b=1, t=1024, h=16, k=192, v=128, hkv=16),
    "d256": dict(b=1, t=1024, h=16, k=256, v=256, hkv=2),
}
# The delta-rule and DPLR mixers' state shapes of those families: K 128 with V up to 256
# (Qwen3-Next's Gated DeltaNet), H = H_v. Grouped value heads (H_v > H) are a hook: give a
# shape here an "hv" and pass it to the kernels in _delta_case/_dplr_case once they take it.
MIXER_SHAPES = {
    "k128v256": dict(b=1, t=1024, h=4, k=128, v=256, hkv=4),
    # Grouped value heads (Qwen3-Next): q, k with ``hk`` heads, v and the state with ``h``.
    "k128v256g": dict(b=1, t=1024, h=4, hk=2, k=128, v=256, hkv=4),
}
DTYPES = {"bf16": jnp.bfloat16, "f32": jnp.float32}


def shape_of(case_name: str) -> dict:
  """The shape dict of a case name ``kernel/mode/dtype/shape``: :data:`SHAPES`,
  :data:`HEAD_SHAPES` or :data:`MIXER_SHAPES`."""
  name = case_name.split("/")[3]
  for table in (SHAPES, HEAD_SHAPES, MIXER_SHAPES):
    if name in table:
      return table[name]
  raise ValueError(f"case_name must end in a shape of aot.SHAPES, HEAD_SHAPES or MIXER_SHAPES, "
                   f"got {case_name!r}.")


def _shape(name: str) -> dict:
  return shape_of(f"k/m/d/{name}")


@dataclasses.dataclass(frozen=True)
class Case:
  """One compile: ``kernel`` (its Pallas kernels' name prefix), a ``name`` unique
  across kernels, and ``build(spec) -> (fn, args)`` with ``spec(shape, dtype)``
  making a ``ShapeDtypeStruct`` on the target device."""
  kernel: str
  name: str
  build: Callable


def _program(fn, args, n_diff: int | None = None):
  """``(value_and_grad program, args)``: the sum of all outputs of ``fn`` and its
  gradient w.r.t. the first ``n_diff`` arguments (default all), so the forward
  and every backward kernel are in one program."""
  def total(*a):
    return sum(jnp.sum(x.astype(jnp.float32)) for x in jax.tree_util.tree_leaves(fn(*a)))
  n = len(args) if n_diff is None else n_diff
  return jax.value_and_grad(total, argnums=tuple(range(n))), args


def _chunk_case(mode, dtype, shape):
  def build(spec):
    s, dt = _shape(shape), DTYPES[dtype]
    q = spec((s["b"], s["t"], s["h"], s["k"]), dt)
    v = spec((s["b"], s["t"], s["h"], s["v"]), dt)
    s0 = spec((s["b"], s["h"], s["k"], s["v"]), jnp.float32)
    g = {"none": None, "scalar": spec((s["b"], s["t"], s["h"]), jnp.float32),
         "vector": spec((s["b"], s["t"], s["h"], s["k"]), jnp.float32)}[mode]
    if g is None:
      fn = lambda q, k, v, s0: chunk_decay.chunk_decay_attention(
          q, k, v, initial_state=s0, return_state=True)
      return _program(fn, (q, q, v, s0))
    fn = lambda q, k, v, g, s0: chunk_decay.chunk_decay_attention(
        q, k, v, g, initial_state=s0, return_state=True)
    return _program(fn, (q, q, v, g, s0))
  return Case("chunk_decay", f"chunk_decay/{mode}/{dtype}/{shape}", build)


def _delta_case(gated, dtype, shape):
  """The delta rule (Gated DeltaNet when ``gated``), initial and final state."""
  def build(spec):
    s, dt = _shape(shape), DTYPES[dtype]
    q = spec((s["b"], s["t"], s.get("hk", s["h"]), s["k"]), dt)
    v = spec((s["b"], s["t"], s["h"], s["v"]), dt)
    beta = spec((s["b"], s["t"], s["h"]), jnp.float32)
    s0 = spec((s["b"], s["h"], s["k"], s["v"]), jnp.float32)
    if not gated:
      fn = lambda q, k, v, beta, s0: chunk_delta.chunk_delta_attention(
          q, k, v, beta, initial_state=s0, return_state=True)
      return _program(fn, (q, q, v, beta, s0))
    fn = lambda q, k, v, beta, g, s0: chunk_delta.chunk_delta_attention(
        q, k, v, beta, g, initial_state=s0, return_state=True)
    return _program(fn, (q, q, v, beta, beta, s0))
  mode = "gated" if gated else "deltanet"
  return Case("chunk_delta", f"chunk_delta/{mode}/{dtype}/{shape}", build)


def _dplr_case(dtype, shape):
  """The DPLR engine as KDA and RWKV-7 use it: a per-channel decay, independent write key
  and correction vectors (float32, as the ops' maps make them), initial and final state."""
  def build(spec):
    s, dt = _shape(shape), DTYPES[dtype]
    q = spec((s["b"], s["t"], s.get("hk", s["h"]), s["k"]), dt)
    v = spec((s["b"], s["t"], s["h"], s["v"]), dt)
    ab = spec((s["b"], s["t"], s["h"], s["k"]), jnp.float32)
    s0 = spec((s["b"], s["h"], s["k"], s["v"]), jnp.float32)
    fn = lambda q, k, v, a, b, g, s0: chunk_dplr.chunk_dplr_attention(
        q, k, v, a, b, g, initial_state=s0, return_state=True)
    return _program(fn, (q, ab, v, ab, ab, ab, s0))
  return Case("chunk_dplr", f"chunk_dplr/channel/{dtype}/{shape}", build)


FLASH_MODES = {
    "causal": dict(causal=True),
    "causal_gqa": dict(causal=True, gqa=True),
    "full_gqa": dict(causal=False, gqa=True),
    "window_segments": dict(causal=True, window=512, segments=True),
}


def _flash_case(mode, dtype, shape):
  def build(spec):
    s, dt, m = _shape(shape), DTYPES[dtype], FLASH_MODES[mode]
    hkv = s["hkv"] if m.get("gqa") else s["h"]
    q = spec((s["b"], s["t"], s["h"], s["k"]), dt)
    k = spec((s["b"], s["t"], hkv, s["k"]), dt)
    v = spec((s["b"], s["t"], hkv, s["v"]), dt)
    seg = spec((s["b"], s["t"]), jnp.int32) if m.get("segments") else None
    window = None if m.get("window") is None else min(m["window"], s["t"] // 2)
    kw = dict(causal=m["causal"], window=window)
    if seg is None:
      fn = lambda q, k, v: flash_attention.flash_attention(q, k, v, **kw)
      return _program(fn, (q, k, v))
    fn = lambda q, k, v, seg: flash_attention.flash_attention(q, k, v, segment_ids=seg, **kw)
    return _program(fn, (q, k, v, seg), n_diff=3)  # integer segment ids: no gradient
  return Case("flash_attention", f"flash_attention/{mode}/{dtype}/{shape}", build)


def _scan_case(dtype, shape, reverse):
  def build(spec):
    s, dt = _shape(shape), DTYPES[dtype]
    a = spec((s["b"], s["scan_t"]) + s["scan_d"], dt)
    h0 = spec((s["b"],) + s["scan_d"], dt)
    fn = lambda a, b, h0: scan.linear_scan(a, b, h0=h0, reverse=reverse, return_state=True)
    return _program(fn, (a, a, h0))
  name = f"linear_scan/{'reverse' if reverse else 'forward'}/{dtype}/{shape}"
  return Case("linear_scan", name, build)


def all_cases() -> list[Case]:
  """Every kernel, forward and backward, bf16 and f32, every decay/attention
  mode, initial and final state, at every shape of :data:`SHAPES`."""
  out = []
  for shape in SHAPES:
    for dtype in DTYPES:
      out += [_chunk_case(mode, dtype, shape) for mode in ("none", "scalar", "vector")]
      out += [_delta_case(gated, dtype, shape) for gated in (False, True)]
      out.append(_dplr_case(dtype, shape))
      out += [_flash_case(mode, dtype, shape) for mode in FLASH_MODES if mode != "causal_gqa"]
      out.append(_scan_case(dtype, shape, reverse=shape == "odd"))
  # Causal attention with grouped KV heads at each family head size (the masks of the other
  # modes do not depend on the head), and the mixers at the families' K and V.
  for dtype in DTYPES:
    out += [_flash_case("causal_gqa", dtype, shape) for shape in HEAD_SHAPES]
    for shape in MIXER_SHAPES:
      out += [_delta_case(True, dtype, shape), _dplr_case(dtype, shape)]
      if "hk" in MIXER_SHAPES[shape]:  # ungated grouped delta reads q/k-head inputs at h // G
        out.append(_delta_case(False, dtype, shape))
  return out


CASES = {c.name: c for c in all_cases()}

# What CI's compile stage (tests/kernels/test_compile_{gpu,tpu}.py) compiles where:
# every kernel in every mode (decay, attention, delta/gated) for all four targets (the
# scan's reverse direction at the odd shape, on H200 and v5e), each target with the
# "dtype/shape" groups below (tests/kernels/test_aot_cases.py). What each group checks:
# * bf16/gpu_check on H200 and A100: shared memory, registers and no spills at the
#   shapes users run (issue 27); Triton's tiles depend on the GPU and the dtype.
# * f32/gpu_check on H200: float32's own tiles and its measured spill exceptions
#   (test_compile_gpu.ACCEPTED_SPILLS). Not on A100: the same tiles as H200's, with
#   less shared memory per block, which the bf16 cases already bound.
# * bf16/odd on H200 and v5e: padding (K 40, V 72, T 333) and GQA. f32/odd is cut on
#   every target: its padding is the bf16 case's and its tiles those of f32/gpu_check.
# * TPU at "small" instead of "gpu_check": Mosaic sees the same block shapes and kernel
#   bodies (only the grid shrinks) and the compile costs less (above); both dtypes on v5e,
#   bf16 on v6e (float32 takes the same (8, 128) tiling on both chips).
# * The family head sizes (:data:`HEAD_SHAPES`, causal flash attention with grouped KV
#   heads): bf16 at every head on all four targets (Triton's tiles follow the padded head,
#   Mosaic sees each head as it is; no bf16 spill on GPU); float32 at the two largest heads
#   (192/128 and 256, the float32 tiles of engines.dispatch.FLASH_TILES that are not the
#   gpu_check ones) on H200, A100 (the least shared memory) and v5e, and at 80 (a padded
#   head) on H200.
# * The mixers at the families' K 128, V 256 (:data:`MIXER_SHAPES`: Gated DeltaNet and the
#   DPLR engine), bf16 on H200 and A100. On TPU only v5e, and only with grouped value heads
#   (q, k with half the heads: the kernels index q/k head h // G): Mosaic tiles those
#   kernels at the same K and V block shapes as the ungrouped ones, and each of these
#   compiles costs 40-80 CPU-s (CI's stage grew past its budget); v6e compiles the kernel
#   bodies at the small shape. Grouped heads on H200 too: one GPU and one TPU lowering of
#   those index maps. Not float32: on H200 its tiles spill more there than
#   ACCEPTED_SPILLS allows at the gpu_check shape (chunk_dplr_fwd 2416 B).
# experiments/compile_report.py (and this module's CLI) compile every case on every target.
_HEADS_BF16 = tuple(f"bf16/{h}" for h in HEAD_SHAPES)
_HEADS_F32 = ("f32/d192v128", "f32/d256")
_MIXERS_BF16 = tuple(f"bf16/{m}" for m in MIXER_SHAPES if "hk" not in MIXER_SHAPES[m])
_GROUPED_BF16 = tuple(f"bf16/{m}" for m in MIXER_SHAPES if "hk" in MIXER_SHAPES[m])
CI_GROUPS = {
    "h200": ("bf16/gpu_check", "f32/gpu_check", "bf16/odd") + _HEADS_BF16 + _HEADS_F32
    + ("f32/d80",) + _MIXERS_BF16 + _GROUPED_BF16,
    "a100": ("bf16/gpu_check",) + _HEADS_BF16 + _HEADS_F32 + _MIXERS_BF16,
    "v5e": ("bf16/small", "f32/small", "bf16/odd") + _HEADS_BF16 + _HEADS_F32 + _GROUPED_BF16,
    "v6e": ("bf16/small",) + _HEADS_BF16,
}


def ci_cases(target: str) -> list[str]:
  """The names of the cases CI compiles for ``target`` (:data:`CI_GROUPS`), sorted."""
  platform_of(target)
  if target not in CI_GROUPS:
    raise ValueError(f"target must be one of {list(CI_GROUPS)} for CI, got {target!r}.")
  groups = tuple("/" + g for g in CI_GROUPS[target])
  return sorted(n for n in CASES if n.endswith(groups))

# -------------------------------------------------------------- one case in-process

_MARK = "@@aot-case "


def _cpu_seconds() -> float:
  """CPU time of this process (all threads) and of its finished children (ptxas)."""
  kids = resource.getrusage(resource.RUSAGE_CHILDREN)
  return time.process_time() + kids.ru_utime + kids.ru_stime


def compile_case(device, case: Case, dump_dir: str | None = None) -> dict:
  """Compiles ``case`` for ``device``; ``{"ok", "error", "seconds", "cpu_seconds"}``
  (wall and CPU time: on a shared machine the CPU time is the comparable one). The
  kernels see the device through ``jax.default_device`` and pick their platform from it."""
  sharding = jax.sharding.SingleDeviceSharding(device)
  spec = lambda shape, dtype: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
  t0, c0 = time.perf_counter(), _cpu_seconds()
  times = lambda: {"seconds": time.perf_counter() - t0, "cpu_seconds": _cpu_seconds() - c0}
  try:
    fn, args = case.build(spec)
    options = {"xla_dump_to": dump_dir} if dump_dir else None
    with jax.default_device(device):
      jax.jit(fn).trace(*args).lower().compile(compiler_options=options)
    return {"ok": True, "error": None, **times()}
  except Exception as e:  # noqa: BLE001 - the compiler's error is the result
    msg = f"{type(e).__name__}: {e}"
    if not str(e):
      msg += "\n" + traceback.format_exc()[-1500:]
    return {"ok": False, "error": msg[:4000], **times()}


def _child(target: str, names: list[str], dump_root: str | None) -> int:
  """Child process body: compiles ``names`` in order, one JSON line per case on stdout."""
  device = compile_only_device(target)
  for i, name in enumerate(names):
    os.write(2, f"\n{_MARK}{name}\n".encode())
    dump = os.path.join(dump_root, str(i)) if dump_root else None
    result = compile_case(device, CASES[name], dump)
    os.write(2, f"\n{_MARK}end\n".encode())
    print(json.dumps(dict(result, case=name)), flush=True)
  return 0


# ------------------------------------------------------------- parsing the reports

_PTXAS_FN = re.compile(
    r"Function properties for (\S+)\s+(\d+) bytes stack frame, (\d+) bytes spill stores, "
    r"(\d+) bytes spill loads\s+ptxas info\s+: Used (\d+) registers")
_THUNK = re.compile(r"\] (\S+) grid: \[([\d, ]+)\] threads: \[([\d, ]+)\]\s+shared_memory: (\d+)")
KERNEL_PREFIXES = ("chunk_decay_", "chunk_delta_", "chunk_dplr_", "flash_attention_",
                   "linear_scan")


def parse_ptxas(log: str) -> dict[str, dict]:
  """``{kernel: {"registers", "spill_stores", "spill_loads", "stack"}}`` from ``ptxas -v``."""
  out = {}
  for fn, stack, st, ld, regs in _PTXAS_FN.findall(log):
    if fn.startswith(KERNEL_PREFIXES):
      out[fn] = {"registers": int(regs), "spill_stores": int(st), "spill_loads": int(ld),
                 "stack": int(stack)}
  return out


def parse_thunks(dump_dir: str) -> dict[str, dict]:
  """``{kernel: {"shared_memory", "grid", "threads"}}`` from the dump's thunk sequences."""
  out = {}
  if not dump_dir or not os.path.isdir(dump_dir):
    return out
  for f in sorted(os.listdir(dump_dir)):
    if f.endswith("thunk_sequence.txt"):
      with open(os.path.join(dump_dir, f)) as fh:
        for name, grid, threads, smem in _THUNK.findall(fh.read()):
          if name.startswith(KERNEL_PREFIXES):
            out[name] = {"shared_memory": int(smem), "grid": grid, "threads": threads}
  return out


def _split_log(log: str) -> dict[str, str]:
  """The child's stderr cut at the case markers: ``{case: its part}``."""
  parts, current = {}, None
  for line in log.splitlines(keepends=True):
    if line.startswith(_MARK):
      name = line[len(_MARK):].strip()
      current = None if name == "end" else name
      if current:
        parts[current] = ""
      continue
    if current:
      parts[current] += line
  return parts


def _crash_reason(log: str) -> str:
  """The most telling lines of a crashed child's stderr."""
  lines = [l for l in log.splitlines() if l.strip()]
  keys = ("Check failed", "error", "Error", "F0", "Fatal", "Aborted", "Segmentation")
  hits = [l.strip() for l in lines if any(k in l for k in keys)]
  return " | ".join((hits or lines)[-4:])[:2000] or "the compiler process died with no output"


def child_env(target: str, dump: bool) -> dict[str, str]:
  """The environment of a compile child: CPU JAX, no TPU metadata query, no libtpu lock
  (children compile concurrently), no persistent compilation cache, ptxas -v, and compiler
  optimisations on (the kernels as users compile them, whatever the parent set:
  the test session turns most of XLA's off, which makes ptxas spill)."""
  env = dict(os.environ, JAX_PLATFORMS="cpu", TPU_SKIP_MDS_QUERY="1",
             JAX_DISABLE_MOST_OPTIMIZATIONS="0", ALLOW_MULTIPLE_LIBTPU_LOAD="1")
  env.pop("JAX_COMPILATION_CACHE_DIR", None)  # a cached program would skip ptxas
  # The child runs ``-m tests.kernels.aot``: the repository root must be importable.
  env["PYTHONPATH"] = os.pathsep.join(p for p in (_ROOT, env.get("PYTHONPATH")) if p)
  if platform_of(target) == "gpu" and dump:
    env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_gpu_ptx_compiler_extra_flags=-v").strip()
    env["TF_CPP_MIN_LOG_LEVEL"] = "0"
    env["TF_CPP_VMODULE"] = "subprocess_compilation=3"
  return env


def run_target(target: str, names: list[str] | None = None, *, python: str | None = None,
               timeout: float = 900.0, detail: bool = True) -> dict[str, dict]:
  """Compiles the named cases (default: all) for ``target`` in child processes.

  Args:
    target: one of :data:`TARGETS`.
    names: case names (:data:`CASES`); ``None``: every case.
    python: the interpreter of the children (default: this one).
    timeout: seconds for the whole target.
    detail: GPU only: collect shared memory, registers and spills per kernel.

  Returns:
    ``{case: {"ok", "error", "seconds", "kernels": {kernel: {...}}}}``; a case
    whose child crashed gets ``ok=False`` and the crash's telling lines.
  """
  platform_of(target)
  names = list(CASES) if names is None else list(names)
  for n in names:
    if n not in CASES:
      raise ValueError(f"names must be case names of aot.CASES, got {n!r}.")
  results: dict[str, dict] = {}
  gpu_detail = detail and platform_of(target) == "gpu"  # nothing to read on TPU
  deadline = time.monotonic() + timeout
  with tempfile.TemporaryDirectory(prefix=f"aot_{target}_") as tmp:
    todo = list(names)
    while todo:
      dump_root = os.path.join(tmp, f"run{len(results)}") if gpu_detail else None
      cmd = [python or sys.executable, "-m", "tests.kernels.aot", "--child",
             "--target", target, "--cases", ",".join(todo)]
      if dump_root:
        cmd += ["--dump", dump_root]
      try:
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              timeout=max(1.0, deadline - time.monotonic()),
                              env=child_env(target, gpu_detail))
        out, err, rc = proc.stdout, proc.stderr, proc.returncode
      except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        rc = "timeout"
      logs = _split_log(err)
      done = [json.loads(l) for l in out.splitlines() if l.startswith("{")]
      for i, r in enumerate(done):
        name = r.pop("case")
        r["kernels"] = {}
        if gpu_detail:
          regs = parse_ptxas(logs.get(name, ""))
          smem = parse_thunks(os.path.join(dump_root, str(i)))
          for k in sorted(set(regs) | set(smem)):
            r["kernels"][k] = dict(smem.get(k, {}), **regs.get(k, {}))
        results[name] = r
      todo = [n for n in todo if n not in results]
      if not todo:
        break
      # The child stopped early: the first unfinished case crashed it (or time ran out).
      crashed = todo.pop(0)
      why = "timed out" if rc == "timeout" else _crash_reason(logs.get(crashed, err))
      if not logs and rc != "timeout":
        why = f"exit {rc}: {_crash_reason(err)}"
      results[crashed] = {"ok": False, "error": f"compiler crashed ({why})", "seconds": None,
                          "kernels": {}}
      if rc == "timeout":
        for n in todo:
          results[n] = {"ok": False, "error": "not run: time ran out", "seconds": None,
                        "kernels": {}}
        break
  return {n: results[n] for n in names}


def run_targets(wanted: dict[str, list[str]], *, workers: int | None = None,
                timeout: float = 900.0, detail: bool = True,
                python: str | None = None) -> dict[str, dict[str, dict]]:
  """Compiles several targets' cases at once: each target's cases are dealt into
  ``workers`` children (a compile child is one process on one core), all run concurrently.

  Args:
    wanted: ``{target: case names}`` (see :func:`run_target`).
    workers: children at a time (default: this machine's cores).
    timeout: seconds for each child.
    detail, python: as in :func:`run_target`.

  Returns:
    ``{target: {case: result}}`` as :func:`run_target` returns per target.
  """
  workers = max(1, workers or os.cpu_count() or 1)
  jobs = [(t, sorted(names)[i::workers]) for t, names in wanted.items() for i in range(workers)]
  # TPU children first, then the bigger: Mosaic compiles take longest, so the
  # pool's last jobs are short ones.
  jobs = sorted([(t, names) for t, names in jobs if names],
                key=lambda job: (platform_of(job[0]) != "tpu", -len(job[1])))
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    done = list(pool.map(lambda job: (job[0], run_target(job[0], job[1], timeout=timeout,
                                                         detail=detail, python=python)), jobs))
  out: dict[str, dict[str, dict]] = {t: {} for t in wanted}
  for target, results in done:
    out[target].update(results)
  return {t: dict(sorted(r.items())) for t, r in out.items()}


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--target", required=True, choices=TARGETS)
  p.add_argument("--cases", default="", help="comma-separated case names (default: all)")
  p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--dump", default=None, help=argparse.SUPPRESS)
  args = p.parse_args(argv)
  names = [n for n in args.cases.split(",") if n] or list(CASES)
  if args.child:
    return _child(args.target, names, args.dump)
  for name, r in run_target(args.target, names).items():
    print(json.dumps(dict(r, case=name)))
  return 0


if __name__ == "__main__":
  sys.exit(main())
