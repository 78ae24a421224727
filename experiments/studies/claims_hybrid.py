"""The claims of the hybrids: the published claims, the rules that judge them, the rows.

Hybrids (``study_hybrid.py``), rows classed by their pattern (only ``A``: softmax; one
recurrent letter: recurrent; mixed with ``A``: hybrid):

* recall (MQAR), judged on the best hybrid (the reason gives the others' verdicts): the
  hybrid significantly above the pure recurrent model and solved (>= ``SOLVED``) or not
  significantly below pure softmax: reproduced; significantly above the recurrent model
  only: reproduced in shape; else not reproduced.
* language modelling: the hybrid's bits per byte at or below both pure models': reproduced;
  within ``CLOSE_BPB`` of the better: reproduced in shape; else not reproduced (one seed).

See ``claims.py`` for the table, the verdicts and the rules every study shares.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the modules beside
from claims_common import (  # noqa: E402
    CLOSE_BPB, IN_SHAPE, NOT_MEASURED, NOT_REPRODUCED, REPRODUCED, SOLVED, _acc, _finish, _need,
    _row, diff_se, significant)


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
  """Claim rows of the hybrid study (``experiments/studies/study_hybrid.py``).

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
    # The rule before the ASSS point was added judged the planned pattern (rules/hybrid.json).
    planned = next((r for r in mq["hybrid"] if r["pattern"] == "SSSA"), None)
    if planned is not None:
      rows[-1]["old_verdict"] = _recall_verdict(planned, rec, sm)[0]
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
