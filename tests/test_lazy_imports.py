"""The package loads its subpackages on first use: the command lines' ``--help`` and the
sweep runner import no JAX, while ``linear_attention.ops.x`` and ``linear_attention.train.x``
work as they did when everything was imported eagerly."""

from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

import linear_attention
from linear_attention import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HEAVY = ("jax", "flax", "optax", "orbax")


def _fresh(*args: str) -> subprocess.CompletedProcess:
  """``python -X importtime ARGS`` in a new interpreter (nothing of this session loaded)."""
  env = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "PYTHONPATH")}
  env["PYTHONPATH"] = ROOT
  return subprocess.run([sys.executable, "-X", "importtime", *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=120)


def _heavy_imports(stderr: str) -> set[str]:
  """The heavy packages among the modules ``-X importtime`` reported importing."""
  names = {ln.rpartition("|")[2].strip().split(".")[0] for ln in stderr.splitlines()
           if ln.startswith("import time:")}
  return names & set(HEAVY)


# absl's --help exits 1; main takes -h for it too (absl alone refused it as an unknown flag).
@pytest.mark.parametrize("module, flag, code", [("sweep", "--help", 0), ("main", "--help", 1),
                                                ("main", "-h", 1)])
def test_help_of_the_command_lines_imports_no_jax(module, flag, code):
  out = _fresh("-m", f"linear_attention.{module}", flag)
  assert out.returncode == code, out.stderr[-3000:]
  assert "--workdir" in out.stdout  # the help was printed
  assert not _heavy_imports(out.stderr)


def test_sweep_runner_and_package_import_no_jax_and_set_the_xla_flag():
  out = _fresh("-c", "import os, linear_attention.sweep\n"
               "from linear_attention.train import errors, metrics, rundir\n"
               "print(os.environ.get('XLA_FLAGS'))")
  assert out.returncode == 0, out.stderr[-3000:]
  assert "xla_cpu_experimental_ynn_fusion_type" in out.stdout  # set before JAX, not skipped
  assert not _heavy_imports(out.stderr)
  assert "linear_attention.sweep" in out.stderr  # the check reads what was imported


def test_attributes_load_their_modules():
  assert callable(linear_attention.ops.gla)
  assert isinstance(linear_attention.nn, types.ModuleType)
  assert "ops" in dir(linear_attention) and "train_and_evaluate" in dir(train)
  from linear_attention.train import trainer, errors
  assert train.train_and_evaluate is trainer.train_and_evaluate
  assert train.ConfigError is errors.ConfigError
  assert train.trainer is trainer
  from linear_attention.train import load_config, results  # the re-exports by name
  assert load_config is results.load_config


@pytest.mark.parametrize("module, name", [(linear_attention, "opz"), (train, "train_and_eval")])
def test_unknown_attribute_raises_attribute_error_naming_it(module, name):
  with pytest.raises(AttributeError, match=name):
    getattr(module, name)
