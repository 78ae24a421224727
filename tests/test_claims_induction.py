"""The Mamba-2 induction-heads probe's claim row: Mamba-2 variants trained long (issue 30)."""

from __future__ import annotations

from tests import helpers

claims = helpers.load_experiment("claims")


def _probe(curves: dict, variants: dict, stopped: dict = ()) -> dict:
  """A probe result with one run per variant: ``curves`` {variant: [(step, accuracy)]}."""
  stopped = dict(stopped)
  mixer = lambda v: "mamba" if v.startswith("m1_") or v == "mamba" else "mamba2"
  return {"config": {"seq_len": 256, "batch": 16, "test_examples": 128, "eval_every": 100,
                     "variants": variants},
          "chance": 1 / 15,
          "table": [{"variant": v, "mixer": mixer(v), "sparse_test": c[-1][1], "sparse_se": 0.02,
                     "steps": c[-1][0], "stopped_at": stopped.get(v)} for v, c in curves.items()],
          "runs": [{"variant": v, "overrides": {"model.mixer": mixer(v)},
                    "sparse_test_curve": [{"step": s, "accuracy": a} for s, a in c]}
                   for v, c in curves.items()]}


def test_mamba2_variant_that_learns_names_its_change_and_when_it_leaves_chance():
  m2 = "model.mixer_kwargs.mamba2."
  variants = {"default_1k": {"model.mixer": "mamba2", "train.steps": 1000},
              "default_2k": {"model.mixer": "mamba2", "train.steps": 2000},
              "m2_dt_conv_2k": {"model.mixer": "mamba2", m2 + "dt_from_conv": True,
                                "train.steps": 2000},
              "m2_slow_2k": {"model.mixer": "mamba2", m2 + "a_init_range": [0.03, 0.5]}}
  curves = {"default_1k": [(500, 0.07), (1000, 0.06)],
            "default_2k": [(500, 0.07), (1000, 0.06), (1500, 0.08)],
            "m2_dt_conv_2k": [(500, 0.07), (1500, 0.12), (1600, 0.63), (2000, 0.98)],
            "m2_slow_2k": [(500, 0.06), (1000, 0.3)],
            "mamba": [(400, 0.25), (500, 0.95)]}
  row = claims.claims_synthetic._mamba2_probe_row(_probe(curves, variants, {"default_2k": 1500}), None)
  assert row["verdict"] == claims.IN_SHAPE
  reason = row["reason"]
  assert ("Mamba-2 learns (>= 0.5) with: m2_dt_conv_2k (dt_from_conv=True; 0.980 at 2000, "
          ">= 0.5 from step 1600)") in reason
  assert "default_2k (0.080 at 1500 (stopped part-way))" in reason
  # The longest run of a variant stands for its shorter ones (default_2k for default_1k).
  assert ("Mamba-2 leaves chance (>= 0.2) with: m2_dt_conv_2k from step 1600, m2_slow_2k "
          "from step 1000; not within its steps: default_2k (1500)") in reason
  assert "default_1k (1000)" not in reason and "default_1k (0.060" not in reason
  # Nothing learns: not reproduced, and no Mamba-2 escape part.
  curves = {"default_2k": [(1000, 0.06), (2000, 0.07)], "mamba": [(400, 0.25), (500, 0.95)]}
  row = claims.claims_synthetic._mamba2_probe_row(_probe(curves, variants), None)
  assert row["verdict"] == claims.NOT_REPRODUCED
  assert "Mamba-2 leaves chance" not in row["reason"]
