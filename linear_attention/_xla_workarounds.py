"""A workaround for a crash of XLA's CPU backend, applied at import.

jaxlib's CPU backend (seen with jaxlib 0.10.2) hands some fusions to its
YNNPACK library; on the backward pass of the per-channel chunk form, one of
its transposes segfaults (``slinky::fuse_contiguous_dims`` under
``YnnFusionThunk``), depending on the heap layout of the process. Turning
those fusions off (``--xla_cpu_experimental_ynn_fusion_type=``) removes the
crash and, measured on this project's chunk forms, also makes their backward
faster. The flag is added to ``XLA_FLAGS`` only when the CPU backend has not
started yet, the user has not set the flag, and
``LINEAR_ATTENTION_KEEP_XLA_FLAGS`` is unset.
"""

from __future__ import annotations

import os
import sys

FLAG = "--xla_cpu_experimental_ynn_fusion_type="


def apply() -> bool:
  """Adds :data:`FLAG` to ``XLA_FLAGS`` when it is safe to; returns whether it did."""
  if os.environ.get("LINEAR_ATTENTION_KEEP_XLA_FLAGS"):
    return False
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_cpu_experimental_ynn_fusion_type" in flags:
    return False
  if "jax" in sys.modules:  # else no backend can have started (and JAX need not load yet)
    try:
      from jax._src import xla_bridge
      if xla_bridge.backends_are_initialized():
        return False
    except (ImportError, AttributeError):
      return False
  os.environ["XLA_FLAGS"] = (flags + " " + FLAG).strip()
  return True
