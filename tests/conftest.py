"""Test-session settings, applied before any test imports JAX.

The tests use small shapes, so XLA's compile time dominates their run time.
``JAX_DISABLE_MOST_OPTIMIZATIONS=1`` skips most of XLA's optimisation passes,
which measured 40-45% off the wall time of the ops, model and trainer tests on
the 2-core CI machine. Results stay within every test's tolerance. The
environment variable (not only ``jax.config``) is set so that the subprocesses
the trainer tests launch inherit it. The optimised path stays covered: CI's
second-JAX stage runs the shared conformance core without this file's setting
(``LINEAR_ATTENTION_TEST_OPTIMIZED=1``), and the benchmarks always optimise.

JAX's persistent compilation cache is on for the session (``JAX_COMPILATION_CACHE_DIR``,
a folder under the system's temporary directory unless set), shared by the xdist workers
and the trainer subprocesses: the CLI, fault and notebook tests start dozens of trainers
on the same few configs, and a trainer that finds its programs there started in 7.3
instead of 12.4 s. The cache key is the program, the compile options and the JAX
version, so a stale entry is never used for a different program. The deviceless kernel
compile children do not use it (``kernels.aot.child_env``): they must run ptxas.
"""

import os
import tempfile

if not os.environ.get("LINEAR_ATTENTION_TEST_OPTIMIZED"):
  os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    tempfile.gettempdir(), f"linear_attention-test-xla-cache-{os.getuid()}"))
# Programs that compile faster than this are not worth a disk write and read.
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.05")
