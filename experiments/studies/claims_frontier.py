"""The claim of the recall-versus-state frontier: the published claim, its rule, the row.

The frontier (``study_frontier.py``; Zoology, Arora et al. 2023, figures 2-3; Based, Arora
et al. 2024, figure 2): MQAR test accuracy per (architecture, state value) at a fixed width,
the rows of ``table`` (each a seed mean with its standard error: clustered by sequence for
one seed, between seeds for several).

* recall grows with the state within an architecture: for each architecture with at least
  two state values, the accuracy at its largest state minus at its smallest, with the
  standard error ``sqrt(se_a**2 + se_b**2)``. Architectures solved (>= ``SOLVED``) at their
  smallest state are left out (they cannot grow) and named. Fewer than 3 architectures
  left: not measured. The difference significantly positive (> ``Z`` SE) in every one left:
  reproduced; significantly positive in more than half and significantly negative in none:
  reproduced in shape; else not reproduced. (``rules/frontier.json`` states the same rule,
  committed before the results.)

See ``claims.py`` for the table, the verdicts and the rules every study shares.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the modules beside
from claims_common import (  # noqa: E402
    IN_SHAPE, NOT_MEASURED, NOT_REPRODUCED, REPRODUCED, SOLVED, Z, _acc, _finish, _need, _row,
    diff_se, significant)

FRONTIER_SOURCE = "Zoology (Arora et al. 2023), figures 2-3; Based (Arora et al. 2024), figure 2"
FRONTIER_CLAIMS = {
    "growth": ("Within one architecture, MQAR recall grows with its state size (fixed width)",
               FRONTIER_SOURCE, "accuracy rises with the state floats along each architecture's "
               "line"),
}
MIN_ARCHITECTURES = 3  # the figure's lines: fewer cannot show a pattern across architectures


def growth(table: list[dict]) -> list[dict]:
  """Per architecture with >= 2 state values: its smallest and largest state's rows, the
  difference of their accuracies and its standard error, in table order."""
  lines: dict[str, list[dict]] = {}
  for r in table:
    lines.setdefault(r["mixer"], []).append(r)
  out = []
  for m, rows in lines.items():
    if len({r["state_floats"] for r in rows}) < 2:
      continue
    lo = min(rows, key=lambda r: r["state_floats"])
    hi = max(rows, key=lambda r: r["state_floats"])
    out.append({"mixer": m, "small": lo, "large": hi, "diff": hi["accuracy"] - lo["accuracy"],
                "se": diff_se(hi["se"], lo["se"])})
  return out


def frontier_claims(result: dict) -> list[dict]:
  """Claim rows of the frontier study (``experiments/studies/study_frontier.py``)."""
  table = result.get("table") or []
  _need(all(k in r for r in table for k in ("mixer", "state_floats", "accuracy", "se")),
        "frontier table rows lack mixer/state_floats/accuracy/se")
  cfg = result["config"]
  claim, source, published = FRONTIER_CLAIMS["growth"]
  budget = (f"budget: T={cfg['seq_len']}, {cfg['num_kv_pairs']} pairs, d={cfg['d_model']}, "
            f"vocabulary {cfg['vocab']}, <= {cfg['steps']} steps of {cfg['batch']} sequences "
            f"({result.get('budget', {}).get('fraction_of_paper_examples', 0):.2%} of Zoology's "
            "examples)")
  lines = growth(table)
  text = "; ".join(
      f"{g['mixer']} {g['small']['state_value']:g}->{g['large']['state_value']:g} "
      f"({g['small']['state_floats']:,}->{g['large']['state_floats']:,} floats): "
      f"{g['small']['accuracy']:.3f}->{g['large']['accuracy']:.3f}, "
      f"{_acc(g['diff'], g['se'])}" for g in lines) or "-"
  saturated = [g["mixer"] for g in lines if g["small"]["accuracy"] >= SOLVED]
  judged = [g for g in lines if g["mixer"] not in saturated]
  left_out = (f"; left out, solved (>= {SOLVED}) at their smallest state: "
              f"{', '.join(saturated)}" if saturated else "")
  up = [g["mixer"] for g in judged if significant(g["diff"], g["se"])]
  down = [g["mixer"] for g in judged if significant(-g["diff"], g["se"])]
  if len(judged) < MIN_ARCHITECTURES:
    v, why = NOT_MEASURED, (f"{len(judged)} architectures with two state sizes to judge, "
                            f"{MIN_ARCHITECTURES} needed")
  elif len(up) == len(judged):
    v, why = REPRODUCED, f"largest minus smallest state > {Z:g} SE in all {len(judged)}"
  elif 2 * len(up) > len(judged) and not down:
    v, why = IN_SHAPE, (f"largest minus smallest state > {Z:g} SE in {len(up)} of "
                        f"{len(judged)} ({', '.join(up)}), significantly negative in none")
  else:
    v, why = NOT_REPRODUCED, (f"largest minus smallest state > {Z:g} SE in {len(up)} of "
                              f"{len(judged)}" + (f"; significantly negative: {', '.join(down)}"
                                                  if down else ""))
  row = _row("frontier", claim, source, published, text, v, f"{why}{left_out}; {budget}")
  return _finish([row], result, result.get("runs") or [])
