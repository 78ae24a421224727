"""What every study's claims share: the row, the verdicts, the statistics, the thresholds.

One function per study (``claims_<study>.py``: ``mqar_claims``, ``synthetic_claims``,
``lm_claims``, ``listops_claims``, ``cost_claims``, ``approximation_claims``,
``extrapolation_claims``, ``hybrid_claims``) takes the study's result dict
(``results/studies/<name>/<name>.json``) and returns claim rows, dicts with the keys of
``COLUMNS``:

* ``study``, ``claim`` (what the paper reports, in words), ``source`` (paper,
  table or figure), ``published`` (the published figure, as text);
* ``ours``: this project's figure with its uncertainty (binomial standard
  error ``sqrt(p (1 - p) / n)`` written ``p ± se``, or the seed spread) and the
  number of test items;
* ``verdict``: one of ``VERDICTS``; ``reason``: why, in a few words (the rule
  that decided, the budget).

Verdicts come from each study's rules (its module's docstring), applied to the numbers in the JSON; none
is written per result. "SE" is a standard error; a difference between two
independent accuracies is *significant* when it exceeds ``Z = 2`` times the
standard error of the difference, ``sqrt(se_a**2 + se_b**2)``. The binomial
SE counts every scored item as independent; the queries of one MQAR sequence
and the copied tokens of one selective-copying sequence are not, so there it
understates the uncertainty somewhat (the induction-heads test scores one
item per sequence, so its SE is exact).


Results at smoke size are judged by the same rules, with "smoke-size results"
in the reason: they carry no evidence. A study written part-way (runs "not
run" yet, ``--collect``) is judged on the runs it has, with "partial results"
in the reason. A results file missing, or in a format
older than the study script, gives "not measured" rows.
"""

from __future__ import annotations

import collections
import json
import math
import os
import pathlib
import sys

from linear_attention.nn import registry

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _study_utils import binomial_se  # noqa: E402,F401  (the studies' claims use it from here)

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_RESULTS = os.path.join(REPO_ROOT, "results", "studies")
RESULTS_ENV = "LA_RESULTS_DIR"


def results_dir() -> pathlib.Path:
  """The results folder the notebooks read: ``$LA_RESULTS_DIR``, else ``results/studies``.

  A relative ``$LA_RESULTS_DIR`` (``runs/smoke/studies``) is taken from the repository root,
  not from the working directory: Jupyter runs a notebook in ``notebooks/``. Relative
  folders come back relative to the working directory (``../results/studies`` in a
  notebook), so a notebook's printed path names no machine's directories; an absolute one
  comes back as given.
  """
  value = os.environ.get(RESULTS_ENV) or DEFAULT_RESULTS
  if os.path.isabs(value) and value != DEFAULT_RESULTS:
    out = pathlib.Path(value)
  else:
    out = pathlib.Path(os.path.relpath(os.path.join(REPO_ROOT, value)))
  _explain_missing_results(out)
  return out


# Result files that another script than the study's own writes.
_PRODUCERS = {"synthetic/mamba2_induction_probe.json": "experiments/probes/probe_mamba2_induction.py",
              "hybrid/diagnosis.json": "experiments/probes/hybrid_diagnosis.py"}


def missing_results_message(path: str | os.PathLike, results: str | os.PathLike) -> str | None:
  """What a notebook says when ``path`` (under ``results``) does not exist: the file and the
  command that writes it; None for a path outside ``results``."""
  rel = os.path.relpath(os.path.abspath(path), os.path.abspath(results))
  if rel.startswith(os.pardir):
    return None
  study = rel.split(os.sep)[0]
  script = _PRODUCERS.get(rel.replace(os.sep, "/"))
  if script:
    how = f"`python {script} --out {os.path.join(results, study)}`"
  else:
    how = (f"`python experiments/studies/run_studies.py --only {study}` (full size; add --smoke and "
           f"set {RESULTS_ENV}=runs/smoke/studies for a quick run)")
  return (f"results missing: {path} does not exist; it is written by {how}, or point "
          f"{RESULTS_ENV} at the folder that holds your results.")


def _explain_missing_results(results: pathlib.Path) -> None:
  """In a notebook (IPython), a ``FileNotFoundError`` for a file under ``results`` shows
  :func:`missing_results_message` instead of its traceback."""
  try:
    ip = get_ipython()  # noqa: F821 -- defined only inside IPython
  except NameError:
    return

  def handler(shell, etype, value, tb, tb_offset=None):
    msg = missing_results_message(getattr(value, "filename", "") or "", results)
    if msg is None:
      return shell.InteractiveTB.structured_traceback(etype, value, tb, tb_offset=tb_offset)
    print(msg, file=sys.stderr)
    return [msg]

  ip.set_custom_exc((FileNotFoundError,), handler)

