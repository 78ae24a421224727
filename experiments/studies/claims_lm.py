"""The claims of language modelling: the published claims, the rules that judge them, the rows.

Language modelling (GLA, Yang et al. 2024; Mamba; Katharopoulos et al. 2020),
per corpus, one seed per run:

* gated mixers (``GATED``) within ``CLOSE_BPB`` (0.05) bits/byte of softmax or
  better: a majority of them: reproduced; at least one: reproduced in shape;
  none: not reproduced.
* ungated mixers (``UNGATED``) worse than softmax by more than ``CLOSE_BPB``:
  all of them: reproduced; all worse by any amount: reproduced in shape; else
  not reproduced.

See ``claims.py`` for the table, the verdicts and the rules every study shares.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the modules beside
from claims_common import (  # noqa: E402
    CLOSE_BPB, GATED, IN_SHAPE, NOT_MEASURED, NOT_REPRODUCED, REPRODUCED, UNGATED, _finish,
    _need, _row, diff_se)


LM_CLAIMS = {
    "gated": ("Gated linear-time models come close to or match softmax at equal parameters and "
              "tokens ({corpus})", "GLA (Yang et al. 2024), table 2; Mamba (Gu & Dao 2023)",
              "gated models match or come close to the Transformer baseline"),
    "ungated": ("Ungated linear attention and Performer are clearly worse than softmax "
                "({corpus})", "Katharopoulos et al. 2020; GLA (Yang et al. 2024), table 2",
                "clearly worse than softmax attention"),
}


def lm_claims(result: dict) -> list[dict]:
  """Claim rows of the language-modelling study (``experiments/studies/study_lm.py``)."""
  table = result.get("table") or []
  _need(all("corpus" in r and "mixer" in r and "bits_per_byte" in r for r in table),
        "lm table rows lack corpus/mixer/bits_per_byte")
  study = "lm"
  cfg = result["config"]
  rows = []
  tokens = result.get("training_tokens")
  val = cfg.get("eval_batches", 0) * cfg.get("batch", 0) * cfg.get("seq_len", 0)
  budget = (f"budget: {tokens:,} training tokens per run" if tokens else "budget: see lm.json")
  seeds = sorted({r.get("n_seeds", 1) for r in table}) or [1]
  budget += (f"; {seeds[0]} seed{'s' * (seeds[0] != 1)}" if len(seeds) == 1 else
             f"; {seeds[0]}-{seeds[-1]} seeds")
  if any(r.get("lr") is not None for r in table):
    budget += "; learning rate per mixer: the best mean over seeds"
  for corpus in dict.fromkeys(r["corpus"] for r in table):
    bpb = {r["mixer"]: r["bits_per_byte"] for r in table
           if r["corpus"] == corpus and r["bits_per_byte"] is not None}
    # Between-seed SEs where 2+ seeds ran (study_lm's ``bpb_se``), for the gaps' errors.
    se = {r["mixer"]: r.get("bpb_se") for r in table if r["corpus"] == corpus}

    def gap_text(m, g):
      if se.get(m) is None or se.get("softmax") is None:
        return f"{m} {g:+.3f}"
      return f"{m} {g:+.3f} ± {diff_se(se[m], se['softmax']):.3f}"

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
              + ", ".join(gap_text(m, g) for m, g in sorted(gaps.items(), key=lambda x: x[1]))
              + f"; {head}")
      verdict = (REPRODUCED if len(close) > len(gaps) / 2 else IN_SHAPE if close
                 else NOT_REPRODUCED)
      add("gated", ours, verdict, f"majority within {CLOSE_BPB}: reproduced, one: in shape; "
          f"{budget}")
    ungated = {m: bpb[m] - ref for m in UNGATED if m in bpb}
    if not ungated:
      add("ungated", head, NOT_MEASURED, f"no ungated mixer; {budget}")
    else:
      ours = "gaps " + ", ".join(gap_text(m, g) for m, g in ungated.items()) + f"; {head}"
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
