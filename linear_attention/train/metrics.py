"""Metrics: a JSON-lines file and TensorBoard event files in the workdir, plus progress output.

``metrics.jsonl`` holds one object per line: ``{"step", "split", "loss", "accuracy", ...}``
(train lines also carry ``lr``, ``tokens_per_s``, ``elapsed``). On resume the lines after
the restored step are dropped, so the file reads like one uninterrupted run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Mapping

# The one results writer (atomic, NaN -> null); the trainer and the sweep call it from here.
from linear_attention import io
from linear_attention.io import write_json  # noqa: F401

METRICS_FILE = "metrics.jsonl"


def _clean(v: Any) -> Any:
  """Python scalars for JSON, with the package's one convention (``io.to_jsonable``:
  non-finite floats become ``null``)."""
  return io.to_jsonable(v.item() if hasattr(v, "item") else v)


def read_metrics(workdir: str, split: str | None = None) -> list[dict]:
  """All records of ``workdir/metrics.jsonl`` (optionally of one ``split``), in order."""
  path = os.path.join(workdir, METRICS_FILE)
  if not os.path.exists(path):
    return []
  out = []
  with open(path) as f:
    for line in f:
      line = line.strip()
      if not line:
        continue
      try:
        rec = json.loads(line)
      except json.JSONDecodeError:  # a line cut short by a kill
        continue
      if split is None or rec.get("split") == split:
        out.append(rec)
  return out


class MetricWriter:
  """Writes metrics to ``metrics.jsonl`` and TensorBoard (``tensorboardX``) in ``workdir``.

  Args:
    workdir: run directory.
    start_step: the step training resumes from; records after it are dropped from the
      JSON-lines file and purged from TensorBoard's view.
    enabled: False on non-zero processes of a multi-host run (only process 0 writes).
  """

  def __init__(self, workdir: str, start_step: int = 0, enabled: bool = True):
    self.enabled = enabled
    self.path = os.path.join(workdir, METRICS_FILE)
    self._tb = None
    if not enabled:
      return
    kept = [r for r in read_metrics(workdir) if r.get("step", 0) <= start_step]
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      for r in kept:
        f.write(json.dumps(r) + "\n")
    os.replace(tmp, self.path)
    self._file = open(self.path, "a")
    try:
      from tensorboardX import SummaryWriter
      self._tb = SummaryWriter(os.path.join(workdir, "tensorboard"),
                               purge_step=start_step + 1 if start_step else None)
    except ImportError:  # TensorBoard output is optional; the JSON-lines file is not
      self._tb = None

  def write(self, step: int, split: str, metrics: Mapping[str, Any]) -> None:
    """Appends ``{"step": step, "split": split, **metrics}`` and logs scalars to TensorBoard."""
    if not self.enabled:
      return
    rec = {"step": int(step), "split": split, **{k: _clean(v) for k, v in metrics.items()}}
    self._file.write(json.dumps(rec) + "\n")
    self._file.flush()
    if self._tb is not None:
      for k, v in rec.items():
        if k not in ("step", "split") and isinstance(v, (int, float)):
          self._tb.add_scalar(f"{split}/{k}", v, step)

  def flush(self) -> None:
    if self.enabled and self._tb is not None:
      self._tb.flush()

  def close(self) -> None:
    if not self.enabled:
      return
    self._file.close()
    if self._tb is not None:
      self._tb.close()


class Progress:
  """A tqdm bar (step, loss, tokens/s, ETA) on a terminal; plain log lines otherwise."""

  def __init__(self, total: int, initial: int, enabled: bool = True, stream=None):
    self.stream = sys.stderr if stream is None else stream
    self.total = total
    self.enabled = enabled
    self.bar = None
    self.t0, self.s0 = time.time(), initial
    if enabled and hasattr(self.stream, "isatty") and self.stream.isatty():
      from tqdm import tqdm
      self.bar = tqdm(total=total, initial=initial, file=self.stream, unit="step",
                      dynamic_ncols=True)

  def update(self, step: int, loss: float, tokens_per_s: float) -> None:
    """Reports the state after ``step`` completed steps."""
    if not self.enabled:
      return
    if self.bar is not None:
      self.bar.update(step - self.bar.n)
      self.bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens_per_s:,.0f}")
      return
    done = step - self.s0
    el = time.time() - self.t0
    eta = el / done * (self.total - step) if done > 0 else float("nan")
    print(f"step {step}/{self.total}  loss {loss:.4f}  tokens/s {tokens_per_s:,.0f}  "
          f"elapsed {el:.1f}s  eta {eta:.1f}s", file=self.stream, flush=True)

  def restart(self, step: int) -> None:
    """Starts the ETA's clock at ``step`` (after compilation, which would inflate it)."""
    self.t0, self.s0 = time.time(), step

  def message(self, text: str) -> None:
    """A line that does not break the bar."""
    if not self.enabled:
      return
    if self.bar is not None:
      self.bar.write(text, file=self.stream)
    else:
      print(text, file=self.stream, flush=True)

  def close(self) -> None:
    if self.bar is not None:
      self.bar.close()
