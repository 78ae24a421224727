"""The op benchmark's declared cases (``experiments/bench/``) build, trace and count FLOPs; its
command line lists them and reads result files back. Nothing is timed here (see
``bench_ops.py --smoke``)."""

from __future__ import annotations

import os
import subprocess
import sys

import jax
import pytest

EXPERIMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "experiments")
sys.path.insert(0, EXPERIMENTS)

from bench import cases, report  # noqa: E402

T = cases.SMOKE_T  # the smoke length: BigBird needs 7 blocks of the smoke block size


@pytest.mark.parametrize("name", list(cases.CASES))
def test_case_builds_traces_and_counts(name):
  case = cases.CASES[name]
  fn, args, argnums = case.build(T, cases.SMOKE_DIMS, jax.random.PRNGKey(0))
  out = jax.eval_shape(fn, *args)
  assert out.shape[:2] == (cases.SMOKE_DIMS.B, T)
  assert argnums and all(jax.numpy.issubdtype(args[i].dtype, jax.numpy.inexact) for i in argnums)
  assert case.flops(T, cases.SMOKE_DIMS) > 0 and case.seqs and case.group in cases.GROUPS


def test_groups_cover_every_case():
  grouped = {c for g, names in cases.GROUPS.items() if g != "all" for c in names}
  assert grouped == set(cases.CASES) == set(cases.GROUPS["all"])


def test_declaration_errors_name_the_problem():
  with pytest.raises(ValueError, match="shape 'BTX': unknown letters \\['X'\\]"):
    cases.DIMS.shape("BTX", 8)
  with pytest.raises(ValueError, match="bench case 'chunk' is declared twice"):
    cases.add("chunk", "foundation", "decay_linear_attention", cases.QKV, None, (8,))


def test_result_file_names_keep_the_full_run():
  assert report.file_name("all", False, None, False) == "bench_ops.json"
  assert report.file_name("gated", False, None, True) == "bench_ops_gated_smoke.json"
  assert report.file_name("all", True, None, False) == "bench_ops_custom.json"
  assert report.file_name("all", True, "h200", False) == "bench_ops_h200.json"


def test_cli_lists_cases_and_reports_a_result_file(tmp_path):
  script = os.path.join(EXPERIMENTS, "bench", "bench_ops.py")
  run = lambda *a: subprocess.run([sys.executable, script, *a], capture_output=True, text=True,
                                  timeout=300)
  p = run("--list", "--group", "sparse")
  assert p.returncode == 0, p.stderr
  assert [ln.split()[0] for ln in p.stdout.splitlines()] == cases.GROUPS["sparse"]
  rec = {"case": "chunk", "T": 1024, "group": "foundation", "fwd_s": 0.01, "fwdbwd_s": float("nan")}
  path = tmp_path / "r.json"
  report.write(str(path), [rec], cases.DIMS, matmul_gflops=50.0, step_s={"1024": 1e-5})
  assert '"fwdbwd_s": null' in path.read_text()  # the one writer's NaN convention
  p = run("--report", str(path))
  assert p.returncode == 0, p.stderr
  assert "chunk" in p.stdout and "10.00" in p.stdout and "step at position 1024: 10.0 us" in p.stdout
  p = run("--cases", "nope")
  assert p.returncode == 2 and "unknown --cases ['nope']" in p.stderr
