"""The trainer's failures and the exit status each one gets on the command line.

The classes say *when* a run failed as much as *why*: a :class:`ConfigError` is raised
before anything in the workdir was written (fix the command and rerun), every other error
comes from a run that had started (its traceback goes to ``<workdir>/error.log``).
"""

from __future__ import annotations

# Exit status of ``python -m linear_attention.main`` (and of each point in a sweep summary).
EXIT_OK = 0
EXIT_RUNTIME = 1
EXIT_CONFIG = 2
EXIT_PREEMPTED = 3
EXIT_NON_FINITE = 4
EXIT_INTERRUPTED = 130  # the shell's convention for SIGINT (128 + 2)

EXIT_CODES: dict[int, str] = {
    EXIT_OK: "finished (or had finished before)",
    EXIT_RUNTIME: "runtime failure after the run started (I/O error such as a full disk, no "
                  "readable checkpoint, an internal error); traceback in <workdir>/error.log",
    EXIT_CONFIG: "bad configuration or workdir (also: config changed, workdir locked); "
                 "nothing was written",
    EXIT_PREEMPTED: "stopped by SIGTERM (or a first Ctrl-C) after saving a checkpoint; rerun "
                    "to resume",
    EXIT_NON_FINITE: "non-finite loss or gradient norm; stopped without saving that state",
    EXIT_INTERRUPTED: "interrupted (a second Ctrl-C, or a Ctrl-C or SIGTERM outside the "
                      "training loop)",
}


class ConfigError(ValueError):
  """Bad configuration, data settings or workdir, found before anything was written."""


class WorkdirLockedError(ConfigError):
  """Another live process holds the workdir's lock."""


class ConfigChangedError(ConfigError):
  """The config differs from the workdir's ``config.json`` in a field the checkpoints depend on."""


class CheckpointError(RuntimeError):
  """The workdir has checkpoints but none of them can be restored."""


class CheckpointWriteError(OSError):
  """A checkpoint could not be written (a full disk, a file size limit, a lost mount); the
  checkpoints saved before it are intact."""


class DataError(ValueError):
  """A batch broke the data contract during the run (e.g. a token id outside the vocabulary)."""


class NonFiniteLossError(FloatingPointError):
  """The loss or the gradient norm became NaN/Inf; nothing after the last good check is saved."""


class PreemptedError(RuntimeError):
  """SIGTERM, a first SIGINT or a multi-host preemption notice arrived; a checkpoint was saved
  first."""


def exit_code(error: BaseException) -> int:
  """The exit status of the command line for ``error`` (see :data:`EXIT_CODES`)."""
  if isinstance(error, KeyboardInterrupt):
    return EXIT_INTERRUPTED
  if isinstance(error, ConfigError):
    return EXIT_CONFIG
  if isinstance(error, PreemptedError):
    return EXIT_PREEMPTED
  if isinstance(error, NonFiniteLossError):
    return EXIT_NON_FINITE
  return EXIT_RUNTIME
