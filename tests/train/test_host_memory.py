"""The trainer's host-memory hygiene: the TensorBoard writer does not load torch, and freed
heap memory goes back to the operating system."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap

from linear_attention.train import trainer

# A stand-in torch package that records its own import (the CI's main suite has no torch).
FAKE_TORCH = "import os\nopen(os.environ['TORCH_IMPORTED'], 'w').close()\nTensor = object\n"

SCRIPT = textwrap.dedent("""
    import sys
    from linear_attention.train import metrics
    preload = sys.argv[2] == "preload"
    if preload:
      import torch
    w = metrics.MetricWriter(sys.argv[1], 0)
    w.write(1, "train", {"loss": 1.5})
    w.flush()
    assert w._tb is not None, "tensorboardX is a test dependency"
    print("torch" in sys.modules, type(sys.modules.get("torch")).__name__)
""")


def _run(tmp_path, preload: str):
  fake = tmp_path / "fake"
  (fake / "torch").mkdir(parents=True, exist_ok=True)
  (fake / "torch" / "__init__.py").write_text(FAKE_TORCH)
  flag = tmp_path / f"imported-{preload}"
  (tmp_path / preload).mkdir()
  env_path = f"{fake}:{':'.join(p for p in sys.path if p)}"
  proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / preload), preload],
                        capture_output=True, text=True, timeout=120,
                        env={"PYTHONPATH": env_path, "TORCH_IMPORTED": str(flag),
                             "PATH": "/usr/bin:/bin"})
  assert proc.returncode == 0, proc.stderr[-2000:]
  return proc.stdout.split(), flag.exists()


def test_metric_writer_leaves_torch_unimported(tmp_path):
  (in_modules, kind), imported = _run(tmp_path, "none")
  assert not imported and in_modules == "False" and kind == "NoneType"
  # Scalars were written all the same.
  assert any(p.name.startswith("events.out.tfevents")
             for p in (tmp_path / "none" / "tensorboard").iterdir())


def test_metric_writer_keeps_a_torch_the_caller_loaded(tmp_path):
  (in_modules, kind), imported = _run(tmp_path, "preload")
  assert imported and in_modules == "True" and kind == "module"


def test_freed_heap_goes_back_with_glibc():
  # malloc_trim is glibc's: True there, False on macOS and musl.
  assert trainer.return_freed_host_memory() is (platform.libc_ver()[0] == "glibc")
