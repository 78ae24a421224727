"""Two real processes on localhost (JAX's CPU backend, Gloo collectives) train like one.

Every run goes through the documented command (``python -m linear_attention.main`` with
``--coordinator_address --num_processes --process_id``), one CPU device per process,
against one process holding two devices, on the MQAR smoke config made tiny:

* data parallelism and FSDP give the single-process losses and parameters (float32, up to
  the reduction order of the cross-process all-reduce: rtol 1e-5 on losses, 1e-4 on
  parameters);
* only process 0 writes metrics (one record per step and split) and TensorBoard events;
* killing process 1 mid-run makes process 0 exit within ``EXIT_WITHIN_S`` with one
  ``error:`` line, and rerunning both resumes to the uninterrupted run's result.

Every process has a hard timeout, so a hang fails the test instead of blocking CI.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PROCESS_TIMEOUT_S = 240
HEARTBEAT_S = 10  # a dead process is noticed within this (JAX's default is 100 s)
EXIT_WITHIN_S = 60
STEPS, KILL_AFTER = 120, 40
FLAGS = ("--config=configs/mqar.py:size=smoke", "--quiet", "--config.model.d_model=16",
         "--config.model.num_layers=1", "--config.data.vocab_size=32",
         "--config.data.seq_len=32", "--config.data.batch_size=8",
         f"--config.train.steps={STEPS}", "--config.train.eval_every=0",
         "--config.train.log_every=10", f"--config.train.checkpoint_every={KILL_AFTER}",
         "--config.train.eval_batches=1")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _start(workdir, *, processes: int, fsdp: bool = False) -> list[subprocess.Popen]:
  """Starts the run: ``processes`` processes of one device each, or one of two devices."""
  devices = 1 if processes > 1 else 2
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
  cmd = [sys.executable, "-m", "linear_attention.main", f"--workdir={workdir}", *FLAGS,
         f"--config.mesh.fsdp={fsdp}"]
  if processes > 1:
    cmd += [f"--coordinator_address=127.0.0.1:{_free_port()}", f"--num_processes={processes}",
            f"--heartbeat_timeout_s={HEARTBEAT_S}"]
  return [subprocess.Popen(cmd + ([f"--process_id={i}"] if processes > 1 else []), cwd=ROOT,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
          for i in range(processes)]


def _finish(procs, timeout=PROCESS_TIMEOUT_S) -> list[tuple[int, str]]:
  """Waits for every process (killing all on timeout); returns ``(returncode, stderr)``s."""
  out = []
  deadline = time.monotonic() + timeout
  for p in procs:
    try:
      _, err = p.communicate(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
      for q in procs:
        q.kill()
      pytest.fail(f"a process did not finish within {timeout} s (hang)")
    out.append((p.returncode, err))
  return out


def _run(workdir, **kw):
  results = _finish(_start(workdir, **kw))
  for i, (rc, err) in enumerate(results):
    assert rc == 0, f"process {i} exited {rc}: {err[-3000:]}"
  return _outcome(workdir)


def _outcome(workdir):
  from linear_attention import train
  final = json.load(open(os.path.join(workdir, "final_metrics.json")))
  records = train.metrics.read_metrics(str(workdir), "train")
  params = train.load_checkpoint(str(workdir))
  return final, records, [np.asarray(x) for x in jax.tree_util.tree_leaves(params)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """The reference (one process, two devices, data parallel) and two processes with FSDP."""
  root = tmp_path_factory.mktemp("mp")
  return {"one": _run(root / "one", processes=1),
          "fsdp": _run(root / "two-fsdp", processes=2, fsdp=True), "fsdp_dir": root / "two-fsdp"}


def _assert_same(run, ref):
  (final, records, params), (ref_final, ref_records, ref_params) = run, ref
  assert final["step"] == ref_final["step"] == STEPS
  np.testing.assert_allclose([r["loss"] for r in records], [r["loss"] for r in ref_records],
                             rtol=1e-5)
  np.testing.assert_allclose(final["validation_loss"], ref_final["validation_loss"], rtol=1e-5)
  assert len(params) == len(ref_params)
  for a, b in zip(params, ref_params):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_fsdp_over_two_processes_equals_one_process(runs):
  _assert_same(runs["fsdp"], runs["one"])


def test_only_process_zero_writes(runs):
  """One record per logged step, and one TensorBoard event file."""
  _, records, _ = runs["fsdp"]
  assert [r["step"] for r in records] == list(range(10, STEPS + 1, 10))
  events = [f for _, _, files in os.walk(runs["fsdp_dir"] / "tensorboard") for f in files
            if f.startswith("events.")]
  assert len(events) == 1, events


def test_killed_process_fails_fast_and_rerun_resumes(runs, tmp_path):
  workdir = tmp_path / "killed"
  procs = _start(workdir, processes=2)
  first_ckpt = workdir / "checkpoints" / str(KILL_AFTER)
  deadline = time.monotonic() + PROCESS_TIMEOUT_S
  while not first_ckpt.exists() and time.monotonic() < deadline and procs[1].poll() is None:
    time.sleep(0.02)  # polling for the first checkpoint, not a fixed wait
  assert first_ckpt.exists(), "no checkpoint appeared: " + _finish(procs)[0][1][-2000:]
  procs[1].send_signal(signal.SIGKILL)
  t0 = time.monotonic()
  (rc0, err0), _ = _finish(procs, timeout=EXIT_WITHIN_S)
  waited = time.monotonic() - t0
  if rc0 == 0:
    pytest.skip("process 0 finished before the kill landed (a very fast machine)")
  lines = [ln for ln in err0.strip().splitlines() if ln.startswith("error:")]
  assert rc0 == 1 and len(lines) == 1, (rc0, err0[-2000:])
  assert waited < EXIT_WITHIN_S
  # Rerunning both resumes from the last complete checkpoint; the data-parallel result equals
  # the one-process reference, as an uninterrupted run does.
  _assert_same(_run(workdir, processes=2), runs["one"])
