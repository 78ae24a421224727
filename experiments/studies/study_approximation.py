"""Approximation study: random-feature attention against exact softmax attention.

Reproduces the setting of the Performer paper's approximation experiment
(Choromanski et al. 2020, "Rethinking Attention with Performers", section 4.2,
figure 4): ``L = 4096`` tokens, head dimension ``d = 16``, the mean squared
error of the attention *output* of kernelized attention against exact softmax
attention, as the number of random features ``m`` grows, 15 seeds.

Inputs (one batch row, one head), drawn afresh for every seed: ``q, k`` rows
~ ``s * N(0, I_d)``, ``v`` rows ~ ``N(0, I_d)``, and the softmax temperature is
the default ``scale = d ** -0.5``, so the logits ``q.k / sqrt(d)`` have
standard deviation ``s ** 2``. The main setting is ``s = 1`` (logits O(1);
the same as rows ~ ``N(0, I_d) / d ** 0.25`` with temperature 1); ``s = 0.5``
(logit std 0.25, nearly uniform attention) is run beside it because which
feature map wins depends on the input norms (the variance of the positive
estimator grows like ``exp(|x + y|^2)``, the trigonometric one's like
``exp(|x|^2 + |y|^2)`` times a factor that vanishes as ``x -> y``). The exact
reference is ``ops.softmax_attention`` (naive form, float32). The MSE is the
mean over tokens and value channels of ``(o_approx - o_exact) ** 2``.

Variants (all through ``ops.linear_attention``, normalised, the same inputs
per seed):

* ``trig_iid``: ``feature_map="performer_trig"`` with its own iid draw (``key=``);
* ``trig_orthogonal``: ``feature_map="performer_trig"`` with an explicit
  ``projection=random_projection(key, m, d, orthogonal=True)``: the op offers
  no orthogonal trigonometric map by name, so the projection is passed in
  (it is the very projection ``favor+`` draws from the same key);
* ``positive_iid``: ``feature_map="performer_positive"`` (``key=``);
* ``positive_orthogonal``: ``feature_map="favor+"`` (``key=``);
* ``elu``: ELU+1 (deterministic, no ``m``): a flat reference line.

``m`` counts projection rows: the trigonometric map has ``2m`` features
(``cos`` and ``sin``), the positive maps ``m``. Non-causal and causal
(chunk form) attention are both measured.

    python experiments/studies/study_approximation.py            # full size (minutes)
    python experiments/studies/study_approximation.py --smoke    # tiny, for CI
    python experiments/studies/study_approximation.py --noncausal-only --features 16,64,256

Writes ``<out>/approximation.json`` and ``<out>/approximation.csv`` and prints
a table and a verdict on the paper's two claims (orthogonal beats iid,
positive beats trigonometric).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _study_utils as su  # noqa: E402

VARIANTS = {
    # name: (feature_map, orthogonal projection, passed explicitly)
    "trig_iid": ("performer_trig", False, False),
    "trig_orthogonal": ("performer_trig", True, True),
    "positive_iid": ("performer_positive", False, False),
    "positive_orthogonal": ("favor+", True, False),
}
# The paper's two claims as (better, worse) pairs.
COMPARISONS = {
    "orthogonal_vs_iid": [("trig_orthogonal", "trig_iid"),
                          ("positive_orthogonal", "positive_iid")],
    "positive_vs_trig": [("positive_iid", "trig_iid"),
                         ("positive_orthogonal", "trig_orthogonal")],
}
CSV_COLUMNS = ["setting", "causal", "qk_scale", "variant", "m", "mse_mean", "mse_std",
               "mse_median", "n_seeds"]


def make_inputs(seed: int, length: int, dim: int, qk_scale: float = 1.0):
  """Returns ``(q, k, v, feature_key)``, ``q, k, v`` ``[1, L, 1, d]``.

  Args:
    seed: the seed; inputs and the projection key both derive from it.
    length: ``L``.
    dim: ``d`` (also the value width).
    qk_scale: ``q`` and ``k`` rows are ``qk_scale * N(0, I_d)``, so the logits
      ``q.k / sqrt(d)`` have standard deviation ``qk_scale ** 2``; ``v`` rows
      are ``N(0, I_d)``.
  """
  import jax
  kq, kk, kv, kf = jax.random.split(jax.random.PRNGKey(seed), 4)
  shape = (1, length, 1, dim)
  return (qk_scale * jax.random.normal(kq, shape), qk_scale * jax.random.normal(kk, shape),
          jax.random.normal(kv, shape), kf)


def approx_fn(variant: str, m: int, causal: bool, chunk_size: int):
  """A jitted ``(q, k, v, key) -> o`` for one variant (or ``"elu"``) and ``m``."""
  import jax
  from linear_attention import ops

  if variant == "elu":
    return jax.jit(lambda q, k, v, key: ops.linear_attention(
        q, k, v, feature_map="elu", causal=causal, chunk_size=chunk_size))
  fmap, orthogonal, explicit = VARIANTS[variant]

  def fn(q, k, v, key):
    if explicit:
      proj = ops.random_projection(key, m, q.shape[-1], orthogonal=orthogonal)
      return ops.linear_attention(q, k, v, feature_map=fmap, projection=proj,
                                  causal=causal, chunk_size=chunk_size)
    return ops.linear_attention(q, k, v, feature_map=fmap, key=key, num_features=m,
                                causal=causal, chunk_size=chunk_size)

  return jax.jit(fn)


def setting_name(causal: bool, qk_scale: float) -> str:
  """The label of one input setting, e.g. ``"noncausal, qk_scale=1"``."""
  return f"{'causal' if causal else 'noncausal'}, qk_scale={qk_scale:g}"


def run(length: int, dim: int, seeds: int, feature_counts: list[int], causal_modes: list[bool],
        qk_scales: list[float] = (1.0,), chunk_size: int = 64, log=print) -> dict:
  """Runs the study; returns the JSON-ready results.

  Args:
    length, dim: ``L`` and ``d``.
    seeds: number of seeds (``0 .. seeds - 1``).
    feature_counts: the values of ``m``.
    causal_modes: which of non-causal (False) and causal (True) to run.
    qk_scales: input scales (see :func:`make_inputs`); each is one setting.
    chunk_size: chunk length of the causal chunk form.
    log: where progress lines go.

  Returns:
    ``{"settings", "rows", "exact_output_var", "nonfinite_outputs"}``; a row
    per (setting, variant, m) with the per-seed MSE and its mean, std, median.
  """
  import jax
  import jax.numpy as jnp
  import numpy as np
  from linear_attention import ops

  mse = lambda a, b: float(jnp.mean((a.astype(jnp.float32) - b) ** 2))
  rows, exact_var, nonfinite, settings = [], {}, 0, []
  for causal in causal_modes:
    exact = jax.jit(lambda q, k, v: ops.softmax_attention(
        q, k, v, causal=causal, algorithm="naive"))
    fns = {(vname, m): approx_fn(vname, m, causal, chunk_size)
           for vname in VARIANTS for m in feature_counts}
    fns[("elu", None)] = approx_fn("elu", None, causal, chunk_size)
    for qk_scale in qk_scales:
      tag = setting_name(causal, qk_scale)
      settings.append(tag)
      per, var = {}, []  # (variant, m) -> per-seed MSE
      t0 = time.perf_counter()
      for s in range(seeds):
        q, k, v, kf = make_inputs(s, length, dim, qk_scale)
        o_ex = exact(q, k, v)
        var.append(float(jnp.var(o_ex)))
        for key_, fn in fns.items():
          o = fn(q, k, v, kf)
          if not bool(jnp.all(jnp.isfinite(o))):
            nonfinite += 1
          per.setdefault(key_, []).append(mse(o, o_ex))
        log(f"  {tag}: seed {s + 1}/{seeds} done ({time.perf_counter() - t0:.0f}s)")
      exact_var[tag] = float(np.mean(var))
      for (vname, m), vals in per.items():
        a = np.asarray(vals)
        rows.append({"setting": tag, "causal": causal, "qk_scale": qk_scale, "variant": vname,
                     "m": m, "mse_mean": float(a.mean()),
                     "mse_std": float(a.std(ddof=1)) if len(a) > 1 else 0.0,
                     "mse_median": float(np.median(a)), "n_seeds": len(a),
                     "mse_per_seed": [float(x) for x in a]})
  return {"settings": settings, "rows": rows, "exact_output_var": exact_var,
          "nonfinite_outputs": nonfinite}


def _paired(d):
  """``(mean, standard error, outcome)`` of per-seed differences ``d`` (worse - better)."""
  import numpy as np
  mean = float(np.mean(d))
  se = float(np.std(d, ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("inf")
  return mean, se, ("holds" if mean > 2 * se else "fails" if mean < -2 * se else "unclear")


def compare(rows: list[dict]) -> dict:
  """The paper's claims, checked per setting and ``m`` with paired tests over seeds.

  For a pair (better, worse) at one ``m`` the seeds share their inputs, so the
  per-seed differences are paired. Two tests: on the MSE itself
  (``d_s = mse_worse - mse_better``) and on its logarithm (``log mse_worse -
  log mse_better``, the geometric-mean ratio), which heavy-tailed errors (one
  bad projection draw dominating the mean) do not swamp. A claim holds at that
  ``m`` when the mean difference exceeds two standard errors, fails when it is
  below minus two, and is unclear otherwise.

  Returns:
    ``{setting: {claim: [{better, worse, m, ratio, geo_ratio, outcome, outcome_log, ...}]}}``.
  """
  import numpy as np
  by = {(r["setting"], r["variant"], r["m"]): r for r in rows}
  out = {}
  for tag in dict.fromkeys(r["setting"] for r in rows):
    ms = sorted({r["m"] for r in rows if r["m"] is not None and r["setting"] == tag})
    out[tag] = {}
    for claim, pairs in COMPARISONS.items():
      res = []
      for better, worse in pairs:
        for m in ms:
          b, w = by[(tag, better, m)], by[(tag, worse, m)]
          eb, ew = np.asarray(b["mse_per_seed"]), np.asarray(w["mse_per_seed"])
          mean, se, outcome = _paired(ew - eb)
          lmean, lse, loutcome = _paired(np.log(ew) - np.log(eb))
          res.append({"better": better, "worse": worse, "m": m, "mean_diff": mean, "se": se,
                      "ratio": w["mse_mean"] / b["mse_mean"] if b["mse_mean"] > 0 else None,
                      "outcome": outcome, "log_mean_diff": lmean, "log_se": lse,
                      "geo_ratio": float(np.exp(lmean)), "outcome_log": loutcome})
      out[tag][claim] = res
  return out


def table(result: dict) -> str:
  """The headline table: MSE mean (std) median per ``m`` and variant, per setting."""
  rows = result["rows"]
  names = list(VARIANTS) + ["elu"]
  lines = []
  for tag in result["settings"]:
    sub = [r for r in rows if r["setting"] == tag]
    lines.append(f"\n{tag}: output MSE vs exact softmax, mean (std) median over "
                 f"{sub[0]['n_seeds']} seeds; var(o_exact) = "
                 f"{result['exact_output_var'][tag]:.3g}")
    lines.append(f"{'m':>6s} " + " ".join(f"{n:>31s}" for n in names))
    elu = next(r for r in sub if r["variant"] == "elu")
    for m in sorted({r["m"] for r in sub if r["m"] is not None}):
      cells = []
      for n in names:
        r = elu if n == "elu" else next(x for x in sub if x["variant"] == n and x["m"] == m)
        cells.append(f"{r['mse_mean']:.3e} ({r['mse_std']:.1e}) {r['mse_median']:.2e}")
      lines.append(f"{m:6d} " + " ".join(f"{c:>31s}" for c in cells))
  return "\n".join(lines)


def verdict(comparison: dict) -> str:
  """One line per setting, claim and pair: at how many ``m`` it holds or is reversed."""
  lines = []
  for tag, claims in comparison.items():
    for claim, res in claims.items():
      for better, worse in COMPARISONS[claim]:
        sub = [r for r in res if r["better"] == better and r["worse"] == worse]
        count = lambda key, val: sum(r[key] == val for r in sub)
        lines.append(
            f"{tag}: {better} beats {worse}: mean MSE holds at {count('outcome', 'holds')}/"
            f"{len(sub)} m, reversed at {count('outcome', 'fails')}; log MSE holds at "
            f"{count('outcome_log', 'holds')}/{len(sub)}, reversed at "
            f"{count('outcome_log', 'fails')}")
        lines.append("    ratio worse/better (mean; geometric): " + ", ".join(
            f"m={r['m']}: {r['ratio']:.2f}; {r['geo_ratio']:.2f}" for r in sub))
  return "\n".join(lines)


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--length", type=int, default=4096)
  p.add_argument("--dim", type=int, default=16)
  p.add_argument("--seeds", type=int, default=15)
  p.add_argument("--features", default="16,32,64,128,256,512,1024",
                 help="comma-separated numbers of random features m")
  p.add_argument("--qk-scales", default="1,0.5",
                 help="comma-separated input scales: q, k rows ~ s * N(0, I), logit std s**2")
  p.add_argument("--noncausal-only", action="store_true")
  p.add_argument("--chunk-size", type=int, default=64)
  p.add_argument("--out", default=None,
                 help="results folder (default: runs/results/studies/approximation; "
                      "runs/smoke/studies/approximation with --smoke; the committed one "
                      "only when named: --out results/studies/approximation)")
  p.add_argument("--smoke", action="store_true", help="tiny sizes, for CI (seconds)")
  a = p.parse_args(argv)
  a.out = a.out or su.default_out("approximation", a.smoke)
  if a.smoke:
    a.length, a.seeds, a.features, a.qk_scales = 256, 2, "16,64", "1"
  feature_counts = [int(x) for x in a.features.split(",")]
  if a.seeds < 2:
    raise SystemExit(f"--seeds must be >= 2 for a spread, got {a.seeds}")
  modes = [False] if a.noncausal_only else [False, True]
  qk_scales = [float(x) for x in a.qk_scales.split(",")]
  config = {"L": a.length, "d": a.dim, "dv": a.dim, "seeds": a.seeds,
            "feature_counts": feature_counts, "causal_modes": modes, "qk_scales": qk_scales,
            "chunk_size": a.chunk_size, "smoke": a.smoke,
            "inputs": "q, k rows ~ qk_scale * N(0, I_d), v rows ~ N(0, I_d), fresh per seed "
                      "(seed s: jax.random.split(PRNGKey(s), 4) -> q, k, v, projection key); "
                      "softmax temperature d**-0.5, so the logits q.k/sqrt(d) have standard "
                      "deviation qk_scale**2 (1: logits O(1), the main setting; 0.5: weak, "
                      "nearly uniform attention)",
            "metric": "mean over tokens and channels of (o_approx - o_exact)**2, "
                      "o_exact = softmax_attention(naive, float32)",
            "variants": {n: {"feature_map": f, "orthogonal": o, "projection_passed_explicitly": e}
                         for n, (f, o, e) in VARIANTS.items()},
            "note": "m = projection rows; performer_trig has 2m features (cos, sin). "
                    "trig_orthogonal passes random_projection(key, m, d, orthogonal=True) "
                    "explicitly because the op has no orthogonal trigonometric map by name."}
  t0 = time.perf_counter()
  res = run(a.length, a.dim, a.seeds, feature_counts, modes, qk_scales, a.chunk_size)
  comparison = compare(res["rows"])
  elapsed = time.perf_counter() - t0
  print(table(res))
  print("\nPerformer claims (paired over seeds, 2 standard errors):")
  print(verdict(comparison))
  out = {"study": "approximation", "config": config, "environment": su.environment(),
         "elapsed_s": elapsed, **res, "comparison": comparison}
  path = os.path.join(a.out, "approximation.json")
  su.write_json(path, out)
  su.write_csv(os.path.join(a.out, "approximation.csv"),
               [dict(r, causal=int(r["causal"])) for r in res["rows"]], CSV_COLUMNS)
  print(f"\nwrote {path} ({elapsed:.0f}s)")


if __name__ == "__main__":
  main()
