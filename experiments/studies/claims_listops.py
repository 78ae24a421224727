"""The claims of ListOps: the published claims, the rules that judge them, the rows.

ListOps (Long Range Arena, Tay et al. 2021, table 1), on a reduced task, so
at most "reproduced in shape"; not measured when softmax is not significantly
above the majority-class rate (it learned nothing to compare):

* efficient variants do not beat the Transformer: no mixer significantly
  above softmax: reproduced in shape; else not reproduced.
* Performer falls far below the Transformer: Performer significantly below
  softmax: reproduced in shape; else not reproduced.

See ``claims.py`` for the table, the verdicts and the rules every study shares.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the modules beside
from claims_common import (  # noqa: E402
    IN_SHAPE, NOT_MEASURED, NOT_REPRODUCED, Z, _acc, _finish, _need, _row, binomial_se, diff_se,
    significant)


LRA = "Long Range Arena (Tay et al. 2021), table 1"
LISTOPS_CLAIMS = {
    "none_beat": ("Efficient Transformers do not beat the Transformer on ListOps", LRA,
                  "Transformer 36.37%; Linformer 35.70%, Longformer 35.63%, BigBird 36.05%, "
                  "Performer 18.01%"),
    "performer": ("Performer falls far below the Transformer on ListOps", LRA,
                  "Performer 18.01% vs Transformer 36.37%"),
}


def listops_claims(result: dict) -> list[dict]:
  """Claim rows of the ListOps study (``experiments/studies/study_listops.py``)."""
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
