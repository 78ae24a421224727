"""The claims table: each published claim a study tests, its published figure, ours, a verdict.

One function per study (``mqar_claims``, ``synthetic_claims``, ``lm_claims``,
``listops_claims``, ``cost_claims``, ``approximation_claims``) takes the
study's result dict (``results/studies/<name>/<name>.json``) and returns
claim rows, dicts with the keys of ``COLUMNS``:

* ``study``, ``claim`` (what the paper reports, in words), ``source`` (paper,
  table or figure), ``published`` (the published figure, as text);
* ``ours``: this project's figure with its uncertainty (binomial standard
  error ``sqrt(p (1 - p) / n)`` written ``p ± se``, or the seed spread) and the
  number of test items;
* ``verdict``: one of ``VERDICTS``; ``reason``: why, in a few words (the rule
  that decided, the budget).

Verdicts come from the rules below, applied to the numbers in the JSON; none
is written per result. "SE" is a standard error; a difference between two
independent accuracies is *significant* when it exceeds ``Z = 2`` times the
standard error of the difference, ``sqrt(se_a**2 + se_b**2)``. The binomial
SE counts every scored item as independent; the queries of one MQAR sequence
and the copied tokens of one selective-copying sequence are not, so there it
understates the uncertainty somewhat (the induction-heads test scores one
item per sequence, so its SE is exact).

MQAR (Zoology, Arora et al. 2023, figure 2); points are the best rows of ``table``:
the best learning rate and, for the Mamba family (``INIT_SWEPT``), the best decay
init (Zoology tunes the rate per point; the init is tuned the same way), with the
default init's accuracy shown beside where another init was tried; *recurrent* =
not softmax, with the short convolution:

* attention solves MQAR: the lowest softmax accuracy (short convolution on)
  over every trained (setting, width) is >= ``SOLVED`` (0.95): reproduced;
  else, softmax >= ``LEARNED`` (0.5) everywhere and no recurrent mixer
  significantly above it at any point: reproduced in shape; else not
  reproduced.
* accuracy grows with state size: the Spearman rank correlation between
  state size and accuracy over the recurrent points, per setting, is positive
  in every setting with >= 3 points, and more than half of the (mixer,
  setting) pairs improve significantly from the smallest to the largest width
  (pairs solved, >= ``SOLVED``, at both widths are left out: they cannot
  improve): reproduced in shape (the claim is a trend, so never
  "reproduced"); else not reproduced; no setting with 3 points, or fewer than
  2 pairs at two widths: not measured.
* recurrent models fall short of attention on the larger setting: at the
  longest setting, softmax minus the best accuracy of the fixed-state
  recurrences Zoology's claim is about (every recurrent mixer but those of
  ``RECALL_MIXERS``) at each width is significantly positive everywhere:
  reproduced; positive everywhere: reproduced in shape; else not reproduced.
* recall-oriented models close the gap (Based, Arora et al. 2024; DeltaNet,
  Yang et al. 2024): every point of a ``RECALL_MIXERS`` mixer >= ``SOLVED``:
  reproduced; each mixer's accuracy not significantly below softmax's at
  every point it shares with it: reproduced in shape; else not reproduced.
* recipe (not a paper claim): softmax with the short convolution minus
  without it, per (setting, width): significantly positive everywhere:
  reproduced; positive at most points: reproduced in shape; else not reproduced.
* decay init (not a paper claim): at every Mamba-family point trained with an
  init other than the default, the best other init minus the default (negative
  where the default is better): significantly positive everywhere: reproduced;
  at more than half: reproduced in shape; else not reproduced; no such point:
  not measured. An init trained for fewer steps than the default says so; one
  stopped part-way (scored at its newest checkpoint, ``stopped_at``) is judged
  against the default init at the same step (validation accuracy, the table's
  ``same_step``), and the reason names where it stopped.
* Mamba-2 above Mamba (Mamba-2 paper, figure 8): mamba2 minus mamba at every
  point both have, each at its best init: significantly positive everywhere:
  reproduced; positive at most points: reproduced in shape; else not
  reproduced. The default init's difference is shown beside, and the reason
  says at how many points both inits were swept.

Every MQAR claim is judged on the tuned points, with the default init's figures
beside where a Mamba-family point enters it: the state-size claim its Spearman
and pairs, the gap claim its gap (or that it is the same: no tuned init is the
best recurrent model at any width), the decay-init and Mamba-2 claims each
point's default accuracy. The cuts of the budget (points of the configured grid
never trained, ``not run``: a learning rate left out for CPU time, with how that
rate did where it was trained; inits not swept, trained for fewer steps or
stopped part-way) are named in the reason of each claim whose points they touch,
not in every claim; runs that were started and did not finish (and were not
scored at a checkpoint) mark the results partial.

Synthetic tasks (Mamba, Gu & Dao 2023):

* selective copying (table 1): Mamba >= ``SOLVED`` and S4D < ``LEARNED``
  (0.5): reproduced; Mamba significantly above S4D: reproduced in shape; else
  not reproduced. The same rule for the long-spread study
  (``study_selective_copying.py``, its ``selective_copying/selective_copying.json``), a row
  of the synthetic table; smoke-size results of it give no row.
* induction heads at the training length (table 2): Mamba >= ``SOLVED``:
  reproduced; >= ``LEARNED``: reproduced in shape; else not reproduced.
* extrapolation of a selective model (mamba, and mamba2 where present): not
  measured when the model did not learn the task (< ``LEARNED`` at the
  training length); else its lowest accuracy beyond the training length
  >= ``SOLVED``: reproduced; >= ``LEARNED``: reproduced in shape; else not
  reproduced.
* Mamba-2 learns induction heads (not in the paper; the probe
  ``mamba2_induction_probe.json`` beside the study's file, one change of
  Mamba-2 towards Mamba-1, or of Mamba-1 towards Mamba-2, per run): the
  default Mamba-2 or another Mamba-2 variant >= ``LEARNED`` on the sparse
  test: reproduced in shape, naming what learns (its overrides, and from which
  step) and what stays at chance (each variant at its longest run); none:
  not reproduced.
* attention with RoPE fails beyond about 2x: not measured when softmax did
  not learn the task at the training length; every tested length beyond 2x
  below ``LEARNED``: reproduced; the first length beyond 2x significantly below
  the training length: reproduced in shape; else not reproduced.

Language modelling (GLA, Yang et al. 2024; Mamba; Katharopoulos et al. 2020),
per corpus, one seed per run:

* gated mixers (``GATED``) within ``CLOSE_BPB`` (0.05) bits/byte of softmax or
  better: a majority of them: reproduced; at least one: reproduced in shape;
  none: not reproduced.
* ungated mixers (``UNGATED``) worse than softmax by more than ``CLOSE_BPB``:
  all of them: reproduced; all worse by any amount: reproduced in shape; else
  not reproduced.

ListOps (Long Range Arena, Tay et al. 2021, table 1), on a reduced task, so
at most "reproduced in shape"; not measured when softmax is not significantly
above the majority-class rate (it learned nothing to compare):

* efficient variants do not beat the Transformer: no mixer significantly
  above softmax: reproduced in shape; else not reproduced.
* Performer falls far below the Transformer: Performer significantly below
  softmax: reproduced in shape; else not reproduced.

Cost (Katharopoulos et al. 2020, section 3), forward pass, fitted log-log
slopes (no uncertainty in the JSON; the number of lengths fitted is shown):

* time and memory: linear attention's slope within ``LINEAR_SLOPE`` (0.8-1.2)
  and naive softmax's within ``QUADRATIC_SLOPE`` (1.7-2.5): reproduced;
  linear's slope below softmax's by more than 0.5: reproduced in shape; else
  not reproduced.
* decoding: the linear step's latency slope against the position within
  ``CONSTANT_SLOPE`` (-0.2-0.2) and the KV-cache step's >= 0.8: reproduced;
  the linear slope below the KV cache's by more than 0.5: reproduced in shape;
  else not reproduced.

Approximation (Choromanski et al. 2021, FAVOR+), per setting (causal or not,
logit scale), from ``comparison``: the paired test over seeds on the log MSE
(``outcome_log``: holds / fails / unclear at each feature count ``m``):

* holds at more than half of the comparisons and fails at none: reproduced;
  holds at more than it fails: reproduced in shape; else not reproduced (all
  unclear: no significant difference).

Length extrapolation (``study_extrapolation.py``): per mixer, the paired change (per
evaluated window) of the mean loss in each position bucket beyond the training length
against the last bucket inside it (positions L/2 to L), with its SE over windows:

* softmax with RoPE degrades: its last bucket significantly above and by more than
  ``EXTRAP_TOL`` (0.05 nats): reproduced; some bucket beyond significantly above:
  reproduced in shape; else not reproduced.
* Mamba, GLA and RetNet (``EXTRAP_GATED``, with Mamba-2) extrapolate: each one's worst bucket beyond at
  most ``EXTRAP_TOL`` above or not significantly above: reproduced; some flat and every one
  rising less than softmax: reproduced in shape; else not reproduced.

Hybrids (``study_hybrid.py``), rows classed by their pattern (only ``A``: softmax; one
recurrent letter: recurrent; mixed with ``A``: hybrid):

* recall (MQAR), judged on the best hybrid (the reason gives the others' verdicts): the
  hybrid significantly above the pure recurrent model and solved (>= ``SOLVED``) or not
  significantly below pure softmax: reproduced; significantly above the recurrent model
  only: reproduced in shape; else not reproduced.
* language modelling: the hybrid's bits per byte at or below both pure models': reproduced;
  within ``CLOSE_BPB`` of the better: reproduced in shape; else not reproduced (one seed).

Results at smoke size are judged by the same rules, with "smoke-size results"
in the reason: they carry no evidence. A study written part-way (runs "not
run" yet, ``--collect``) is judged on the runs it has, with "partial results"
in the reason. A results file missing, or in a format
older than the study script, gives "not measured" rows.

    python experiments/claims.py [--results DIR] [--out FILE]

prints the table and writes ``<results>/claims.json`` (default
``results/studies/claims.json``).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import os
import pathlib
import sys
import textwrap

from linear_attention.io import to_jsonable, write_json
from linear_attention.nn import registry

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _study_utils import binomial_se  # noqa: E402

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
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
_PRODUCERS = {"synthetic/mamba2_induction_probe.json": "experiments/probe_mamba2_induction.py",
              "hybrid/diagnosis.json": "experiments/hybrid_diagnosis.py"}


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
    how = (f"`python experiments/run_studies.py --only {study}` (full size; add --smoke and "
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
REPRODUCED, IN_SHAPE, NOT_REPRODUCED, NOT_MEASURED = (
    "reproduced", "reproduced in shape", "not reproduced", "not measured")
VERDICTS = (REPRODUCED, IN_SHAPE, NOT_REPRODUCED, NOT_MEASURED)
STUDIES = ("cost", "approximation", "mqar", "synthetic", "lm", "listops", "extrapolation",
           "hybrid")

Z = 2.0  # a difference is significant beyond Z standard errors
SOLVED = 0.95  # accuracy at which a task counts as solved
LEARNED = 0.5  # accuracy at which a task counts as learned (far above chance here)
CLOSE_BPB = 0.05  # bits per byte: "close to softmax"
LINEAR_SLOPE = (0.8, 1.2)
QUADRATIC_SLOPE = (1.7, 2.5)
CONSTANT_SLOPE = (-0.2, 0.2)
SEPARATED_SLOPE = 0.5  # "in shape": the linear slope below the quadratic one by this much
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
      r["reason"] = "smoke-size results (no evidence); " + r["reason"]
  return rows


# ----------------------------------------------------------------------------- MQAR

MQAR_SOURCE = "Zoology (Arora et al. 2023), figure 2"
# Mixers built to fix recall after Zoology (Based's Taylor features, the delta rule): left out
# of Zoology's gap claim and tested in their own.
RECALL_MIXERS = ("based", "rebased", "deltanet", "gated_deltanet")
MQAR_CLAIMS = {
    "attention": ("Attention solves MQAR at every width and setting", MQAR_SOURCE,
                  "near 100% at every width and setting"),
    "state": ("Recurrent models need a larger state: accuracy grows with state size", MQAR_SOURCE,
              "accuracy rises with state size / width"),
    "gap": ("Recurrent models fall short of attention on the larger setting", MQAR_SOURCE,
            "attention near 100%; recurrent models below it"),
    "recall": ("Recall-oriented linear models (Taylor-feature Based, the delta rule) come close "
               "to attention on MQAR",
               "Arora et al. 2024 (Based), MQAR recall vs state size; Yang et al. 2024 (DeltaNet), "
               "synthetic MQAR", "near attention's accuracy, above other subquadratic models"),
    "recipe": ("Recipe: a short convolution before attention helps it learn MQAR (equal budget)",
               "Zoology configs: short convolution before every mixer",
               "(recipe; no published figure)"),
    "init": ("Recipe: a slower initial decay helps the Mamba family learn MQAR (equal budget)",
             "this study: decay-init sweep (Mamba-2 exposes A_init_range)",
             "(recipe; no published figure)"),
    "mamba2": ("Mamba-2 recalls better than Mamba on MQAR (decay init tuned per point)",
               "Dao & Gu 2024 (Mamba-2), section 9.1, figure 8",
               "Mamba-2 above Mamba-1 at every state size"),
}
# The Mamba family, whose decay init the MQAR study sweeps (``INITS`` of study_mqar.py).
INIT_SWEPT = ("mamba", "mamba2", "hawk")


def mqar_claims(result: dict) -> list[dict]:
  """Claim rows of the MQAR study (``experiments/study_mqar.py``); rules in the module doc."""
  table = result.get("table") or []
  _need(all("short_conv" in r and "accuracy" in r and "se" in r and "state_floats" in r
            for r in table), "MQAR table rows lack short_conv/accuracy/se/state_floats")
  _need("budget" in result, "MQAR result lacks budget")
  rows = []
  study = "mqar"
  b = result["budget"]
  frac = b.get("fraction_of_paper_examples")
  runs = result.get("runs") or []
  base = (f"budget: <= {b.get('training_examples_max', 0):,} examples per point"
          + (f" ({100 * frac:.2g}% of Zoology's)" if frac else ""))

  def scope(judged) -> str:
    """The budget text with the grid's cuts among the points ``judged(mixer, short_conv)``
    selects: each claim names the cuts that touch its own points, not every cut."""
    return base + _mqar_cuts(table, runs, judged)

  def add(key, ours, verdict, reason):
    rows.append(_row(study, *MQAR_CLAIMS[key], ours, verdict, reason))

  soft = [r for r in table if r["mixer"] == "softmax" and r["short_conv"] > 0]
  rec = [r for r in table if r["mixer"] != "softmax" and r["short_conv"] > 0]
  where = lambda r: f"T={r['seq_len']}, d={r['d_model']}"  # noqa: E731

  # 1. Attention solves MQAR (the recurrent points count only where softmax is below SOLVED).
  solved = bool(soft) and min(r["accuracy"] for r in soft) >= SOLVED
  budget = scope(lambda m, c: c > 0 and (m == "softmax" or not solved))
  if not soft:
    add("attention", "no softmax run with the short convolution", NOT_MEASURED, budget)
  else:
    low = min(soft, key=lambda r: r["accuracy"])
    cfg = result.get("config", {})
    grid = len(cfg.get("settings") or []) * len(cfg.get("widths") or [])
    ours = (f"min {_acc(low['accuracy'], low['se'], low['test_queries'])} at {where(low)}; "
            f"{len(soft)} point{'s' * (len(soft) != 1)}"
            + (f" of {grid} configured" if grid and grid != len(soft) else ""))
    if low["accuracy"] >= SOLVED:
      add("attention", ours, REPRODUCED, f">= {SOLVED} everywhere; {budget}")
    else:
      behind = []
      for s in soft:
        peers = [r for r in rec if (r["seq_len"], r["d_model"]) == (s["seq_len"], s["d_model"])]
        if peers:
          top = max(peers, key=lambda r: r["accuracy"])
          if significant(top["accuracy"] - s["accuracy"], diff_se(top["se"], s["se"])):
            behind.append(f"{top['mixer']} at {where(s)}")
      if behind:
        add("attention", ours, NOT_REPRODUCED,
            f"below {SOLVED}; beaten by {', '.join(behind)}; {budget}")
      elif low["accuracy"] < LEARNED:
        add("attention", ours, NOT_REPRODUCED, f"below {LEARNED} at {where(low)}; {budget}")
      else:
        add("attention", ours, IN_SHAPE,
            f"below {SOLVED}, but no mixer significantly better; {budget}")

  # 2. Accuracy grows with state size (recurrent models), judged on the tuned inits.
  budget = scope(lambda m, c: c > 0 and m != "softmax")
  rhos, counted, pairs, improved, saturated = _state_trend(rec)
  widths = sorted({r["d_model"] for r in rec})
  ours = "; ".join(f"Spearman {'-' if rho is None else f'{rho:+.2f}'} (T={t}, {n} points)"
                   for t, n, rho in rhos) or "fewer than 3 recurrent points per setting"
  if pairs or saturated:
    ours += (f"; {improved}/{pairs} (mixer, setting) pairs improve by > {Z:g} SE from "
             f"d={widths[0]} to d={widths[-1]}"
             + (f" ({saturated} more solved at both widths)" if saturated else ""))
  if any(r.get("best_init", "default") != "default" for r in rec):
    d_rhos, _, d_pairs, d_improved, _ = _state_trend([_default_init(r) for r in rec])
    ours += "; default init: " + ", ".join(
        f"Spearman {'-' if rho is None else f'{rho:+.2f}'} (T={t})" for t, _, rho in d_rhos) \
        + (f", {d_improved}/{d_pairs} pairs improve" if d_pairs else "")
  if not counted:
    add("state", ours, NOT_MEASURED, f"too few recurrent points; {budget}")
  elif not pairs and not saturated:
    add("state", ours, NOT_MEASURED, f"one width only: no pair to compare; {budget}")
  elif pairs + saturated < 2:
    add("state", ours, NOT_MEASURED, f"one (mixer, setting) pair at two widths: too few to "
        f"show a trend; {budget}")
  else:
    positive = all(rho is not None and rho > 0 for _, _, rho in rhos)
    most = pairs > 0 and improved > pairs / 2
    if positive and most:
      add("state", ours, IN_SHAPE, f"positive correlation and most pairs improve; {budget}")
    else:
      why = [] if positive else ["correlation not positive in every setting"]
      why += [] if most else ["no majority of pairs improves" if pairs else
                              "every pair solved at both widths"]
      add("state", ours, NOT_REPRODUCED, f"{'; '.join(why)}; {budget}")

  # 3. The gap at the largest setting (the study's, whether trained yet or not), for the
  # fixed-state recurrences of Zoology's claim.
  configured = [t for t, _ in result.get("config", {}).get("settings") or []]
  t_max = max(configured or [r["seq_len"] for r in soft + rec] or [None])
  fixed = [r for r in rec if r["mixer"] not in RECALL_MIXERS]
  budget = scope(lambda m, c: c > 0 and m not in RECALL_MIXERS)
  gaps = []
  for d in sorted({r["d_model"] for r in soft if r["seq_len"] == t_max}):
    s = next(r for r in soft if r["seq_len"] == t_max and r["d_model"] == d)
    peers = [r for r in fixed if r["seq_len"] == t_max and r["d_model"] == d]
    if peers:
      top = max(peers, key=lambda r: r["accuracy"])
      gaps.append((d, top["mixer"], s["accuracy"] - top["accuracy"], diff_se(s["se"], top["se"])))
  if not gaps:
    add("gap", f"no softmax and recurrent runs at the same width at T={t_max}", NOT_MEASURED,
        budget)
  else:
    ours = f"softmax - best recurrent at T={t_max}: " + "; ".join(
        f"d={d} {g:+.3f} ± {se:.3f} ({m})" for d, m, g, se in gaps)
    tuned_top = [d for d, m, *_ in gaps
                 if next(r for r in fixed if (r["mixer"], r["seq_len"], r["d_model"])
                         == (m, t_max, d)).get("best_init", "default") != "default"]
    ours += (f"; a tuned init is the best recurrent at d={', '.join(map(str, tuned_top))}"
             if tuned_top else "; default init: the same (no tuned init is the best recurrent "
             "at any width)")
    if tuned_top:
      d_gaps = []
      for d, *_ in gaps:
        s = next(r for r in soft if r["seq_len"] == t_max and r["d_model"] == d)
        top = max((_default_init(r) for r in fixed if r["seq_len"] == t_max
                   and r["d_model"] == d), key=lambda r: r["accuracy"])
        d_gaps.append(f"d={d} {s['accuracy'] - top['accuracy']:+.3f} ({top['mixer']})")
      ours += "; default init: " + "; ".join(d_gaps)
    if all(significant(g, se) for _, _, g, se in gaps):
      add("gap", ours, REPRODUCED, f"gap > {Z:g} SE at every width; {budget}")
    elif all(g > 0 for _, _, g, _ in gaps):
      add("gap", ours, IN_SHAPE, f"gap positive but not > {Z:g} SE at every width; {budget}")
    else:
      add("gap", ours, NOT_REPRODUCED, f"a recurrent mixer matches or beats softmax; {budget}")

  # 4. Recall-oriented mixers against softmax, at every point they share with it.
  recall = [r for r in rec if r["mixer"] in RECALL_MIXERS]
  budget = scope(lambda m, c: c > 0 and (m in RECALL_MIXERS or m == "softmax"))
  if not recall:
    add("recall", "no run of " + ", ".join(RECALL_MIXERS), NOT_MEASURED, budget)
  else:
    lows, behind = [], []
    for m in sorted({r["mixer"] for r in recall}):
      pts = [r for r in recall if r["mixer"] == m]
      low = min(pts, key=lambda r: r["accuracy"])
      lows.append(f"{m} min {low['accuracy']:.3f} ± {low['se']:.3f} ({len(pts)} points)")
      for r in pts:
        s = next((x for x in soft if (x["seq_len"], x["d_model"]) == (r["seq_len"], r["d_model"])),
                 None)
        if s is not None and significant(s["accuracy"] - r["accuracy"], diff_se(s["se"], r["se"])):
          behind.append(f"{m} at {where(r)}")
    ours = "; ".join(lows)
    if min(r["accuracy"] for r in recall) >= SOLVED:
      add("recall", ours, REPRODUCED, f">= {SOLVED} at every point; {budget}")
    elif not behind:
      add("recall", ours, IN_SHAPE, f"below {SOLVED}, not below softmax by > {Z:g} SE; {budget}")
    else:
      add("recall", ours, NOT_REPRODUCED, f"below softmax by > {Z:g} SE: {', '.join(behind)}; "
          f"{budget}")

  # 5. Recipe: softmax with and without the short convolution.
  without = [r for r in table if r["mixer"] == "softmax" and r["short_conv"] == 0]
  budget = scope(lambda m, c: m == "softmax")
  diffs = []
  for r0 in without:
    r1 = next((r for r in soft if (r["seq_len"], r["d_model"]) == (r0["seq_len"], r0["d_model"])),
              None)
    if r1 is not None:
      diffs.append((r0, r1, r1["accuracy"] - r0["accuracy"], diff_se(r1["se"], r0["se"])))
  if not diffs:
    add("recipe", "no softmax run without the short convolution", NOT_MEASURED, budget)
  else:
    ours = "with - without: " + "; ".join(
        f"{where(r0)} {g:+.3f} ± {se:.3f}" for r0, _, g, se in diffs)
    n_sig = sum(significant(g, se) for *_, g, se in diffs)
    if n_sig == len(diffs):
      add("recipe", ours, REPRODUCED, f"better by > {Z:g} SE at every point; {budget}")
    elif sum(g > 0 for *_, g, _ in diffs) > len(diffs) / 2:
      add("recipe", ours, IN_SHAPE,
          f"better at most points, by > {Z:g} SE at {n_sig}/{len(diffs)}; {budget}")
    else:
      add("recipe", ours, NOT_REPRODUCED, f"not better at most points; {budget}")

  # 6. The decay init of the Mamba family: the best init against the default, per point
  # where another init was trained (each at its best learning rate).
  swept = [r for r in rec if r["mixer"] in INIT_SWEPT and len(_inits(r)) > 1]
  budget = scope(lambda m, c: c > 0 and m in INIT_SWEPT)
  if not swept:
    add("init", "no point trained with a decay init other than the default", NOT_MEASURED,
        budget)
  else:
    # The best init other than the default against the default: the question is whether a
    # slower decay helps, so a point where it does not counts against it.
    diffs, texts = [], []
    for r in swept:
      n = r["test_queries"]
      d_acc, other = r.get("default_init_accuracy"), _best_other_init(r)
      if d_acc is None or other is None:
        continue
      name, acc, steps, key = other
      stopped = (r.get("init_stopped_at") or {}).get(key)
      same = (r.get("same_step") or {}).get(key)
      if stopped and same:
        # Stopped before the default's budget: judged against the default at the same step
        # (validation accuracy), not against the default's final accuracy.
        v = same.get("queries") or n
        g, se = same["accuracy"] - same["default_accuracy"], diff_se(
            binomial_se(same["accuracy"], v), binomial_se(same["default_accuracy"], v))
        text = (f"{name} {acc:.3f} at its step-{stopped} checkpoint, default {d_acc:.3f}; "
                f"judged at step {same['step']}: {same['accuracy']:.3f} vs "
                f"{same['default_accuracy']:.3f}, validation, n={v:,}")
      else:
        g = acc - d_acc
        se = diff_se(binomial_se(acc, n), r.get("default_init_se", binomial_se(d_acc, n)))
        text = (f"{name} {acc:.3f}"
                + (f" in {steps} steps" if steps and steps < (_default_steps(r) or steps) else "")
                + f", default {d_acc:.3f}")
      diffs.append((r, g, se, d_acc))
      texts.append(f"{r['mixer']} {where(r)} {g:+.3f} ± {se:.3f} ({text})")
    ours = "best other init - default: " + "; ".join(texts)
    n_sig = sum(significant(g, se) for _, g, se, _ in diffs)
    if diffs and n_sig == len(diffs):
      add("init", ours, REPRODUCED, f"better by > {Z:g} SE at every point swept; {budget}")
    elif diffs and n_sig > len(diffs) / 2:
      add("init", ours, IN_SHAPE, f"better by > {Z:g} SE at {n_sig}/{len(diffs)} points "
          f"swept; {budget}")
    else:
      add("init", ours, NOT_REPRODUCED, f"better by > {Z:g} SE at {n_sig}/{len(diffs)} points "
          f"swept; {budget}")

  # 7. Mamba-2 against Mamba, each at its best init and learning rate.
  pairs2 = []
  budget = scope(lambda m, c: c > 0 and m in ("mamba", "mamba2"))
  for r2 in (r for r in rec if r["mixer"] == "mamba2"):
    r1 = next((r for r in rec if r["mixer"] == "mamba"
               and (r["seq_len"], r["d_model"]) == (r2["seq_len"], r2["d_model"])), None)
    if r1 is not None:
      pairs2.append((r2, r1, r2["accuracy"] - r1["accuracy"], diff_se(r2["se"], r1["se"])))
  if not pairs2:
    add("mamba2", "no mamba and mamba2 runs at the same point", NOT_MEASURED, budget)
  else:
    both = sum(len(_inits(r2)) > 1 and len(_inits(r1)) > 1 for r2, r1, *_ in pairs2)
    tuned = any(len(_inits(r)) > 1 for r2, r1, *_ in pairs2 for r in (r2, r1))

    def default_gap(r2, r1):
      d2, d1 = _default_init(r2), _default_init(r1)
      return f"; both at the default init {d2['accuracy'] - d1['accuracy']:+.3f}"

    def at_best(r):
      stop = f", stopped at step {r['stopped_at']}" if r.get("stopped_at") else ""
      return f"{r['mixer']} {r['accuracy']:.3f} [{r.get('best_init', 'default')} init{stop}]"

    ours = "mamba2 - mamba, each at its best init: " + "; ".join(
        f"{where(r2)} {g:+.3f} ± {se:.3f} ({at_best(r2)} vs {at_best(r1)}"
        + (default_gap(r2, r1) if len(_inits(r2)) > 1 or len(_inits(r1)) > 1 else "") + ")"
        for r2, r1, g, se in pairs2)
    note = ("default init only; " if not tuned else "" if both == len(pairs2) else
            f"init swept for both at {both}/{len(pairs2)} points; ")
    n_sig = sum(significant(g, se) for *_, g, se in pairs2)
    if n_sig == len(pairs2):
      add("mamba2", ours, REPRODUCED, f"{note}above by > {Z:g} SE at every point; {budget}")
    elif sum(g > 0 for *_, g, _ in pairs2) > len(pairs2) / 2:
      add("mamba2", ours, IN_SHAPE, f"{note}above at most points, by > {Z:g} SE at "
          f"{n_sig}/{len(pairs2)}; {budget}")
    else:
      add("mamba2", ours, NOT_REPRODUCED, f"{note}not above at most points; {budget}")
  # Points the grid left out on purpose and runs stopped part-way but scored at their newest
  # checkpoint (``_mqar_cuts`` names both) are the budget, not an unfinished study.
  return _finish(rows, result, [r for r in runs if r.get("status") not in ("not run", "stopped")
                                or (r.get("status") == "stopped" and "test_accuracy" not in r)])


def _state_trend(rec: list[dict]):
  """The state-size trend of the recurrent rows ``rec``: ``(rhos, counted, pairs, improved,
  saturated)``; ``rhos`` holds ``(T, points, Spearman)`` for each setting with >= 3 points
  (``counted`` their T), and of the (mixer, setting) pairs at two widths, ``improved`` rise
  by > Z SE from the smallest to the largest and ``saturated`` are solved at both."""
  settings = sorted({r["seq_len"] for r in rec})
  rhos, counted = [], []
  for t in settings:
    pts = [r for r in rec if r["seq_len"] == t]
    if len(pts) >= 3:
      counted.append(t)
      rhos.append((t, len(pts), spearman([r["state_floats"] for r in pts],
                                         [r["accuracy"] for r in pts])))
  pairs = improved = saturated = 0
  for m in sorted({r["mixer"] for r in rec}):
    for t in settings:
      pts = sorted((r for r in rec if r["mixer"] == m and r["seq_len"] == t),
                   key=lambda r: r["d_model"])
      if len(pts) >= 2 and pts[0]["d_model"] != pts[-1]["d_model"]:
        lo, hi = pts[0], pts[-1]
        if lo["accuracy"] >= SOLVED and hi["accuracy"] >= SOLVED:
          saturated += 1  # solved at both widths: nothing left to grow
          continue
        pairs += 1
        improved += significant(hi["accuracy"] - lo["accuracy"], diff_se(hi["se"], lo["se"]))
  return rhos, counted, pairs, improved, saturated


def _mqar_cuts(table: list[dict], runs: list[dict], judged=lambda mixer, conv: True) -> str:
  """What the MQAR grid cut from its configured size, as budget text: the learning rates
  never trained at some points (with how the rate did where it was tried), the init-sweep
  points trained for fewer steps than the rest or stopped part-way, and the Mamba-family
  points the init sweep left out (when it reached some). Only the points of the mixers
  ``judged(mixer, short_conv)`` selects count (a claim's own points)."""
  out = ""
  table = [r for r in table if judged(r["mixer"], r.get("short_conv", 0))]
  cut = [r["overrides"] for r in runs if r.get("status") == "not run"
         and judged(r["overrides"]["model.mixer"], r["overrides"]["model.short_conv"])]
  for lr in sorted({o["optim.lr"] for o in cut}, reverse=True):
    at = [o for o in cut if o["optim.lr"] == lr]
    mixers = sorted({o["model.mixer"] + ("" if o["model.short_conv"] else " (no conv)")
                     for o in at})
    tried = [(r["lr_accuracies"][str(lr)], max(r["lr_accuracies"].values()))
             for r in table if str(lr) in (r.get("lr_accuracies") or {})]
    out += (f"; lr {lr:g} not trained at {len(at)} point{'s' * (len(at) != 1)} "
            f"({', '.join(mixers)})"
            + (f", trained at {len(tried)}, where it was below the best rate at "
               f"{sum(a < m for a, m in tried)}" if tried else ""))
  full = max((s for r in table for s in (r.get("init_steps") or {}).values() if s), default=0)
  short = sorted({(k.split("@")[0], s) for r in table
                  for k, s in (r.get("init_steps") or {}).items() if s and s < full})
  for init, steps in short:
    n = sum(1 for r in table if any(k.split("@")[0] == init and s == steps
                                    for k, s in (r.get("init_steps") or {}).items()))
    out += f"; {init} init trained {steps} of {full} steps at {n} point{'s' * (n != 1)}"
  family = [r for r in table if r["mixer"] in INIT_SWEPT and r.get("short_conv")]
  unswept = [f"{r['mixer']} T={r['seq_len']}, d={r['d_model']}" for r in family
             if _inits(r) == {"default"}]
  if unswept and any(_inits(r) != {"default"} for r in family):
    out += (f"; decay init not swept at {len(unswept)} point{'s' * (len(unswept) != 1)} "
            f"({', '.join(unswept)})")
  stopped = [(k.split("@")[0], r, s) for r in table
             for k, s in (r.get("init_stopped_at") or {}).items()]
  for init in sorted({i for i, _, _ in stopped}):
    at = [f"{r['mixer']} T={r['seq_len']}, d={r['d_model']} at step {s}"
          for i, r, s in stopped if i == init]
    out += (f"; {init} init stopped part-way at {len(at)} point{'s' * (len(at) != 1)} "
            f"({', '.join(at)}), scored at that checkpoint")
  return out


def _default_init(row: dict) -> dict:
  """``row`` with the default decay init's accuracy and SE in place of the tuned ones (the
  row itself where no other init was tried)."""
  if row.get("default_init_accuracy") is None or _inits(row) == {"default"}:
    return row
  n = row["test_queries"]
  return dict(row, accuracy=row["default_init_accuracy"], best_init="default",
              se=row.get("default_init_se", binomial_se(row["default_init_accuracy"], n)))


def _best_other_init(row: dict) -> tuple[str, float, int | None, str] | None:
  """The best (init, accuracy, steps, ``init@lr`` key) among ``row``'s inits other than the
  default."""
  other = [(k.split("@")[0], a, (row.get("init_steps") or {}).get(k), k)
           for k, a in (row.get("init_accuracies") or {}).items()
           if k.split("@")[0] != "default"]
  return max(other, key=lambda x: x[1]) if other else None


def _default_steps(row: dict) -> int | None:
  """The most steps the default init trained at ``row``'s point (None when not recorded)."""
  return max((s for k, s in (row.get("init_steps") or {}).items()
              if s and k.split("@")[0] == "default"), default=None)


def _inits(row: dict) -> set[str]:
  """The decay inits a table row's point was trained with (``init_accuracies`` keys
  ``init@lr``; rows written before the init sweep: the default only)."""
  return {k.split("@")[0] for k in row.get("init_accuracies") or {}} or {"default"}


# ----------------------------------------------------------------------------- synthetic

MAMBA = "Mamba (Gu & Dao 2023)"
SYN_CLAIMS = {
    "copying": ("Selective copying: time-invariant S4 fails, selective Mamba solves it",
                f"{MAMBA}, table 1", "S4 (no gate) 18.3%, S6/Mamba 99.8% (T=4096, 400k steps)"),
    "copying_probe": ("Selective copying with a long spread (T={seq_len}, {num_tokens} data "
                      "tokens): time-invariant S4 fails, selective Mamba solves it",
                      f"{MAMBA}, table 1; study_selective_copying.py",
                      "S4 (no gate) 18.3%, S6/Mamba 99.8% (T=4096, 16 data tokens, 400k "
                      "steps)"),
    "train_len": ("Induction heads: Mamba solves it at the training length",
                  f"{MAMBA}, table 2", "Mamba 100% at the training length 256"),
    "extrapolate": ("Induction heads: {m} extrapolates far beyond the training length",
                    f"{MAMBA}, table 2", "Mamba 100% up to 1M tokens (trained at 256)"),
    "rope": ("Induction heads: attention with RoPE fails beyond about 2x the training length",
             f"{MAMBA}, table 2", "MHA-RoPE fails beyond about 2x the training length (256)"),
    "mamba2_probe": ("Induction heads: Mamba-2 learns it at the training length, as Mamba does",
                     "Dao & Gu 2024 (Mamba-2) report no induction heads; this study's probe "
                     "(probe_mamba2_induction.py)",
                     "(not published; Mamba-2 is meant to keep Mamba's selectivity)"),
}
# Result files a study's claims read besides ``<study>.json`` (paths under the results folder):
# loaded into the study's result under their name by :func:`load`. The long-spread
# selective-copying study has a folder of its own (run_studies runs it) and its claim sits
# with the synthetic study's.
COMPANIONS = {"synthetic": {"mamba2_induction_probe": "synthetic/mamba2_induction_probe.json",
                            "selective_copying_probe": "selective_copying/selective_copying.json"}}


def synthetic_claims(result: dict) -> list[dict]:
  """Claim rows of the synthetic study (``experiments/study_synthetic.py``)."""
  _need("budget" in result and "induction_heads" in result and "selective_copying" in result,
        "synthetic result lacks budget/induction_heads/selective_copying")
  study = "synthetic"
  rows = []
  cfg, b = result["config"], result["budget"]

  def add(key, ours, verdict, reason, **fmt):
    claim, source, published = SYN_CLAIMS[key]
    if fmt.get("m", "mamba") != "mamba":
      published += f"; {fmt['m']} is not in the paper"
    rows.append(_row(study, claim.format(**fmt), source, published, ours, verdict, reason))

  # Selective copying.
  copying = {}
  for r in result["selective_copying"]:
    if "test_accuracy" in r:
      p, n = r["test_accuracy"], r.get("test_tokens")
      _need(n is not None, "selective-copying runs lack test_tokens")
      copying[r["overrides"]["model.mixer"]] = (p, binomial_se(p, n), n)
  cb = b.get("copying", {})
  paper = cb.get("paper", {})
  cbudget = (f"budget: T={cb.get('seq_len')} vs {paper.get('seq_len')}, {cb.get('steps', 0):,} "
             f"of {paper.get('steps', 0):,} steps")
  add("copying", *_copying_verdict(copying, cbudget))
  probe = result.get("selective_copying_probe")
  if probe and not _smoke(probe):
    add("copying_probe", *_copying_probe_row(probe), **probe["config"])

  # Induction heads.
  train_len = cfg["induction"]["seq_len"]
  ext = {}
  for r in result["induction_heads"]:
    if r.get("extrapolation"):
      _need(all("se" in e and "examples" in e for e in r["extrapolation"]),
            "induction-heads extrapolation lacks se/examples")
      ext[r["overrides"]["model.mixer"]] = {e["seq_len"]: e for e in r["extrapolation"]}
  ib = b.get("induction", {})
  ifrac = ib.get("fraction_of_paper_sequences")
  ibudget = (f"budget: {ib.get('train_sequences', 0):,} training sequences"
             + (f" ({100 * ifrac:.2g}% of the paper's)" if ifrac else "")
             + f"; tested to {max(cfg['test_lengths']):,} tokens")
  lengths = sorted(cfg["test_lengths"])
  beyond = [t for t in lengths if t > train_len]
  beyond2 = [t for t in lengths if t > 2 * train_len]
  four = [t for t in lengths if t == 4 * train_len] or (beyond2 or beyond)[:1]
  shown = sorted({train_len, *four, lengths[-1]})  # the training length, 4x, the longest

  def at(m, t):
    e = ext[m].get(t)
    return e and (e["accuracy"], e["se"], e["examples"])

  def show(m):
    return f"{m}: " + "; ".join(f"@{t} {_acc(*at(m, t))}" for t in shown if at(m, t))

  # At the training length.
  if "mamba" not in ext or not at("mamba", train_len):
    add("train_len", "-", NOT_MEASURED, f"no mamba result at length {train_len}; {ibudget}")
  else:
    p, se, n = at("mamba", train_len)
    others = [m for m in ("softmax", "mamba2") if m in ext and at(m, train_len)]
    ours = f"mamba @{train_len} {_acc(p, se, n)}" + "".join(
        f"; {m} {_acc(*at(m, train_len))}" for m in others)
    if p >= SOLVED:
      add("train_len", ours, REPRODUCED, f">= {SOLVED}; {ibudget}")
    elif p >= LEARNED:
      add("train_len", ours, IN_SHAPE, f"learned (>= {LEARNED}), not solved (< {SOLVED}); "
          f"{ibudget}")
    else:
      add("train_len", ours, NOT_REPRODUCED, f"not learned (< {LEARNED}); {ibudget}")

  # Extrapolation of the selective models.
  for m in SELECTIVE:
    if m not in ext:
      if m == "mamba":
        add("extrapolate", "-", NOT_MEASURED, f"no mamba result; {ibudget}", m=m)
      continue
    base = at(m, train_len)
    far = [at(m, t) for t in beyond if at(m, t)]
    if not base or not far:
      add("extrapolate", show(m), NOT_MEASURED, f"no test beyond the training length; {ibudget}",
          m=m)
    elif base[0] < LEARNED:
      add("extrapolate", show(m), NOT_MEASURED,
          f"{m} did not learn the task at length {train_len} ({base[0]:.3f} < {LEARNED}); "
          f"{ibudget}", m=m)
    else:
      low = min(p for p, _, _ in far)
      verdict = REPRODUCED if low >= SOLVED else IN_SHAPE if low >= LEARNED else NOT_REPRODUCED
      add("extrapolate", show(m), verdict,
          f"lowest beyond {train_len}: {low:.3f} (rule: >= {SOLVED} reproduced, >= {LEARNED} "
          f"in shape); {ibudget}", m=m)

  # Attention with RoPE.
  if "softmax" not in ext or not at("softmax", train_len):
    add("rope", "-", NOT_MEASURED, f"no softmax result at length {train_len}; {ibudget}")
  else:
    base = at("softmax", train_len)
    far = [(t, at("softmax", t)) for t in beyond2 if at("softmax", t)]
    if base[0] < LEARNED:
      add("rope", show("softmax"), NOT_MEASURED,
          f"softmax did not learn the task at length {train_len} ({base[0]:.3f} < {LEARNED}); "
          f"{ibudget}")
    elif not far:
      add("rope", show("softmax"), NOT_MEASURED, f"no test beyond 2x the training length; "
          f"{ibudget}")
    else:
      t1, first = far[0]
      if all(p < LEARNED for _, (p, _, _) in far):
        add("rope", show("softmax"), REPRODUCED,
            f"below {LEARNED} at every length beyond {2 * train_len}; {ibudget}")
      elif significant(base[0] - first[0], diff_se(base[1], first[1])):
        add("rope", show("softmax"), IN_SHAPE,
            f"drops by > {Z:g} SE at {t1} but stays >= {LEARNED} somewhere beyond; {ibudget}")
      else:
        add("rope", show("softmax"), NOT_REPRODUCED,
            f"no drop by > {Z:g} SE at {t1}; {ibudget}")
  probe = result.get("mamba2_induction_probe")
  if probe:
    rows.append(_mamba2_probe_row(probe, at("mamba2", train_len) if "mamba2" in ext else None))
  return _finish(rows, result, result["selective_copying"] + result["induction_heads"])


def _copying_verdict(copying: dict, budget: str) -> tuple[str, str, str]:
  """(ours, verdict, reason) of a selective-copying claim from ``{mixer: (p, se, n)}``."""
  if "mamba" not in copying or "s4d" not in copying:
    missing = [m for m in ("mamba", "s4d") if m not in copying]
    return ("; ".join(f"{m} {_acc(*v)}" for m, v in copying.items()) or "-",
            NOT_MEASURED, f"no finished {', '.join(missing)} run; {budget}")
  (pm, sm, nm), (ps, ss, ns) = copying["mamba"], copying["s4d"]
  ours = f"mamba {_acc(pm, sm, nm, 'tokens')}; s4d {_acc(ps, ss, ns, 'tokens')}"
  if pm >= SOLVED and ps < LEARNED:
    return ours, REPRODUCED, f"mamba >= {SOLVED}, s4d < {LEARNED}; {budget}"
  if significant(pm - ps, diff_se(sm, ss)):
    return ours, IN_SHAPE, f"mamba above s4d by > {Z:g} SE; {budget}"
  return ours, NOT_REPRODUCED, f"mamba not above s4d by > {Z:g} SE; {budget}"


def _copying_probe_row(probe: dict) -> tuple[str, str, str]:
  """(ours, verdict, reason) of the long-spread selective-copying probe
  (``study_selective_copying.py``): each run tested at its newest checkpoint; the reason
  gives its steps, sequences and tokens against the paper's, and any run stopped part-way."""
  cfg, paper = probe["config"], probe["paper"]
  copying, spent = {}, []
  for r in probe["runs"]:
    if "test_accuracy" not in r:
      continue
    copying[r["mixer"]] = (r["test_accuracy"], r["test_se"], r["test_tokens"])
    seqs = r["train_sequences"]
    spent.append(f"{r['mixer']} {r['step']:,} steps = {seqs:,} sequences = "
                 f"{seqs * cfg['seq_len']:,} tokens"
                 + (" (stopped part-way)" if r.get("stopped_at") is not None else ""))
  # Runs stopped at different steps: the validation accuracies at the last step both logged.
  curves = {r["mixer"]: {c["step"]: c["accuracy"] for c in r.get("validation_curve", [])}
            for r in probe["runs"] if r["mixer"] in ("mamba", "s4d")}
  common = set.intersection(*(set(c) for c in curves.values())) if len(curves) == 2 else set()
  if common:
    t = max(common)
    spent.append(f"validation at step {t:,}: " + ", ".join(
        f"{m} {curves[m][t]:.3f}" for m in ("mamba", "s4d")))
  paper_seqs = paper["steps"] * paper["batch"]
  budget = (f"budget: T={cfg['seq_len']}, {cfg['num_tokens']} data tokens, batch "
            f"{cfg['batch']}; {'; '.join(spent) or 'no run'}; paper: T={paper['seq_len']}, "
            f"{paper['steps']:,} steps = {paper_seqs:,} sequences = "
            f"{paper_seqs * paper['seq_len']:,} tokens; chance {probe['chance']:.3f}")
  return _copying_verdict(copying, budget)


def _mamba2_probe_row(probe: dict, study_m2) -> dict:
  """The row of the Mamba-2 induction-heads probe: one run per hypothesis (Mamba-2 moved
  towards Mamba-1, or Mamba-1 given one Mamba-2 property), scored on the sparse test at the
  training length after every ``eval_every`` steps.

  Rule: the default Mamba-2 (a ``default*`` variant) >= ``LEARNED``: reproduced in shape
  (it learns, later than Mamba); another Mamba-2 variant >= ``LEARNED``: reproduced in
  shape, the reason naming what it changes (the measured reason) and what stayed at chance;
  none: not reproduced, naming what was tried and any Mamba-1 variant that the Mamba-2
  property broke. The study's default Mamba-2 is shown first.
  """
  cfg = probe.get("config", {})
  t = cfg.get("seq_len")
  res = []
  for r in probe.get("table") or []:
    if r.get("sparse_test") is not None:
      res.append((r["variant"], r["mixer"], r["sparse_test"], r.get("sparse_se") or 0.0,
                  r.get("steps")))
  dense = {r["variant"]: r.get("dense_val") for r in probe.get("table") or []}
  first = {}  # variant -> the first evaluated step at >= LEARNED
  for r in probe.get("runs") or []:
    hit = [c["step"] for c in r.get("sparse_test_curve") or [] if c["accuracy"] >= LEARNED]
    if hit:
      first[r.get("variant")] = hit[0]
  n = cfg.get("test_examples")
  ours = "; ".join(
      ([f"study default {_acc(*study_m2)}"] if study_m2 else [])
      + [f"{v} {p:.3f} ± {se:.3f} ({st} steps)" for v, _, p, se, st in res]) \
      or "no finished probe run"
  budget = (f"probe: one seed per variant, {cfg.get('batch')} dense sequences per step at "
            f"T={t}; sparse test at "
            f"T={t} on {n} sequences every {cfg.get('eval_every')} steps; chance "
            f"{probe.get('chance', 1 / 15):.3f}")
  claim, source, published = SYN_CLAIMS["mamba2_probe"]
  if not res:
    return _row("synthetic", claim, source, published, ours, NOT_MEASURED, budget)

  stopped = {r["variant"] for r in probe.get("table") or [] if r.get("stopped_at")}
  changes = cfg.get("variants") or {}

  def change(v):  # the variant's overrides, as the reason names what learns
    kw = [f"{k.split('.')[-1]}={x}" for k, x in (changes.get(v) or {}).items()
          if k not in ("model.mixer", "train.steps")]
    return (", ".join(kw) + "; ") if kw else ""

  def named(rows, why=False):
    return ", ".join(f"{v} ({change(v) if why else ''}{p:.3f} at {st}"
                     + (" (stopped part-way)" if v in stopped else "")
                     + (f", >= {LEARNED} from step {first[v]})" if v in first else ")")
                     for v, _, p, _, st in rows) or "none"

  shown = _longest_runs([r[0] for r in res], {r[0]: r[4] or 0 for r in res})
  m2 = [r for r in res if r[1] == "mamba2" and r[0] in shown]
  learned = [r for r in m2 if r[2] >= LEARNED]
  chance = [r for r in m2 if r[2] < LEARNED]
  control = [r for r in res if r[0] == "mamba"]
  m1_vars = [r for r in res if r[1] == "mamba" and r[0] != "mamba" and r[0] in shown]
  parts = [f"Mamba-2 learns (>= {LEARNED}) with: {named(learned, why=True)}",
           f"stays below {LEARNED} with: {named(chance)}"]
  if control:
    parts.append(f"Mamba-1: {named(control)}")
    ref = dense.get("mamba")
    fit = [r for r in chance if ref is not None and (dense.get(r[0]) or 0.0) >= ref]
    if fit:  # the training task learned, the test not: what it learned does not transfer
      parts.append(f"fits the dense training task as well as Mamba-1 (dense val >= {ref:.3f}) "
                   f"yet stays below {LEARNED} on the sparse test: "
                   + ", ".join(f"{r[0]} (dense val {dense[r[0]]:.3f})" for r in fit))
  if m1_vars:
    parts.append(f"Mamba-1 given one Mamba-2 property: {named(m1_vars)}")
  parts += _probe_explanation(probe, [r[0] for r in res])
  reason = "; ".join(parts) + f"; {budget}"
  if any(r[0].startswith("default") for r in learned):
    return _row("synthetic", claim, source, published, ours, IN_SHAPE,
                "the default Mamba-2 learns it, later than Mamba: " + reason)
  if learned:
    return _row("synthetic", claim, source, published, ours, IN_SHAPE, reason)
  return _row("synthetic", claim, source, published, ours, NOT_REPRODUCED, reason)


def _longest_runs(variants: list[str], steps: dict) -> list[str]:
  """``variants`` less those a longer run continues: ``<v>_1k``, ``<v>_1500`` or ``<v>_2k``
  (after ``<v>_1k``) starts as ``<v>``'s run, so only the one with the most ``steps`` shows."""
  base = lambda v: v.rsplit("_", 1)[0] if v.rsplit("_", 1)[-1].rstrip("k").isdigit() else v
  return [v for v in variants if not any(
      w != v and base(w) in (v, base(v)) and steps[w] > steps[v] for w in variants)]


ESCAPE = 0.2  # sparse-test accuracy taken as leaving chance (3x chance 1/15; > 4 SE at n=128)


def _probe_explanation(probe: dict, variants: list[str]) -> list[str]:
  """The probe's measured explanation, as reason parts: when each Mamba-1 run leaves chance
  (a property that delays reaches ``ESCAPE`` later than Mamba-1; one that blocks never does
  within its steps), which state dimensions the trained Mamba-1 answers from
  (``state_ablation``), and how much of a token each variant's first layer keeps 128 steps
  on at init (``init_memory``)."""
  runs = {r.get("variant"): r for r in probe.get("runs") or []}
  variants = _longest_runs(variants, {v: ((runs.get(v) or {}).get("sparse_test_curve")
                                          or [{"step": 0}])[-1]["step"] for v in variants})
  parts = []
  is_m1 = lambda v: (runs[v].get("overrides") or {}).get(
      "model.mixer", "mamba" if v == "mamba" or v.startswith("m1_") else "") == "mamba"
  m1 = [v for v in variants if v in runs and is_m1(v)]
  m2 = [v for v in variants if v in runs and not is_m1(v)]

  def escape(v):  # (first step >= ESCAPE or None, the run's last evaluated step)
    curve = runs[v].get("sparse_test_curve") or []
    hit = [c["step"] for c in curve if c["accuracy"] >= ESCAPE]
    return (hit[0] if hit else None), (curve[-1]["step"] if curve else 0)

  left = [v for v in m2 if escape(v)[0]]
  if left:  # a Mamba-2 variant leaves chance: when, and how long the others were trained
    parts.append(f"Mamba-2 leaves chance (>= {ESCAPE}) with: " + ", ".join(
        f"{v} from step {escape(v)[0]}" for v in left) + "; not within its steps: " + (", ".join(
            f"{v} ({escape(v)[1]})" for v in m2 if not escape(v)[0]) or "none"))

  if "mamba" in m1 and escape("mamba")[0]:
    ref = escape("mamba")[0]
    later = [v for v in m1 if v != "mamba" and escape(v)[0]]
    never = [v for v in m1 if v != "mamba" and not escape(v)[0]]
    parts.append(f"Mamba-1 leaves chance (>= {ESCAPE} on the sparse test) from step {ref}; "
                 "given a change: " + ", ".join(
                     f"{v} from step {escape(v)[0]} ({escape(v)[0] / ref:.1f}x)" for v in later)
                 + ("; " if later and never else "")
                 + ", ".join(f"{v} not within {escape(v)[1]} steps" for v in never))
  moved = [v for v in m1 if len(runs[v].get("decay_stats") or []) == 2]
  if moved:
    def share(v):
      first, last = runs[v]["decay_stats"]
      layer = sorted(k for k in last if k.startswith("layer"))[-1]
      return (f"{v} {first[layer]['slow_share']:.2f} -> {last[layer]['slow_share']:.2f} "
              f"(steps {first['step']} -> {last['step']})")
    parts.append("share of last-layer channels with some A_n < 2 during training: "
                 + ", ".join(share(v) for v in moved))
  abl = (runs.get("mamba") or {}).get("state_ablation")
  if abl:
    layers = sorted({k.split("_")[0] for k in abl if k.startswith("layer")})
    cut = lambda k: ", ".join(f"{l} {abl[f'{l}_{k}']:.3f}" for l in layers if f"{l}_{k}" in abl)
    parts.append(f"trained Mamba-1 (step {abl['step']}, {abl['examples']} sparse rows, "
                 f"{abl['full']:.3f} intact) with only its 4 slowest state dimensions (A_n "
                 f"about n+1, n < 4) written per layer: {cut('only_n<4')}; with all but "
                 f"those: {cut('without_n<4')}")
  memory = probe.get("init_memory") or {}
  shown = [v for v in variants if v in memory]
  if shown:
    d = memory[shown[0]]["distance"]
    parts.append(f"at init, share of first-layer channels (heads for Mamba-2) keeping > 0.1 "
                 f"of a token {d} steps on at their bias dt: "
                 + ", ".join(f"{v} {memory[v]['frac_above_0.1']:.2f}" for v in shown))
  return parts


# ----------------------------------------------------------------------------- LM

LM_CLAIMS = {
    "gated": ("Gated linear-time models come close to or match softmax at equal parameters and "
              "tokens ({corpus})", "GLA (Yang et al. 2024), table 2; Mamba (Gu & Dao 2023)",
              "gated models match or come close to the Transformer baseline"),
    "ungated": ("Ungated linear attention and Performer are clearly worse than softmax "
                "({corpus})", "Katharopoulos et al. 2020; GLA (Yang et al. 2024), table 2",
                "clearly worse than softmax attention"),
}


def lm_claims(result: dict) -> list[dict]:
  """Claim rows of the language-modelling study (``experiments/study_lm.py``)."""
  table = result.get("table") or []
  _need(all("corpus" in r and "mixer" in r and "bits_per_byte" in r for r in table),
        "lm table rows lack corpus/mixer/bits_per_byte")
  study = "lm"
  cfg = result["config"]
  rows = []
  tokens = result.get("training_tokens")
  val = cfg.get("eval_batches", 0) * cfg.get("batch", 0) * cfg.get("seq_len", 0)
  budget = (f"budget: {tokens:,} training tokens per run" if tokens else "budget: see lm.json")
  budget += "; 1 seed"
  for corpus in dict.fromkeys(r["corpus"] for r in table):
    bpb = {r["mixer"]: r["bits_per_byte"] for r in table
           if r["corpus"] == corpus and r["bits_per_byte"] is not None}

    def add(key, ours, verdict, reason):
      claim, source, published = LM_CLAIMS[key]
      rows.append(_row(study, claim.format(corpus=corpus), source, published, ours, verdict,
                       reason))

    if "softmax" not in bpb:
      add("gated", "-", NOT_MEASURED, f"no softmax result; {budget}")
      add("ungated", "-", NOT_MEASURED, f"no softmax result; {budget}")
      continue
    ref = bpb["softmax"]
    head = f"softmax {ref:.3f} bits/byte (validation on {val:,} bytes)" if val else (
        f"softmax {ref:.3f} bits/byte")
    gaps = {m: bpb[m] - ref for m in GATED if m in bpb}
    close = sorted(m for m, g in gaps.items() if g <= CLOSE_BPB)
    if not gaps:
      add("gated", head, NOT_MEASURED, f"no gated mixer; {budget}")
    else:
      ours = (f"{len(close)}/{len(gaps)} gated within {CLOSE_BPB} bits/byte or better; gaps "
              + ", ".join(f"{m} {g:+.3f}" for m, g in sorted(gaps.items(), key=lambda x: x[1]))
              + f"; {head}")
      verdict = (REPRODUCED if len(close) > len(gaps) / 2 else IN_SHAPE if close
                 else NOT_REPRODUCED)
      add("gated", ours, verdict, f"majority within {CLOSE_BPB}: reproduced, one: in shape; "
          f"{budget}")
    ungated = {m: bpb[m] - ref for m in UNGATED if m in bpb}
    if not ungated:
      add("ungated", head, NOT_MEASURED, f"no ungated mixer; {budget}")
    else:
      ours = "gaps " + ", ".join(f"{m} {g:+.3f}" for m, g in ungated.items()) + f"; {head}"
      if all(g > CLOSE_BPB for g in ungated.values()):
        add("ungated", ours, REPRODUCED, f"all worse by > {CLOSE_BPB} bits/byte; {budget}")
      elif all(g > 0 for g in ungated.values()):
        add("ungated", ours, IN_SHAPE, f"worse, but within {CLOSE_BPB} bits/byte; {budget}")
      else:
        add("ungated", ours, NOT_REPRODUCED, f"an ungated mixer matches softmax; {budget}")
  if not rows:
    for key in LM_CLAIMS:
      claim, source, published = LM_CLAIMS[key]
      rows.append(_row(study, claim.format(corpus="no corpus"), source, published, "-",
                       NOT_MEASURED, "empty table"))
  return _finish(rows, result, result.get("runs") or [])


# ----------------------------------------------------------------------------- ListOps

LRA = "Long Range Arena (Tay et al. 2021), table 1"
LISTOPS_CLAIMS = {
    "none_beat": ("Efficient Transformers do not beat the Transformer on ListOps", LRA,
                  "Transformer 36.37%; Linformer 35.70%, Longformer 35.63%, BigBird 36.05%, "
                  "Performer 18.01%"),
    "performer": ("Performer falls far below the Transformer on ListOps", LRA,
                  "Performer 18.01% vs Transformer 36.37%"),
}


def listops_claims(result: dict) -> list[dict]:
  """Claim rows of the ListOps study (``experiments/study_listops.py``)."""
  table = result.get("table") or []
  cfg = result.get("config", {})
  _need(all("mixer" in r and "test_accuracy" in r for r in table),
        "listops table rows lack mixer/test_accuracy")
  n = result.get("test_examples") or cfg.get("test_batches", 0) * cfg.get("batch", 0)
  _need(n > 0, "listops result lacks the number of test items (config test_batches, batch)")
  study = "listops"
  acc = {r["mixer"]: r["test_accuracy"] for r in table if r["test_accuracy"] is not None}
  se = {m: binomial_se(p, n) for m, p in acc.items()}
  majority = result.get("majority_class_rate")
  reduced = (f"reduced task: length <= {cfg.get('max_length', cfg.get('seq_len'))}, depth "
             f"{cfg.get('max_depth')}, {cfg.get('steps')} steps (LRA: up to 2k tokens)")
  rows = []

  def add(key, ours, verdict, reason):
    rows.append(_row(study, *LISTOPS_CLAIMS[key], ours, verdict, reason))

  if "softmax" not in acc:
    for key in LISTOPS_CLAIMS:
      add(key, "-", NOT_MEASURED, f"no softmax result; {reduced}")
    return _finish(rows, result, result.get("runs") or [])
  ref = f"softmax {_acc(acc['softmax'], se['softmax'], n)}" + (
      f"; majority class {majority:.3f}" if majority is not None else "")
  if majority is not None and not significant(acc["softmax"] - majority, se["softmax"]):
    for key in LISTOPS_CLAIMS:
      add(key, ref, NOT_MEASURED, f"softmax not above the majority class by > {Z:g} SE; "
          f"{reduced}")
    return _finish(rows, result, result.get("runs") or [])

  others = {m: p for m, p in acc.items() if m != "softmax"}
  if not others:
    add("none_beat", ref, NOT_MEASURED, f"no other mixer; {reduced}")
  else:
    best = max(others, key=others.get)
    d, s = others[best] - acc["softmax"], diff_se(se[best], se["softmax"])
    above = [m for m, p in others.items()
             if significant(p - acc["softmax"], diff_se(se[m], se["softmax"]))]
    ours = f"{ref}; best other {best} {_acc(others[best], se[best])} ({d / s:+.1f} SE)"
    if above:
      add("none_beat", ours, NOT_REPRODUCED,
          f"{', '.join(above)} above softmax by > {Z:g} SE; {reduced}")
    else:
      add("none_beat", ours, IN_SHAPE, f"no mixer above softmax by > {Z:g} SE; {reduced}")
  if "performer" not in acc:
    add("performer", ref, NOT_MEASURED, f"no performer run; {reduced}")
  else:
    d = acc["performer"] - acc["softmax"]
    s = diff_se(se["performer"], se["softmax"])
    ours = f"performer {_acc(acc['performer'], se['performer'])}; {ref} ({d / s:+.1f} SE)"
    if significant(-d, s):
      add("performer", ours, IN_SHAPE, f"below softmax by > {Z:g} SE; {reduced}")
    else:
      add("performer", ours, NOT_REPRODUCED, f"not below softmax by > {Z:g} SE; {reduced}")
  return _finish(rows, result, result.get("runs") or [])


# ----------------------------------------------------------------------------- cost

KATHAROPOULOS = "Katharopoulos et al. 2020, section 3"
COST_CLAIMS = {
    "time": ("Linear attention's time is linear in T, softmax's quadratic", KATHAROPOULOS,
             "O(T) vs O(T^2): log-log slopes 1 vs 2"),
    "memory": ("Linear attention's memory is linear in T, softmax's quadratic", KATHAROPOULOS,
               "O(T) vs O(T^2): log-log slopes 1 vs 2"),
    "decode": ("Linear attention decodes in O(1) per token, softmax (KV cache) in O(T)",
               KATHAROPOULOS, "per-token slopes 0 vs 1"),
}


def _in(x, bounds) -> bool:
  return x is not None and bounds[0] <= x <= bounds[1]


def cost_claims(result: dict) -> list[dict]:
  """Claim rows of the cost study (``experiments/study_cost.py``): fitted log-log slopes."""
  _need("slopes" in result and "decode_slopes" in result, "cost result lacks slopes")
  study = "cost"
  rows = []

  def add(key, ours, verdict, reason):
    rows.append(_row(study, *COST_CLAIMS[key], ours, verdict, reason))

  def slope(case, key):
    s = next((s for s in result["slopes"] if s["case"] == case and s["mode"] == "fwd"), None)
    return (s.get(key), s) if s else (None, None)

  def judge(key, lin, quad, what):
    if lin is None or quad is None:
      add(key, what, NOT_MEASURED, "a slope is missing (too few lengths fitted)")
    elif _in(lin, LINEAR_SLOPE) and _in(quad, QUADRATIC_SLOPE):
      add(key, what, REPRODUCED, f"linear in {LINEAR_SLOPE}, softmax in {QUADRATIC_SLOPE}")
    elif lin < quad - SEPARATED_SLOPE:
      add(key, what, IN_SHAPE, f"slopes outside the bands but separated by > {SEPARATED_SLOPE}")
    else:
      add(key, what, NOT_REPRODUCED, f"slopes not separated by > {SEPARATED_SLOPE}")

  def fit(s):
    return f"{s['n_points']} lengths, T={s['T_range'][0]:,}-{s['T_range'][1]:,}" if s else "-"

  for key, field in (("time", "time_slope"), ("memory", "xla_mem_slope")):
    lin, ls = slope("linear_chunk", field)
    quad, qs = slope("naive_softmax", field)
    what = (f"forward slope: linear (chunk) {'-' if lin is None else f'{lin:.2f}'} ({fit(ls)}); "
            f"naive softmax {'-' if quad is None else f'{quad:.2f}'} ({fit(qs)})"
            + ("; XLA's compiled memory" if key == "memory" else ""))
    judge(key, lin, quad, what)

  ds = result["decode_slopes"]
  lin, kv = ds.get("linear_step"), ds.get("softmax_kv_cache")
  pos = result.get("config", {}).get("positions") or []
  span = f"; positions {pos[0]:,}-{pos[-1]:,}" if pos else ""
  what = (f"latency slope vs position: linear step {'-' if lin is None else f'{lin:+.2f}'}, "
          f"softmax KV cache {'-' if kv is None else f'{kv:+.2f}'}{span}")
  if lin is None or kv is None:
    add("decode", what, NOT_MEASURED, "a decode slope is missing")
  elif _in(lin, CONSTANT_SLOPE) and kv >= 0.8:
    add("decode", what, REPRODUCED, f"linear in {CONSTANT_SLOPE}, KV cache >= 0.8")
  elif lin < kv - SEPARATED_SLOPE:
    add("decode", what, IN_SHAPE, f"separated by > {SEPARATED_SLOPE}, outside the bands")
  else:
    add("decode", what, NOT_REPRODUCED, f"not separated by > {SEPARATED_SLOPE}")
  return _finish(rows, result)


# ----------------------------------------------------------------------------- approximation

FAVOR = "Choromanski et al. 2021 (FAVOR+), section 2"
APPROX_CLAIMS = {
    "positive_vs_trig": ("Positive random features approximate softmax better than "
                         "trigonometric ones ({setting})", FAVOR,
                         "positive features: lower error (no single figure)"),
    "orthogonal_vs_iid": ("Orthogonal random features reduce the error ({setting})", FAVOR,
                          "orthogonal features: lower error (no single figure)"),
}


def approximation_claims(result: dict) -> list[dict]:
  """Claim rows of the approximation study (``experiments/study_approximation.py``)."""
  comp = result.get("comparison")
  _need(isinstance(comp, dict) and comp, "approximation result lacks comparison")
  study = "approximation"
  seeds = result.get("config", {}).get("seeds")
  rows = []
  for key, (claim, source, published) in APPROX_CLAIMS.items():
    for setting, claims in comp.items():
      res = claims.get(key) or []
      _need(all("outcome_log" in r for r in res), "comparison entries lack outcome_log")
      holds = sum(r["outcome_log"] == "holds" for r in res)
      fails = sum(r["outcome_log"] == "fails" for r in res)
      unclear = len(res) - holds - fails
      pairs = ", ".join(dict.fromkeys(f"{r['better']} vs {r['worse']}" for r in res))
      ours = (f"holds {holds}, fails {fails}, unclear {unclear} of {len(res)} (pair, m) "
              f"comparisons ({pairs}); paired test on log MSE over {seeds} seeds")
      if not res:
        verdict, reason = NOT_MEASURED, "no comparison in this setting"
      elif holds > len(res) / 2 and fails == 0:
        verdict, reason = REPRODUCED, f"holds at most m by > {Z:g} SE, never reversed"
      elif holds > fails:
        verdict, reason = IN_SHAPE, "holds more often than it is reversed"
      elif fails:
        verdict, reason = NOT_REPRODUCED, "reversed at least as often as it holds"
      else:
        verdict, reason = NOT_REPRODUCED, f"no difference beyond {Z:g} SE at any m"
      rows.append(_row(study, claim.format(setting=setting), source, published, ours, verdict,
                       reason))
  return _finish(rows, result)


# ----------------------------------------------------------------------------- extrapolation

EXTRAP_TOL = 0.05  # nats per byte: a rise this small beyond the training length is "flat"
EXTRAP_GATED = ("mamba", "mamba2", "gla", "retnet")  # Mamba-2 stands in for Mamba when it is absent
EXTRAP_CLAIMS = {
    "rope": ("Softmax attention with RoPE degrades past its training length (loss per position)",
             "Press et al. 2022 (ALiBi), figure 1; GLA (Yang et al. 2024), length extrapolation",
             "loss rises sharply beyond the training length"),
    "gated": ("Mamba, GLA and RetNet extrapolate in loss: flat or falling past the training "
              "length", "GLA (Yang et al. 2024), length extrapolation (GLA, RetNet and Mamba "
              "against Transformer++)", "loss flat or falling well past the training length"),
}


def extrapolation_claims(result: dict) -> list[dict]:
  """Claim rows of the length-extrapolation study (``experiments/study_extrapolation.py``)."""
  summ = {r["mixer"]: r for r in result.get("summary") or []}
  _need(all("delta_worst" in r and "delta_worst_se" in r for r in summ.values()),
        "extrapolation summary rows lack delta_worst/delta_worst_se")
  cfg = result["config"]
  study = "extrapolation"
  budget = (f"budget: {result.get('training_tokens', 0):,} training bytes per run at length "
            f"{cfg.get('seq_len')}, {cfg.get('eval_windows')} windows of {cfg.get('eval_len'):,} "
            "bytes; 1 seed")

  def ours(m):
    r = summ[m]
    return (f"{m}: worst bucket beyond {r['train_len']} ({r['worst_bucket']}) "
            f"{r['delta_worst']:+.3f} ± {r['delta_worst_se']:.3f} nats vs positions "
            f"{r['train_len'] // 2}-{r['train_len']}; last bucket {r['delta_last']:+.3f} ± "
            f"{r['delta_last_se']:.3f}")

  def flat(m):
    r = summ[m]
    return r["delta_worst"] <= EXTRAP_TOL or not significant(r["delta_worst"], r["delta_worst_se"])

  rows = []
  claim, source, published = EXTRAP_CLAIMS["rope"]
  if "softmax" not in summ or summ["softmax"]["delta_worst"] is None:
    rows.append(_row(study, claim, source, published, "-", NOT_MEASURED,
                     f"no softmax result beyond the training length; {budget}"))
  else:
    r = summ["softmax"]
    if significant(r["delta_last"], r["delta_last_se"]) and r["delta_last"] > EXTRAP_TOL:
      v, why = REPRODUCED, f"last bucket significantly above and by > {EXTRAP_TOL} nats"
    elif significant(r["delta_worst"], r["delta_worst_se"]):
      v, why = IN_SHAPE, "a bucket beyond significantly above, not the last by the margin"
    else:
      v, why = NOT_REPRODUCED, "no bucket beyond significantly above"
    rows.append(_row(study, claim, source, published, ours("softmax"), v,
                     f"{why} (paired SE over windows, Z={Z:g}); {budget}"))
  claim, source, published = EXTRAP_CLAIMS["gated"]
  have = [m for m in EXTRAP_GATED if m in summ and summ[m]["delta_worst"] is not None]
  if not have:
    rows.append(_row(study, claim, source, published, "-", NOT_MEASURED,
                     f"none of {', '.join(EXTRAP_GATED)} evaluated; {budget}"))
  else:
    soft = summ.get("softmax", {}).get("delta_worst")
    text = "; ".join(ours(m) for m in have)
    if all(flat(m) for m in have):
      v, why = REPRODUCED, (f"every one flat: worst rise <= {EXTRAP_TOL} nats or not "
                            "significant")
    elif any(flat(m) for m in have) and soft is not None and all(
        summ[m]["delta_worst"] < soft for m in have):
      v, why = IN_SHAPE, "some flat, all rising less than softmax"
    else:
      v, why = NOT_REPRODUCED, "not flat and not below softmax's rise"
    absent = [m for m in EXTRAP_GATED if m not in have]
    why += f" ({', '.join(absent)} not evaluated)" if absent else ""
    rows.append(_row(study, claim, source, published, text, v, f"{why}; {budget}"))
  return _finish(rows, result, result.get("runs") or [])


# ----------------------------------------------------------------------------- hybrids

HYBRID_SOURCE = ("Zoology (Arora et al. 2023), hybrids; Jamba (Lieber et al. 2024); "
                 "Samba (Ren et al. 2024)")
HYBRID_CLAIMS = {
    "recall": ("A few attention layers give a recurrent model back its recall (MQAR)",
               HYBRID_SOURCE, "hybrids close most of the gap to attention on recall"),
    "lm": ("A hybrid models language as well as or better than both pure models",
           "Jamba (Lieber et al. 2024), ablations; Samba (Ren et al. 2024)",
           "hybrid at or below both pure models' loss"),
}


def _kinds(table: list[dict], task: str) -> dict:
  """``{"softmax", "recurrent", "hybrid"}`` -> the task's rows of that kind, in table order
  (patterns of only softmax letters, of one recurrent letter, or mixed with softmax)."""
  out: dict[str, list] = {}
  for r in table:
    if r["task"] != task:
      continue
    letters = set(r["pattern"])
    kind = ("softmax" if letters == {"A"} else "hybrid" if "A" in letters
            else "recurrent" if len(letters) == 1 else None)
    if kind:
      out.setdefault(kind, []).append(r)
  return out


def _recall_verdict(h: dict, rec: dict, sm: dict | None) -> tuple[str, str]:
  """The recall rule for one hybrid row against the pure recurrent (and softmax) rows."""
  up = significant(h["score"] - rec["score"], diff_se(h["se"], rec["se"]))
  # without a pure softmax model, only "solved" counts
  near = sm is not None and not significant(sm["score"] - h["score"], diff_se(sm["se"], h["se"]))
  if up and (h["score"] >= SOLVED or near):
    return REPRODUCED, (f"hybrid significantly above the pure recurrent model and solved "
                        f"(>= {SOLVED}) or not significantly below softmax")
  if up:
    return IN_SHAPE, "hybrid significantly above the pure recurrent model, below softmax"
  return NOT_REPRODUCED, "hybrid not significantly above the pure recurrent model"


def hybrid_claims(result: dict) -> list[dict]:
  """Claim rows of the hybrid study (``experiments/study_hybrid.py``).

  Recall is judged on the best hybrid (where the attention layer sits is part of the
  design, as the learning rate is in the recall study); the reason names it and gives every
  other hybrid's verdict beside it."""
  table = result.get("table") or []
  _need(all(k in r for r in table for k in ("task", "pattern", "score", "se")),
        "hybrid table rows lack task/pattern/score/se")
  cfg = result["config"]
  study = "hybrid"
  rows = []
  mq = _kinds(table, "mqar")
  claim, source, published = HYBRID_CLAIMS["recall"]
  budget = (f"budget: at most {cfg['mqar']['batch'] * cfg['mqar']['steps']:,} MQAR examples "
            f"(T={cfg['mqar']['seq_len']}, {cfg['mqar']['num_kv_pairs']} pairs), "
            f"{cfg['num_layers']} layers at equal parameters; 1 seed"
            + (f"; papers: {result['budget']['paper']}" if result.get("budget", {}).get("paper")
               else ""))
  text = "; ".join(f"{k} {r['pattern']} {_acc(r['score'], r['se'], r['test_items'])} after "
                   f"{r.get('steps_run')} steps" for k, rs in mq.items() for r in rs) or "-"
  if not {"hybrid", "recurrent"} <= set(mq):
    rows.append(_row(study, claim, source, published, text, NOT_MEASURED,
                     f"needs the hybrid and the pure recurrent model; {budget}"))
  else:
    rec, sm = mq["recurrent"][0], (mq.get("softmax") or [None])[0]
    best = max(mq["hybrid"], key=lambda r: r["score"])
    v, why = _recall_verdict(best, rec, sm)
    others = [f"{r['pattern']}: {_recall_verdict(r, rec, sm)[0]}" for r in mq["hybrid"]
              if r is not best]
    if others:
      why = f"{best['pattern']}: {why} (" + "; ".join(others) + ")"
    rows.append(_row(study, claim, source, published, text, v, f"{why}; {budget}"))
  lm = _kinds(table, "lm")
  claim, source, published = HYBRID_CLAIMS["lm"]
  budget = (f"budget: {result.get('budget', {}).get('lm_tokens', 0):,} training bytes per run, "
            f"{cfg['num_layers']} layers at equal parameters; 1 seed, no error bar")
  if len(lm) < 3:
    rows.append(_row(study, claim, source, published, "-", NOT_MEASURED,
                     f"needs the hybrid and both pure models; {budget}"))
  else:
    lm = {k: rs[0] for k, rs in lm.items()}
    text = "; ".join(f"{k} {r['pattern']} {r['score']:.3f} bits/byte" for k, r in lm.items())
    best_pure = min(lm["softmax"]["score"], lm["recurrent"]["score"])
    if lm["hybrid"]["score"] <= best_pure:
      v, why = REPRODUCED, "hybrid at or below both pure models"
    elif lm["hybrid"]["score"] <= best_pure + CLOSE_BPB:
      v, why = IN_SHAPE, f"hybrid within {CLOSE_BPB} bits/byte of the better pure model"
    else:
      v, why = NOT_REPRODUCED, f"hybrid worse than the better pure model by > {CLOSE_BPB}"
    rows.append(_row(study, claim, source, published, text, v, f"{why}; {budget}"))
  runs = result.get("runs") or []  # each row is partial only where its own task's runs are
  return [_finish([row], result, [r for r in runs if r.get("task") == task])[0]
          for row, task in zip(rows, ("mqar", "lm"))]


# ----------------------------------------------------------------------------- all studies

CLAIM_FUNCTIONS = {"cost": cost_claims, "approximation": approximation_claims,
                   "mqar": mqar_claims, "synthetic": synthetic_claims, "lm": lm_claims,
                   "listops": listops_claims, "extrapolation": extrapolation_claims,
                   "hybrid": hybrid_claims}
_TEMPLATES = {"cost": COST_CLAIMS, "approximation": APPROX_CLAIMS, "mqar": MQAR_CLAIMS,
              "synthetic": SYN_CLAIMS, "lm": LM_CLAIMS, "listops": LISTOPS_CLAIMS,
              "extrapolation": EXTRAP_CLAIMS, "hybrid": HYBRID_CLAIMS}


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
    return CLAIM_FUNCTIONS[study](result)
  except SchemaError as e:
    return _unmeasured(study, f"results file in an older format: rerun the study ({e})")


def load(results_dir: str, study: str) -> dict | None:
  """``<results_dir>/<study>/<study>.json`` as a dict, or None when missing; the study's
  ``COMPANIONS`` files found under ``results_dir`` are added under their names."""
  path = os.path.join(results_dir, study, f"{study}.json")
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
  p.add_argument("--results", default=DEFAULT_RESULTS,
                 help="results folder with <study>/<study>.json (default: results/studies)")
  p.add_argument("--out", default=None, help="JSON to write (default: <results>/claims.json)")
  a = p.parse_args(argv)
  rows = all_claims(a.results)
  print(format_table(rows))
  print(summary(rows))
  out = a.out or os.path.join(a.results, "claims.json")
  doc = {"generated_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(
             timespec="seconds"),
         "rules": "see the docstring of experiments/claims.py",
         "results": sources(a.results), "claims": rows}
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
