"""The claims of MQAR: the published claims, the rules that judge them, the rows.

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

See ``claims.py`` for the table, the verdicts and the rules every study shares.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the modules beside
from claims_common import (  # noqa: E402
    IN_SHAPE, LEARNED, NOT_MEASURED, NOT_REPRODUCED, REPRODUCED, SOLVED, Z, _acc, _finish,
    _need, _row, binomial_se, diff_se, significant, spearman)


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
# Result files the MQAR claims read besides mqar.json (``claims.load`` adds them): the decay-init
# claim's re-run at the budget where the effect shows, with seeds (study_mqar.py --out there).
INIT_RERUN = "init_rerun"
COMPANIONS = {"mqar": {INIT_RERUN: "mqar_c16/mqar.json"}}
# The Mamba family, whose decay init the MQAR study sweeps (``INITS`` of study_mqar.py).
INIT_SWEPT = ("mamba", "mamba2", "hawk")


def mqar_claims(result: dict) -> list[dict]:
  """Claim rows of the MQAR study (``experiments/studies/study_mqar.py``); rules in the module doc."""
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
  # The binomial SE takes a sequence's queries as independent; runs written before per-sequence
  # scores were stored cannot be given the clustered one.
  binomial = sum(r.get("se_kind", "binomial") == "binomial" for r in table)
  if binomial:
    base += (f"; SE binomial at {binomial} of {len(table)} points (per-sequence scores not "
             "stored: the SE clustered by sequence needs a re-run)")

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
        # Each init's own SE where the table has it (between-seed or clustered), else binomial.
        se = diff_se((r.get("init_se") or {}).get(key, binomial_se(acc, n)),
                     r["default_init_se"] if r.get("default_init_se") is not None
                     else binomial_se(d_acc, n))
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
  rows = _finish(rows, result, [r for r in runs if r.get("status") not in ("not run", "stopped")
                                or (r.get("status") == "stopped" and "test_accuracy" not in r)])
  rerun = result.get(INIT_RERUN)
  return rows if not rerun else [_init_rerun_row(rerun) if r["claim"] == MQAR_CLAIMS["init"][0]
                                 else r for r in rows]


def _init_rerun_row(rerun: dict) -> dict:
  """The decay-init claim judged on its re-run (``INIT_RERUN``: the point where the effect
  was seen, at the larger step budget, with seeds) instead of the sweep's single-seed points;
  ``seeds`` is the re-run's fewest seeds per (init, point)."""
  row = next(r for r in mqar_claims(rerun) if r["claim"] == MQAR_CLAIMS["init"][0])
  row["seeds"] = min((int(r.get("n_seeds", 1)) for r in rerun.get("table") or []), default=1)
  steps = (rerun.get("budget") or {}).get("steps_max")
  seeds = "; ".join(
      f"{r['mixer']} T={r['seq_len']}, d={r['d_model']} per seed: " + ", ".join(
          f"{k.split('@')[0]} {' '.join(f'{a:.3f}' for a in v)}"
          for k, v in sorted((r.get("init_seed_accuracies") or {}).items()))
      for r in rerun.get("table") or [])
  row["reason"] = (f"re-run (results/studies/{COMPANIONS['mqar'][INIT_RERUN]}, {steps:,} steps), which "
                   f"replaces the 1,000-step sweep's points for this claim ({seeds}); "
                   f"{row['reason']}")
  row["results_date_utc"] = (rerun.get("environment") or {}).get("date_utc")
  return row


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
