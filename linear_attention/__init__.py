"""linear_attention: linear and sub-quadratic attention in JAX.

The subpackages load on first use (``linear_attention.ops.gla(...)`` after ``import
linear_attention`` works as before), so a command line's ``--help`` or the sweep runner,
which need no JAX, start in a fraction of a second.
"""

import importlib as _importlib
import sys as _sys

if _sys.argv[:1] == ["-m"]:  # `python -m linear_attention.<command>`, while it imports
  # Ctrl-C (or SIGTERM) while JAX imports: one line and exit 130, as main's own handler does later
  # (a KeyboardInterrupt inside JAX's import can crash or hang the interpreter's shutdown).
  import os as _os
  import signal as _signal

  def _exit_on_interrupt(signum, frame):
    del signum, frame
    _os.write(2, b"error: interrupted; rerun the same command to resume from the last "
                 b"checkpoint (or to start again if none was saved).\n")
    _os._exit(130)

  for _signum in (_signal.SIGINT, _signal.SIGTERM):  # SIGTERM: a sweep stopping a trainer
    _signal.signal(_signum, _exit_on_interrupt)

from linear_attention import _xla_workarounds  # noqa: E402

_xla_workarounds.apply()  # before anything imports JAX

__version__ = "0.1.0"

# Loaded by attribute access (PEP 562); ``from linear_attention import ops`` imports as usual.
_SUBPACKAGES = ("common", "data", "engines", "eval", "hub", "io", "models", "nn", "ops", "train")


def __getattr__(name: str):
  if name in _SUBPACKAGES:
    return _importlib.import_module(f"{__name__}.{name}")
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
  return sorted(set(globals()) | set(_SUBPACKAGES))