COLUMNS = ("study", "claim", "source", "published", "ours", "verdict", "reason")
SMOKE_MARK = "smoke-size results (no evidence); "  # first in a smoke-size row's reason
REPRODUCED, IN_SHAPE, NOT_REPRODUCED, INCONCLUSIVE, NOT_MEASURED = (
    "reproduced", "reproduced in shape", "not reproduced", "inconclusive", "not measured")
VERDICTS = (REPRODUCED, IN_SHAPE, NOT_REPRODUCED, INCONCLUSIVE, NOT_MEASURED)
STUDIES = ("cost", "approximation", "mqar", "synthetic", "lm", "listops", "extrapolation",
           "hybrid", "frontier")
# A study whose results file is not ``<study>/<study>.json`` under the results folder.
RESULT_FILES = {"frontier": "mqar_frontier/frontier.json"}


def result_file(study: str) -> str:
  """``study``'s results file relative to the results folder (``mqar/mqar.json``)."""
  return RESULT_FILES.get(study, os.path.join(study, f"{study}.json"))

# Each study's claims, thresholds, required seeds and budget: committed before the runs they
# judge (the history shows it), read here rather than written in the code.
RULES_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rules")


def load_rules(study: str, rules_dir: str = RULES_DIR) -> dict:
  """The rule file ``<rules_dir>/<study>.json`` (``"common"``: the shared thresholds).

  Raises:
    ValueError: no rule file for ``study``.
  """
  path = os.path.join(rules_dir, f"{study}.json")
  if not os.path.exists(path):
    raise ValueError(f"study must have a rule file {path}; got study {study!r} without one.")
  with open(path) as f:
    return json.load(f)


_T = load_rules("common")["thresholds"]
Z = _T["z"]  # a difference is significant beyond Z standard errors
SOLVED = _T["solved"]  # accuracy at which a task counts as solved
LEARNED = _T["learned"]  # accuracy at which a task counts as learned (far above chance here)
CLOSE_BPB = _T["close_bpb"]  # bits per byte: "close to softmax"
LINEAR_SLOPE = tuple(_T["linear_slope"])
QUADRATIC_SLOPE = tuple(_T["quadratic_slope"])
CONSTANT_SLOPE = tuple(_T["constant_slope"])
SEPARATED_SLOPE = _T["separated_slope"]  # "in shape": linear below quadratic by this much
UNCLEAR_FRACTION = _T["inconclusive_unclear_fraction"]  # unclear beyond it: inconclusive
GATED = registry.select(gating="data")  # input-dependent gates or decays
# The claim names these two (Katharopoulos et al.'s ELU map and Performer), not every
# ungated feature map: Based's Taylor map is published as closing much of the gap.
UNGATED = ("linear", "performer")
SELECTIVE = ("mamba", "mamba2")


class SchemaError(ValueError):
  """The result dict lacks what the claims need (an older or a different format)."""


# ----------------------------------------------------------------------------- helpers


def _row(study, claim, source, published, ours, verdict, reason) -> dict:
  assert verdict in VERDICTS, verdict
  return dict(zip(COLUMNS, (study, claim, source, published, ours, verdict, reason)))


def _need(cond: bool, what: str) -> None:
  if not cond:
    raise SchemaError(what)


def diff_se(se_a: float, se_b: float) -> float:
  """Standard error of the difference of two independent estimates."""
  return math.sqrt(se_a ** 2 + se_b ** 2)


def significant(diff: float, se: float) -> bool:
  """``diff`` exceeds ``Z`` standard errors (positive direction)."""
  return diff > Z * se


def underpowered(diff: float, se: float) -> bool:
  """``|diff|`` within ``Z`` standard errors of the difference: neither direction shown."""
  return abs(diff) <= Z * se


def result_seeds(result: dict) -> int:
  """The fewest seeds behind any point of a study's result: its table rows' ``n_seeds``
  (rows without it, and results written before seeds were an axis: 1), else an int
  ``config.seeds`` (the approximation study's feature draws), else 1."""
  table = result.get("table") if isinstance(result, dict) else None
  if isinstance(table, list) and table and all(isinstance(r, dict) for r in table):
    return min(int(r.get("n_seeds", 1)) for r in table)
  seeds = result.get("config", {}).get("seeds") if isinstance(result, dict) else None
  return seeds if isinstance(seeds, int) and seeds > 0 else 1  # approximation: feature draws


RULES_SET = load_rules("common")["set_utc"]  # when the rule files were first committed


def _after_results(result: dict | None) -> bool:
  """Whether ``result`` was written before the rule files (its ``environment.date_utc``)."""
  date = ((result or {}).get("environment") or {}).get("date_utc")
  return bool(date) and str(date) < RULES_SET


