"""The length-extrapolation and hybrid studies: bucketing, summaries and their claim rules."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tests import helpers

ex = helpers.load_experiment("study_extrapolation")
claims = helpers.load_experiment("claims")


def test_bucket_edges_are_powers_of_two_up_to_the_evaluated_length():
  assert ex.bucket_edges(512, 16384) == [0, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192,
                                         16384]
  assert ex.bucket_edges(32, 100) == [0, 1, 2, 4, 8, 16, 32, 64, 100]


def test_bucket_rows_mean_se_and_paired_change():
  # Two windows of 8 positions, trained length 4: buckets [0,1) [1,2) [2,4) [4,8).
  losses = np.array([[5.0, 4.0, 3.0, 3.0, 2.0, 2.0, 4.0, 4.0],
                     [7.0, 4.0, 1.0, 3.0, 3.0, 3.0, 3.0, 3.0]])
  rows = ex.bucket_rows("m", losses, [0, 1, 2, 4, 8], 4)
  assert [(r["start"], r["stop"]) for r in rows] == [(0, 1), (1, 2), (2, 4), (4, 8)]
  assert rows[0]["loss"] == pytest.approx(6.0)
  assert rows[0]["se"] == pytest.approx(np.std([5.0, 7.0], ddof=1) / math.sqrt(2))
  # Reference: the [2, 4) bucket (window means 3.0 and 2.0); [4, 8): 3.0 and 3.0.
  last = rows[3]
  assert last["beyond_training"] and not rows[2]["beyond_training"]
  assert last["delta_vs_trained"] == pytest.approx(0.5)  # mean of (0.0, 1.0)
  assert last["delta_se"] == pytest.approx(np.std([0.0, 1.0], ddof=1) / math.sqrt(2))
  assert rows[2]["delta_vs_trained"] == 0.0
  assert last["bits_per_byte"] == pytest.approx(3.0 / math.log(2))
  s = ex.summarize(rows, 4)
  assert s["lowest_loss_bucket"] == "2-4" and s["worst_bucket"] == "4-8"
  assert s["delta_last"] == pytest.approx(0.5) and s["loss_trained_end"] == pytest.approx(2.5)


def _extrap_result(deltas: dict) -> dict:
  """A full-size extrapolation result whose mixers rise by ``deltas[m] = (rise, se)``."""
  summary = [{"mixer": m, "train_len": 512, "worst_bucket": "8192-16384", "delta_worst": d,
              "delta_worst_se": se, "delta_last": d, "delta_last_se": se}
             for m, (d, se) in deltas.items()]
  return {"config": {"smoke": False, "seq_len": 512, "eval_windows": 8, "eval_len": 16384},
          "training_tokens": 1000, "summary": summary, "runs": []}


def test_extrapolation_claims_follow_the_rules():
  good = claims.extrapolation_claims(_extrap_result(
      {"softmax": (1.5, 0.1), "gla": (-0.05, 0.01), "mamba": (0.01, 0.01),
       "retnet": (0.2, 0.3)}))
  assert [r["verdict"] for r in good] == [claims.REPRODUCED, claims.REPRODUCED]
  bad = claims.extrapolation_claims(_extrap_result(
      {"softmax": (0.01, 0.1), "gla": (2.0, 0.1)}))
  assert [r["verdict"] for r in bad] == [claims.NOT_REPRODUCED, claims.NOT_REPRODUCED]
  shape = claims.extrapolation_claims(_extrap_result(
      {"softmax": (1.0, 0.1), "gla": (0.0, 0.01), "retnet": (0.5, 0.05)}))
  assert shape[1]["verdict"] == claims.IN_SHAPE
  none = claims.extrapolation_claims(_extrap_result({"local": (0.0, 0.01)}))
  assert [r["verdict"] for r in none] == [claims.NOT_MEASURED] * 2
  assert claims.study_claims("extrapolation", {"config": {}, "summary": [{"mixer": "x"}]})[0][
      "verdict"] == claims.NOT_MEASURED  # an older format


def _hybrid_result(mqar: dict, lm: dict) -> dict:
  table = [{"task": "mqar", "pattern": p, "score": s, "se": se, "test_items": 2048}
           for p, (s, se) in mqar.items()]
  table += [{"task": "lm", "pattern": p, "score": s, "se": None, "test_items": 65536}
            for p, s in lm.items()]
  return {"config": {"smoke": False, "num_layers": 4,
                     "mqar": {"batch": 64, "steps": 500, "seq_len": 128, "num_kv_pairs": 8}},
          "budget": {"lm_tokens": 1000}, "table": table, "runs": []}


def test_hybrid_claims_follow_the_rules():
  rows = claims.hybrid_claims(_hybrid_result(
      {"SSSS": (0.10, 0.01), "SSSA": (0.97, 0.004), "AAAA": (0.99, 0.002)},
      {"SSSS": 2.2, "SSSA": 2.1, "AAAA": 2.5}))
  assert [r["verdict"] for r in rows] == [claims.REPRODUCED, claims.REPRODUCED]
  rows = claims.hybrid_claims(_hybrid_result(
      {"SSSS": (0.10, 0.01), "SSSA": (0.50, 0.01), "AAAA": (0.99, 0.002)},
      {"SSSS": 2.2, "SSSA": 2.23, "AAAA": 2.5}))
  assert [r["verdict"] for r in rows] == [claims.IN_SHAPE, claims.IN_SHAPE]
  rows = claims.hybrid_claims(_hybrid_result(
      {"SSSS": (0.10, 0.01), "SSSA": (0.11, 0.01)}, {"SSSS": 2.2, "SSSA": 2.6, "AAAA": 2.5}))
  assert [r["verdict"] for r in rows] == [claims.NOT_REPRODUCED, claims.NOT_REPRODUCED]
  rows = claims.hybrid_claims(_hybrid_result({"AAAA": (0.99, 0.002)}, {"SSSA": 2.0}))
  assert [r["verdict"] for r in rows] == [claims.NOT_MEASURED] * 2


def test_hybrid_recall_without_a_softmax_model_needs_the_task_solved():
  lm = {"SSSS": 2.2, "SSSA": 2.1, "AAAA": 2.5}
  rows = claims.hybrid_claims(_hybrid_result({"SSSS": (0.10, 0.01), "SSSA": (0.60, 0.01)}, lm))
  assert rows[0]["verdict"] == claims.IN_SHAPE
  rows = claims.hybrid_claims(_hybrid_result({"SSSS": (0.10, 0.01), "SSSA": (0.96, 0.004)}, lm))
  assert rows[0]["verdict"] == claims.REPRODUCED


def test_hybrid_recall_is_judged_on_the_best_hybrid_and_names_the_others():
  lm = {"SSSS": 2.2, "SSSA": 2.1, "AAAA": 2.5}
  rows = claims.hybrid_claims(_hybrid_result(
      {"SSSA": (0.03, 0.004), "ASSS": (0.99, 0.002), "SSSS": (0.02, 0.003),
       "AAAA": (0.99, 0.002)}, lm))
  assert rows[0]["verdict"] == claims.REPRODUCED
  assert rows[0]["reason"].startswith("ASSS: ")
  assert f"SSSA: {claims.NOT_REPRODUCED}" in rows[0]["reason"]
  for p in ("SSSA", "ASSS", "SSSS", "AAAA"):
    assert p in rows[0]["ours"]


def test_value_slot_mass_reads_the_queried_keys_value_slot():
  hy = helpers.load_experiment("study_hybrid")
  # one row, 2 pairs: k=5 v=9 k=6 v=7, then queries of 6 (position 5) and 5 (position 7)
  inputs = np.array([[5, 9, 6, 7, 0, 6, 0, 5]])
  mask = np.zeros((1, 8), np.float32)
  mask[0, [5, 7]] = 1
  probs = np.zeros((1, 2, 8, 8))
  probs[0, 0, 5, 3] = 1.0  # head 0: the query of 6 looks at 6's value slot (3) ...
  probs[0, 0, 7, 2] = 1.0  # ... the query of 5 at 6's key slot: wrong pair
  probs[0, 1, 5, 3] = 0.5  # head 1: half on the right slot for both queries
  probs[0, 1, 7, 1] = 0.5
  np.testing.assert_allclose(hy.value_slot_mass(probs, inputs, mask, 2), [0.5, 0.5])
  probs[0, 0, 7] = 0
  probs[0, 0, 7, 1] = 1.0
  np.testing.assert_allclose(hy.value_slot_mass(probs, inputs, mask, 2), [1.0, 0.5])
  with pytest.raises(ValueError, match="mask"):
    hy.value_slot_mass(probs, inputs, np.zeros_like(mask), 2)


def test_hybrid_diagnosis_trains_the_study_run_on_with_only_its_length_changed():
  # SSSA_1000 resumes the study's SSSA checkpoint: any other changed field would either be
  # refused by the trainer (parameters, optimiser, data) or make the curve not the study's.
  hy = helpers.load_experiment("study_hybrid")
  diag = helpers.load_experiment("hybrid_diagnosis")

  def fields(cmd):
    return dict(a[len("--config."):].split("=", 1) for a in cmd if a.startswith("--config."))

  study = fields(hy.mqar_flags(hy.FULL, hy.FULL["mqar"]["steps"]))
  study.update({"model.pattern": "SSSA", "model.mlp_ratio": str(hy.points(
      hy.FULL, "mqar", hy.FULL["mqar"]["vocab"])[0]["model.mlp_ratio"])})
  assert hy.FULL["mqar"]["patterns"][0] == "SSSA"
  ours = fields(diag.command("SSSA_1000", "runs/x"))
  changed = {k for k in study.keys() | ours.keys() if study.get(k) != ours.get(k)}
  assert changed == {"train.steps", "train.checkpoint_every"}, changed
  assert int(ours["train.steps"]) > int(study["train.steps"])
