"""The claims of the synthetic tasks: the published claims, the rules that judge them, the rows.

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

See ``claims.py`` for the table, the verdicts and the rules every study shares.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the modules beside
from claims_common import (  # noqa: E402
    IN_SHAPE, LEARNED, NOT_MEASURED, NOT_REPRODUCED, REPRODUCED, SELECTIVE, SOLVED, Z, _acc,
    _finish, _need, _row, _smoke, binomial_se, diff_se, significant)


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
  """Claim rows of the synthetic study (``experiments/studies/study_synthetic.py``)."""
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
