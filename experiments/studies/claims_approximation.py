"""The claims of approximation: the published claims, the rules that judge them, the rows.

Approximation (Choromanski et al. 2021, FAVOR+), per setting (causal or not,
logit scale), from ``comparison``: the paired test over seeds on the log MSE
(``outcome_log``: holds / fails / unclear at each feature count ``m``):

* holds at more than half of the comparisons and fails at none: reproduced;
  holds at more than it fails: reproduced in shape; unclear (within ``Z`` SE) at more
  than ``UNCLEAR_FRACTION`` of them: inconclusive (underpowered); else not reproduced.
  The thresholds live in ``rules/common.json``.

See ``claims.py`` for the table, the verdicts and the rules every study shares.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the modules beside
from claims_common import (  # noqa: E402
    IN_SHAPE, INCONCLUSIVE, NOT_MEASURED, NOT_REPRODUCED, REPRODUCED, UNCLEAR_FRACTION, Z,
    _finish, _need, _row)


FAVOR = "Choromanski et al. 2021 (FAVOR+), section 2"
APPROX_CLAIMS = {
    "positive_vs_trig": ("Positive random features approximate softmax better than "
                         "trigonometric ones ({setting})", FAVOR,
                         "positive features: lower error (no single figure)"),
    "orthogonal_vs_iid": ("Orthogonal random features reduce the error ({setting})", FAVOR,
                          "orthogonal features: lower error (no single figure)"),
}


def approximation_claims(result: dict) -> list[dict]:
  """Claim rows of the approximation study (``experiments/studies/study_approximation.py``)."""
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
      elif unclear > UNCLEAR_FRACTION * len(res):
        verdict, reason = INCONCLUSIVE, (f"within {Z:g} SE at {unclear} of {len(res)} "
                                         "comparisons: underpowered, no direction shown")
      elif fails:
        verdict, reason = NOT_REPRODUCED, "reversed at least as often as it holds"
      else:
        verdict, reason = NOT_REPRODUCED, f"no difference beyond {Z:g} SE at any m"
      rows.append(_row(study, claim.format(setting=setting), source, published, ours, verdict,
                       reason))
  return _finish(rows, result)