def apply_rules(rows: list[dict], study: str, result: dict | None,
                rules: dict | None = None) -> list[dict]:
  """``rows`` of ``study`` judged by its rule file: each row gets the rule's ``id``,
  ``seeds`` (a claim function's own count, else :func:`result_seeds`) and
  ``required_seeds``; a verdict (other than not measured) resting on fewer seeds than
  required becomes :data:`INCONCLUSIVE`, its reason naming the verdict the numbers alone
  give; a rule's ``note`` and each rule change after results (``history``) are added to the
  reason, with the verdict under the old rule where the claim function gives it
  (``old_verdict``). A row whose claim the file does not name says so in its reason.
  """
  rules = rules if rules is not None else load_rules(study)
  by_claim = {c["claim"]: c for c in rules["claims"]}
  default_seeds = result_seeds(result) if result is not None else 0
  for row in rows:
    rule = by_claim.get(row["claim"])
    if rule is None:  # a claim the rule file does not name (a smoke grid's other mixers)
      row.update(id=None, required_seeds=None)
      row.setdefault("seeds", default_seeds)
      row["reason"] += f"; no rule for this claim in rules/{study}.json"
      row.pop("old_verdict", None)
      continue
    row["id"] = rule["id"]
    row.setdefault("seeds", default_seeds)
    row["required_seeds"] = need = rule["required_seeds"]
    if row["verdict"] != NOT_MEASURED and row["seeds"] < need:
      why = f" ({rule['why_seeds']})" if rule.get("why_seeds") else ""
      lead = (f"{row['seeds']} seed{'s' * (row['seeds'] != 1)} of the {need} its rule "
              f"requires{why}; by the numbers alone: {row['verdict']}; ")
      smoke = SMOKE_MARK if row["reason"].startswith(SMOKE_MARK) else ""
      row["reason"] = smoke + lead + row["reason"][len(smoke):]  # the smoke mark stays first
      row["verdict"] = INCONCLUSIVE
    if rule.get("note"):
      row["reason"] += "; " + rule["note"]
    # A row judged on another results file (a re-run) carries that file's date.
    own = row.pop("results_date_utc", None)
    if _after_results({"environment": {"date_utc": own}} if own else result):
      row["reason"] += (f"; rule file written after these results (rules/{study}.json, "
                        f"{RULES_SET[:10]}): a re-grade, not a rule fixed in advance")
    for h in rules.get("history") or []:
      if rule["id"] in h.get("applies_to", [rule["id"]]):
        row["reason"] += (f"; rule set after its results: {h['change']} in {h['commit']}, "
                          f"after {h['after_results']}")
        if h.get("old_rule"):
          row["reason"] += (f"; under the old rule ({h['old_rule']}): "
                            f"{row.get('old_verdict', 'not computed')}")
    row.pop("old_verdict", None)
  return rows


def _ranks(x: list[float]) -> list[float]:
  """Ranks 0..n-1; tied values share their average rank."""
  order = sorted(range(len(x)), key=lambda i: x[i])
  r = [0.0] * len(x)
  i = 0
  while i < len(order):
    j = i
    while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
      j += 1
    for k in range(i, j + 1):
      r[order[k]] = (i + j) / 2
    i = j + 1
  return r


def spearman(x: list[float], y: list[float]) -> float | None:
  """Spearman's rank correlation; None with under 3 points or a constant variable."""
  if len(x) < 3:
    return None
  rx, ry = _ranks(x), _ranks(y)
  mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
  sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
  sxx = sum((a - mx) ** 2 for a in rx)
  syy = sum((b - my) ** 2 for b in ry)
  if sxx == 0 or syy == 0:
    return None
  return sxy / math.sqrt(sxx * syy)


def _acc(p: float, se: float, n: int | None = None, unit: str = "") -> str:
  """``0.987 ± 0.004 (n=1,024)``; ``unit`` names the items (``"tokens"``)."""
  return f"{p:.3f} ± {se:.3f}" + (f" (n={n:,}{' ' + unit if unit else ''})" if n else "")


def _smoke(result: dict) -> bool:
  return bool(result.get("config", {}).get("smoke"))


def _finish(rows: list[dict], result: dict, runs: list[dict] = ()) -> list[dict]:
  """Marks smoke-size and partial results (``runs`` not done: not run yet, failed or stopped)
  in every row's reason."""
  unfinished = collections.Counter(r.get("status") for r in runs if r.get("status") != "done")
  if unfinished:
    n = sum(unfinished.values())
    why = ", ".join(f"{k} {v}" for k, v in sorted(unfinished.items()))
    for r in rows:
      r["reason"] = f"partial results: {n} of {len(runs)} runs unfinished ({why}); " + r["reason"]
  if _smoke(result):
    for r in rows:
      r["reason"] = SMOKE_MARK + r["reason"]
  return rows
