"""The one results writer: atomic, NaN/inf as null, NumPy values as numbers."""

from __future__ import annotations

import json
import os

import numpy as np

from linear_attention.io import write_json
from linear_attention.train import metrics


def test_write_json_conventions(tmp_path):
  path = tmp_path / "deep" / "er" / "r.json"  # the folder is created
  obj = {"nan": float("nan"), "inf": [float("inf"), -float("inf"), 1.5], "t": (1, 2),
         "np": np.float32(0.5), "arr": np.arange(3), "int": np.int64(7), 3: "key", "ok": True,
         "none": None, "other": object}
  assert write_json(str(path), obj) == str(path)
  text = path.read_text()
  assert "NaN" not in text and "Infinity" not in text and text.endswith("\n")
  back = json.loads(text)
  assert back["nan"] is None and back["inf"] == [None, None, 1.5] and back["t"] == [1, 2]
  assert back["np"] == 0.5 and back["arr"] == [0, 1, 2] and back["int"] == 7
  assert back["3"] == "key" and back["ok"] is True and back["none"] is None
  assert back["other"] == str(object)
  assert metrics.write_json is write_json  # the trainer's and the sweep's writer is this one


def test_write_json_replaces_whole_and_leaves_no_temporary(tmp_path):
  path = tmp_path / "r.json"
  write_json(str(path), {"a": list(range(1000))})
  write_json(str(path), {"a": 1})
  assert json.loads(path.read_text()) == {"a": 1}
  assert os.listdir(tmp_path) == ["r.json"]
