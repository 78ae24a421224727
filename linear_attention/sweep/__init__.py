"""Sweeps: every point of a config's ``get_sweep()`` trained as its own process.

``python -m linear_attention.sweep --config=... --workdir=...`` runs every point locally
(``--workers`` at a time) or one point of a cluster array (``--point``), and writes
``summary.csv`` / ``summary.json``; README.md, "Sweeps", is the manual (flags, directory
names, reruns, locks, stopping, exit codes). The modules: ``points`` (override lists and
their directories), ``runner`` (running points, status records, the summary),
``children`` (the trainer processes and stopping them), ``cli`` (the command line).
"""

from linear_attention.sweep.children import (EXIT_MEANINGS, STOP_GRACE_S, SweepStoppedError,
                                             stop_message, stop_note)
from linear_attention.sweep.cli import ARRAY_ENV, main
from linear_attention.sweep.points import (STATUS_FILE, flag_value, load_sweep, point_dirs,
                                           point_name, product, zip_)
from linear_attention.sweep.runner import (SWEEP_LOCK_FILE, TRAINER_FLAGS, collect,
                                           point_command, run_one, run_point, run_sweep,
                                           write_summary)

# Private helpers the tests reach (the one-module sweep had them at its top level).
from linear_attention.sweep.cli import _process_id  # noqa: E402,F401
from linear_attention.sweep.runner import _held_by_another  # noqa: E402,F401

__all__ = ["ARRAY_ENV", "EXIT_MEANINGS", "STATUS_FILE", "STOP_GRACE_S", "SWEEP_LOCK_FILE",
           "SweepStoppedError", "TRAINER_FLAGS", "collect", "flag_value", "load_sweep", "main",
           "point_command", "point_dirs", "point_name", "product", "run_one", "run_point",
           "run_sweep", "stop_message", "stop_note", "write_summary", "zip_"]
