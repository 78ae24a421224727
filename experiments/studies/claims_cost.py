"""The claims of cost: the published claims, the rules that judge them, the rows.

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

See ``claims.py`` for the table, the verdicts and the rules every study shares.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the modules beside
from claims_common import (  # noqa: E402
    CONSTANT_SLOPE, IN_SHAPE, LINEAR_SLOPE, NOT_MEASURED, NOT_REPRODUCED, QUADRATIC_SLOPE,
    REPRODUCED, SEPARATED_SLOPE, _finish, _need, _row)


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
  """Claim rows of the cost study (``experiments/studies/study_cost.py``): fitted log-log slopes."""
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
