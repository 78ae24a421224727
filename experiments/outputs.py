"""Where the scripts in ``experiments/`` write: one rule for all of them.

A script's default output goes under ``runs/results/`` (``runs/`` is ignored by git), at
the path its committed counterpart has under ``results/``; the committed files are written
only when asked, with an explicit ``--out`` (or ``--results``) naming them::

    python experiments/bench/bench_engine.py --smoke      # -> runs/results/bench_engine_cpu.json
    python experiments/bench/bench_engine.py --out results/bench_engine_cpu.json

So a smoke or trial run never replaces a measurement the README quotes.
"""

from __future__ import annotations

import argparse
import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO_ROOT, "results")  # the committed results
RUNS_RESULTS = os.path.join(REPO_ROOT, "runs", "results")  # the default, ignored by git


def default_out(relative: str) -> str:
  """The default output for ``results/<relative>``: ``runs/results/<relative>``."""
  return os.path.join(RUNS_RESULTS, relative)


def add_out(parser: argparse.ArgumentParser, relative: str, flag: str = "--out",
            what: str = "output path") -> None:
  """Adds ``flag`` (default :func:`default_out` of ``relative``) to ``parser``."""
  parser.add_argument(
      flag, default=default_out(relative),
      help=f"{what} (default: runs/results/{relative}; the committed copy is written only "
           f"when named: {flag} results/{relative})")
