"""Metrics: a JSON-lines file and TensorBoard event files in the workdir, plus progress output.

``metrics.jsonl`` holds one object per line: ``{"step", "split", "loss", "accuracy", ...}``
(train lines also carry ``lr``, ``tokens_per_s``, ``elapsed``). On resume the lines after
the restored step are dropped, so the file reads like one uninterrupted run.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from typing import Any, Callable, Mapping

# The one results writer (atomic, NaN -> null); the trainer and the sweep call it from here.
from linear_attention import io
from linear_attention.io import write_json  # noqa: F401

METRICS_FILE = "metrics.jsonl"
DAMAGED_SUFFIX = ".damaged"  # the file as found, when a resume skipped damaged lines


def _clean(v: Any) -> Any:
  """Python scalars for JSON, with the package's one convention (``io.to_jsonable``:
  non-finite floats become ``null``)."""
  return io.to_jsonable(v.item() if hasattr(v, "item") else v)


def _parse(line: bytes) -> tuple[dict | None, str]:
  """One line of ``metrics.jsonl`` as a record, or ``(None, why)`` when it is damaged."""
  try:
    rec = json.loads(line.decode("utf-8"))
  except UnicodeDecodeError:
    return None, "not UTF-8"
  except json.JSONDecodeError:
    return None, "not JSON"
  if not isinstance(rec, dict):
    return None, f"a JSON {type(rec).__name__}, not an object"
  step = rec.get("step")
  if isinstance(step, bool) or not isinstance(step, int):
    return None, f"step {step!r} is not an integer"
  return rec, ""


def scan_metrics(path: str) -> tuple[list[dict], list[tuple[int, str]]]:
  """The records of a ``metrics.jsonl`` file and its damaged lines ``[(line number, why)]``.

  A last line without its newline (cut short by a kill) is dropped without being counted:
  that is how a killed run leaves the file, not damage.
  """
  if not os.path.exists(path):
    return [], []
  with open(path, "rb") as f:
    lines = f.read().split(b"\n")
  records, damaged = [], []
  for i, line in enumerate(lines, 1):
    if not line.strip():
      continue
    rec, why = _parse(line.strip())
    if rec is not None:
      records.append(rec)
    elif i < len(lines):  # a complete line (the last element follows the last newline)
      damaged.append((i, why))
  return records, damaged


def read_metrics(workdir: str, split: str | None = None) -> list[dict]:
  """All records of ``workdir/metrics.jsonl`` (optionally of one ``split``), in order.

  Damaged lines (not UTF-8, not a JSON object, a step that is not an integer) are skipped;
  :class:`MetricWriter` says so when a run resumes.
  """
  records, _ = scan_metrics(os.path.join(workdir, METRICS_FILE))
  return [r for r in records if split is None or r.get("split") == split]


def _summary_writer_class():
  """``tensorboardX.SummaryWriter``, imported without torch when torch is not loaded yet.

  tensorboardX imports torch when it is installed, only to recognise torch tensors; for a
  writer of float scalars that cost 185 MB of resident memory in every training process.
  Raises ImportError when tensorboardX is missing."""
  if "torch" in sys.modules or "tensorboardX" in sys.modules:
    from tensorboardX import SummaryWriter
    return SummaryWriter
  sys.modules["torch"] = None  # ``import torch`` raises ImportError inside this import only
  try:
    from tensorboardX import SummaryWriter
  finally:
    del sys.modules["torch"]
  return SummaryWriter


class MetricWriter:
  """Writes metrics to ``metrics.jsonl`` and TensorBoard (``tensorboardX``) in ``workdir``.

  Args:
    workdir: run directory.
    start_step: the step training resumes from; records after it are dropped from the
      JSON-lines file and purged from TensorBoard's view.
    enabled: False on non-zero processes of a multi-host run (only process 0 writes).
  """

  def __init__(self, workdir: str, start_step: int = 0, enabled: bool = True,
               say: Callable[[str], None] | None = None):
    self.enabled = enabled
    self.path = os.path.join(workdir, METRICS_FILE)
    self._tb = None
    if not enabled:
      return
    records, damaged = scan_metrics(self.path)
    if damaged:  # never a reason to refuse a resume: keep the original, go on without them
      shutil.copyfile(self.path, self.path + DAMAGED_SUFFIX)
      (say or (lambda line: print(line, file=sys.stderr, flush=True)))(
          f"{self.path}: skipped {len(damaged)} damaged line(s) (line {damaged[0][0]}: "
          f"{damaged[0][1]}); the original is kept as {METRICS_FILE}{DAMAGED_SUFFIX}")
    kept = [r for r in records if r["step"] <= start_step]
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      for r in kept:
        f.write(json.dumps(r) + "\n")
    os.replace(tmp, self.path)
    self._file = open(self.path, "a")
    try:
      SummaryWriter = _summary_writer_class()
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
    # The first line after a (re)start has no timed steps yet: it says so rather than
    # printing "tokens/s 0 ... eta nan".
    rate = f"tokens/s {tokens_per_s:,.0f}" if tokens_per_s > 0 else "tokens/s n/a (compiling)"
    eta = f"eta {el / done * (self.total - step):.1f}s" if done > 0 else "eta n/a"
    print(f"step {step}/{self.total}  loss {loss:.4f}  {rate}  elapsed {el:.1f}s  {eta}",
          file=self.stream, flush=True)

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
