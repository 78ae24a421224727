"""The README's Python examples run as written, in order, in one process with 4 fake CPU
devices (the context-parallelism example needs them); the sequence length of the API
section's first line is cut to keep it quick (issue 41 item 7). Its names table covers
every registry name."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from linear_attention.nn import registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = open(os.path.join(ROOT, "README.md")).read()
SIZES = "B, T, H, D = 2, 1000, 4, 64"
# The real-models example reads a downloaded checkpoint; the test reads a committed fixture.
CHECKPOINT = '"ckpt/mamba-130m"'
FIXTURE = repr(os.path.join(ROOT, "tests", "hub", "fixtures", "mamba"))
IDS = "ids = jnp.array([[510, 3158, 8516]])"


def test_python_examples_run(tmp_path):
  blocks = re.findall(r"```python\n(.*?)```", README, re.S)
  assert len(blocks) >= 2 and any("SeqContext" in b for b in blocks)
  code = "\n".join(blocks)
  for line, short in ((SIZES, "B, T, H, D = 2, 96, 4, 16"), (CHECKPOINT, FIXTURE),
                      (IDS, "ids = jnp.array([[3, 1, 4]])"), ('"ckpt/out"', repr(str(tmp_path)))):
    assert line in code, line  # the lines the test shortens or points at a local checkpoint
    code = code.replace(line, short)
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=4",
             PYTHONPATH=ROOT)
  p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                     text=True, timeout=600)
  assert p.returncode == 0, p.stderr[-3000:]


def test_names_table_covers_every_registry_name():
  table = README.split("Names: one public name per op")[1].split("\n\n")[1]
  named = set(re.findall(r"`([a-z0-9_]+)` \|\s*$", table, re.M))
  missing = sorted(set(registry.MIXERS) - named)
  assert not missing, f"registry names missing from the README's names table: {missing}"


def test_param_table_covers_every_causal_registry_mixer():
  import json
  rows = json.load(open(os.path.join(ROOT, "results", "param_table.json")))["rows"]
  # The table is of language models: the encoder mixers cannot be in one.
  assert sorted(r["mixer"] for r in rows) == sorted(registry.CAUSAL_MIXERS)


def test_delta_form_ratios_are_the_results_files():
  """The `auto` form's time ratios the ops table quotes are those of
  results/bench_delta_forms_cpu.json (two decimals; KDA's and RWKV-7's as ranges)."""
  import json
  rows = json.load(open(os.path.join(ROOT, "results", "bench_delta_forms_cpu.json")))["rows"]
  ms = {(r["variant"], r["T"]): {k: 1e3 * r[f"{k}_s"] for k in (
      "chunk_fwd", "chunk_fwdbwd", "recurrent_fwd", "recurrent_fwdbwd")} for r in rows}
  g = ms["gated_deltanet", 4096]
  assert (f"the recurrent forward takes {g['recurrent_fwd'] / g['chunk_fwd']:.2f}x the chunk "
          f"form's time, the chunk forward+backward "
          f"{g['chunk_fwdbwd'] / g['recurrent_fwdbwd']:.2f}x the recurrent one's") in README
  dplr = [ms[n, t] for n in ("kda", "rwkv7") for t in (4096, 16384)]
  speedup = [r["chunk_fwd"] / r["recurrent_fwd"] for r in dplr]
  ratio = [r["chunk_fwdbwd"] / r["recurrent_fwdbwd"] for r in dplr]
  assert f"({min(speedup):.1f}-{max(speedup):.1f}x faster forward)" in README
  assert (f"forward+backward in {min(ratio):.2f}-{max(ratio):.2f}x the recurrent form's time "
          "for KDA and RWKV-7 at 4k and 16k") in README
  dp = [ms["gated_deltaproduct", t] for t in (4096, 16384)]
  # "its chunk form is the slower one forward and forward+backward"
  assert all(r["chunk_fwd"] > r["recurrent_fwd"] and r["chunk_fwdbwd"] > r["recurrent_fwdbwd"]
             for r in dp)


def test_context_parallel_memory_table_is_the_results_file():
  import json
  rows = json.load(open(os.path.join(ROOT, "results", "bench_scale_cpu.json")))["rows"]
  gla = {(r["seq_len"], r["seq"]): r for r in rows if r["mixer"] == "gla"}
  for t in sorted({t for t, _ in gla}):
    cells = []
    for s in (1, 2, 4):
      r = gla[t, s]
      cells.append(f"{r['memory_bytes']['total'] / 2 ** 20:,.0f} MiB"
                   + ("" if r["fits"] else " (over)"))
    line = f"| {t:,} | " + " | ".join(cells) + " |"
    assert line in README, line
