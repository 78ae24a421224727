"""The claims of length extrapolation: the published claims, the rules that judge them, the rows.

Length extrapolation (``study_extrapolation.py``): per mixer, the paired change (per
evaluated window) of the mean loss in each position bucket beyond the training length
against the last bucket inside it (positions L/2 to L), with its SE over windows:

* softmax with RoPE degrades: its last bucket significantly above and by more than
  ``EXTRAP_TOL`` (0.05 nats): reproduced; some bucket beyond significantly above:
  reproduced in shape; else not reproduced.
* Mamba, GLA and RetNet (``EXTRAP_GATED``, with Mamba-2) extrapolate: each one's worst bucket beyond at
  most ``EXTRAP_TOL`` above or not significantly above: reproduced; some flat and every one
  rising less than softmax: reproduced in shape; else not reproduced.

See ``claims.py`` for the table, the verdicts and the rules every study shares.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the modules beside
from claims_common import (  # noqa: E402
    IN_SHAPE, NOT_MEASURED, NOT_REPRODUCED, REPRODUCED, Z, _finish, _need, _row, significant)


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
  """Claim rows of the length-extrapolation study (``experiments/studies/study_extrapolation.py``)."""
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
