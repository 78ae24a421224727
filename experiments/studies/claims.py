"""The claims table: each published claim a study tests, its published figure, ours, a verdict.

Each study's claims, the rules that judge them and their reasons sit in its own module
beside this one (``claims_mqar.py``, ``claims_synthetic.py``, ``claims_lm.py``,
``claims_listops.py``, ``claims_cost.py``, ``claims_approximation.py``,
``claims_extrapolation.py``, ``claims_hybrid.py``, ``claims_frontier.py``); what they share (the row, the
verdicts, the statistics and thresholds) in ``claims_common.py``. This module gathers
them into one table and is the one the notebooks and tests import (every name of those
modules is reachable here).

    python experiments/studies/claims.py [--results DIR] [--out FILE]

(``--readme README.md`` also rewrites the README's results-at-a-glance block), prints the
table and writes ``--out``: by default ``<results>/claims.json`` when
``--results`` is given, else ``runs/results/studies/claims.json`` (the committed
``results/studies/claims.json`` only when asked: ``--results results/studies``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import textwrap

from linear_attention.io import to_jsonable, write_json

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the modules beside
import claims_synthetic  # noqa: E402,F401  (its probe rows, for the tests)
# The shared names are re-exported: the notebooks and tests read them from here.
from claims_common import (  # noqa: E402,F401
    COLUMNS, DEFAULT_RESULTS, IN_SHAPE, INCONCLUSIVE, NOT_MEASURED, NOT_REPRODUCED, REPRODUCED,
    STUDIES, VERDICTS, SchemaError, _row, _smoke, apply_rules, binomial_se, diff_se,
    load_rules, missing_results_message, result_file, result_seeds, results_dir, significant,
    spearman, underpowered)
from claims_mqar import COMPANIONS as MQAR_COMPANIONS, MQAR_CLAIMS, mqar_claims  # noqa: E402
from claims_synthetic import COMPANIONS as SYN_COMPANIONS, SYN_CLAIMS, synthetic_claims  # noqa: E402
from claims_lm import LM_CLAIMS, lm_claims  # noqa: E402
from claims_listops import LISTOPS_CLAIMS, listops_claims  # noqa: E402
from claims_cost import COST_CLAIMS, cost_claims  # noqa: E402
from claims_approximation import APPROX_CLAIMS, approximation_claims  # noqa: E402
from claims_extrapolation import EXTRAP_CLAIMS, extrapolation_claims  # noqa: E402
from claims_hybrid import HYBRID_CLAIMS, hybrid_claims  # noqa: E402
from claims_frontier import FRONTIER_CLAIMS, frontier_claims  # noqa: E402


COMPANIONS = {**SYN_COMPANIONS, **MQAR_COMPANIONS}
CLAIM_FUNCTIONS = {"cost": cost_claims, "approximation": approximation_claims,
                   "mqar": mqar_claims, "synthetic": synthetic_claims, "lm": lm_claims,
                   "listops": listops_claims, "extrapolation": extrapolation_claims,
                   "hybrid": hybrid_claims, "frontier": frontier_claims}
_TEMPLATES = {"cost": COST_CLAIMS, "approximation": APPROX_CLAIMS, "mqar": MQAR_CLAIMS,
              "synthetic": SYN_CLAIMS, "lm": LM_CLAIMS, "listops": LISTOPS_CLAIMS,
              "extrapolation": EXTRAP_CLAIMS, "hybrid": HYBRID_CLAIMS,
              "frontier": FRONTIER_CLAIMS}


def _unmeasured(study: str, reason: str) -> list[dict]:
  """One "not measured" row per claim of ``study`` (templates with their placeholders)."""
  out = []
  for claim, source, published in _TEMPLATES[study].values():
    claim = claim.replace("{m}", "mamba").replace(" ({corpus})", "").replace(" ({setting})", "")
    out.append(_row(study, claim, source, published, "-", NOT_MEASURED, reason))
  return out


def study_claims(study: str, result: dict | None) -> list[dict]:
  """The rows of one study; "not measured" rows when ``result`` is None or of another format."""
  if result is None:
    return _unmeasured(study, "no results file: run the study")
  try:
    rows = CLAIM_FUNCTIONS[study](result)
  except SchemaError as e:
    return _unmeasured(study, f"results file in an older format: rerun the study ({e})")
  return apply_rules(rows, study, result)


def load(results_dir: str, study: str) -> dict | None:
  """``<results_dir>/<study>/<study>.json`` (``result_file``: the frontier's is
  ``mqar_frontier/frontier.json``) as a dict, or None when missing; the study's
  ``COMPANIONS`` files found under ``results_dir`` are added under their names."""
  path = os.path.join(results_dir, result_file(study))
  if not os.path.exists(path):
    return None
  with open(path) as f:
    result = json.load(f)
  for name, rel in COMPANIONS.get(study, {}).items():
    extra = os.path.join(results_dir, rel)
    if os.path.exists(extra):
      with open(extra) as f:
        result[name] = json.load(f)
  return result


def all_claims(results_dir: str = DEFAULT_RESULTS, studies=STUDIES) -> list[dict]:
  """Every claim row of every study with results under ``results_dir`` (missing: not measured)."""
  rows = []
  for s in studies:
    rows += study_claims(s, load(str(results_dir), s))
  return rows


def summary(rows: list[dict]) -> str:
  """``12 claims: 3 reproduced, ...``."""
  counts = [f"{sum(r['verdict'] == v for r in rows)} {v}" for v in VERDICTS]
  return f"{len(rows)} claims: " + ", ".join(counts)


WIDTHS = {"study": 13, "claim": 34, "source": 22, "published": 24, "ours": 44, "verdict": 13,
          "reason": 34}


def format_table(rows: list[dict], columns=COLUMNS, widths=None) -> str:
  """A plain-text table with wrapped cells; a blank line between rows."""
  widths = dict(WIDTHS, **(widths or {}))
  head = "  ".join(c.ljust(widths[c]) for c in columns)
  lines = [head, "-" * len(head)]
  for r in rows:
    cells = [textwrap.wrap(str(r[c]), widths[c]) or [""] for c in columns]
    for i in range(max(len(c) for c in cells)):
      lines.append("  ".join((c[i] if i < len(c) else "").ljust(widths[k])
                             for c, k in zip(cells, columns)).rstrip())
    lines.append("")
  return "\n".join(lines)


def to_markdown(rows: list[dict], columns=COLUMNS) -> str:
  """The rows as a Markdown table (for notebooks)."""
  esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(esc(r[c]) for c in columns) + " |" for r in rows]
  return "\n".join(lines)


GLANCE_START, GLANCE_END = "<!-- glance:start (claims.py --readme) -->", "<!-- glance:end -->"


def glance_markdown(rows: list[dict]) -> str:
  """The README's "Results at a glance" table: one line per claim of ``rows`` (claims.json's),
  its id, study, claim, verdict and seeds against the seeds its rule requires, then the
  counts of :func:`summary`."""
  lines = ["| id | study | claim | verdict | seeds (required) |", "|---|---|---|---|---|"]
  for r in rows:
    need = r.get("required_seeds")
    seeds = "-" if r["verdict"] == NOT_MEASURED else (
        f"{r.get('seeds', '-')}" + (f" ({need})" if need else ""))
    lines.append("| " + " | ".join(str(x).replace("|", "\\|") for x in (
        r.get("id") or "-", r["study"], r["claim"], r["verdict"], seeds)) + " |")
  return "\n".join(lines + ["", summary(rows) + "."])


def write_glance(readme: str, rows: list[dict]) -> bool:
  """Replaces the block between ``GLANCE_START`` and ``GLANCE_END`` of ``readme`` with
  :func:`glance_markdown`; returns whether the file changed.

  Raises:
    ValueError: ``readme`` lacks the markers.
  """
  with open(readme) as f:
    text = f.read()
  if GLANCE_START not in text or GLANCE_END not in text:
    raise ValueError(f"readme must hold the lines {GLANCE_START!r} and {GLANCE_END!r}; "
                     f"{readme} has {'neither' if GLANCE_START not in text else 'no end'}.")
  head, rest = text.split(GLANCE_START, 1)
  new = head + GLANCE_START + "\n" + glance_markdown(rows) + "\n" + GLANCE_END + \
      rest.split(GLANCE_END, 1)[1]
  if new != text:
    with open(readme, "w") as f:
      f.write(new)
  return new != text


def sources(results_dir: str, studies=STUDIES) -> dict:
  """Per study: whether results exist, their size (smoke or full), date and commit."""
  out = {}
  for s in studies:
    res = load(str(results_dir), s)
    env = (res or {}).get("environment", {})
    out[s] = None if res is None else {"smoke": _smoke(res), "date_utc": env.get("date_utc"),
                                       "git_commit": env.get("git_commit")}
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--results", default=None,
                 help="results folder with <study>/<study>.json (default: results/studies)")
  p.add_argument("--out", default=None,
                 help="JSON to write (default: <results>/claims.json with --results, else "
                      "runs/results/studies/claims.json)")
  p.add_argument("--readme", default=None,
                 help="also rewrite this README's results-at-a-glance block from the table")
  a = p.parse_args(argv)
  rows = all_claims(a.results or DEFAULT_RESULTS)
  if a.readme:
    print(f"{a.readme} {'rewritten' if write_glance(a.readme, rows) else 'unchanged'}")
  print(format_table(rows))
  print(summary(rows))
  if a.out:
    out = a.out
  elif a.results:
    out = os.path.join(a.results, "claims.json")
  else:  # the committed table is replaced only when its folder is named
    out = os.path.join(os.path.dirname(os.path.dirname(DEFAULT_RESULTS)), "runs", "results",
                       "studies", "claims.json")
  doc = {"generated_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
             timespec="seconds"),
         "rules": "experiments/studies/rules/<study>.json (thresholds, required seeds, "
                  "budgets, rules set after results); decisions in claims_<study>.py",
         "results": sources(a.results or DEFAULT_RESULTS), "claims": rows}
  if _same_but_date(out, doc):  # a rerun on unchanged results leaves a committed file alone
    print(f"{out} unchanged")
    return 0
  write_json(out, doc)
  print(f"wrote {out}")
  return 0


def _same_but_date(path: str, doc: dict) -> bool:
  """True when ``path`` holds ``doc`` already, apart from ``generated_utc``."""
  try:
    with open(path) as f:
      old = json.load(f)
  except (OSError, ValueError):
    return False
  new = json.loads(json.dumps(to_jsonable(doc)))
  return isinstance(old, dict) and {**old, "generated_utc": None} == {**new, "generated_utc": None}


if __name__ == "__main__":
  sys.exit(main())
