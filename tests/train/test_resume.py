"""What must never block a resume or mislead after one (issue 29): a newest checkpoint that
lost its data, a damaged ``metrics.jsonl``, the first progress line after a resume, an
``error.log`` left by an interrupted attempt, the line a finished run prints when rerun and
the advice of a non-finite loss before the first checkpoint.

In-process runs on the tiny fake dataset (a few seconds each after the first compile).
"""

from __future__ import annotations

import io
import json
import os
import shutil

import pytest

from linear_attention import train
from linear_attention.train import errors, metrics, rundir
from tests.train.fake_data import FakeDataset, fake_config

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def _train(wd, cfg, **kw):
  return train.train_and_evaluate(cfg, str(wd), dataset=kw.pop("ds", FakeDataset()),
                                  verbose=kw.pop("verbose", False), **kw)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
  """A finished 8-step run with checkpoints 2, 4, 6 and 8."""
  wd = tmp_path_factory.mktemp("resume") / "run"
  cfg = fake_config(steps=8, keep_checkpoints=4, eval_every=0)
  final = _train(wd, cfg)
  assert sorted(os.listdir(wd / "checkpoints"), key=int) == ["2", "4", "6", "8"]
  return wd, cfg, final


def _copy(finished_run, tmp_path, unfinish=True):
  base, cfg, final = finished_run
  wd = tmp_path / "run"
  shutil.copytree(base, wd)
  if unfinish:
    os.remove(wd / "final_metrics.json")  # as if killed after the last save
  return wd, cfg, final


# ----------------------------------------------------------------------------- bug 1


@pytest.mark.parametrize("how", ["no_default", "empty_step", "empty_default", "two_steps"])
def test_newest_checkpoint_without_its_data_falls_back(finished_run, tmp_path, capfd, how):
  wd, cfg, final = _copy(finished_run, tmp_path)
  ck = wd / "checkpoints"
  if how == "no_default":  # rm -r <workdir>/checkpoints/8/default
    shutil.rmtree(ck / "8" / "default")
  elif how == "empty_step":
    shutil.rmtree(ck / "8")
    os.mkdir(ck / "8")
  elif how == "empty_default":  # rm -r <workdir>/checkpoints/8/default/*
    shutil.rmtree(ck / "8" / "default")
    os.mkdir(ck / "8" / "default")
  else:
    shutil.rmtree(ck / "8" / "default")
    shutil.rmtree(ck / "6" / "default")
  # Before: CheckpointError "no checkpoint ... can be restored (steps 8, 6, 4, 2)".
  res = _train(wd, cfg, verbose=True)
  err = capfd.readouterr().err
  said = [ln for ln in err.splitlines() if "unreadable" in ln]
  skipped = ["8", "6"] if how == "two_steps" else ["8"]
  resumed = 4 if how == "two_steps" else 6
  assert len(said) == 1, err  # one warning naming every skipped step
  assert all(s in said[0] for s in skipped) and f"resuming from step {resumed}" in said[0]
  # The reason is the trainer's own check, not orbax's error (which also falls back).
  why = "is empty" if how == "empty_default" else "is missing"
  assert f"its data folder {os.path.join('8', 'default')}/ {why}" in said[0], said[0]
  for k in ("train_loss", "validation_loss"):
    assert res[k] == final[k], k
  assert sorted(os.listdir(wd / "checkpoints_unreadable")) == sorted(skipped)


# ----------------------------------------------------------------------------- bug 2


DAMAGE = {
    "list": b"[1, 2]\n",
    "not_utf8": b"\xff\xfe{\"step\": 3}\n",
    "step_not_int": b'{"step": "three", "split": "train", "loss": 1.0}\n',
    "step_float": b'{"step": 2.5, "split": "train", "loss": 1.0}\n',
    "not_json": b"{this is not json\n",
}


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damaged_metrics_lines_never_block_a_resume(finished_run, tmp_path, capfd, kind):
  wd, cfg, _ = _copy(finished_run, tmp_path)
  shutil.rmtree(wd / "checkpoints" / "8")  # resume at 6: the writer rewrites the file
  path = wd / "metrics.jsonl"
  good = path.read_bytes()
  lines = good.splitlines(keepends=True)
  path.write_bytes(b"".join(lines[:1]) + DAMAGE[kind] + b"".join(lines[1:]))
  # Before: AttributeError / UnicodeDecodeError / TypeError on every rerun.
  _train(wd, cfg, verbose=True)
  err = capfd.readouterr().err
  said = [ln for ln in err.splitlines() if "damaged line" in ln]
  assert len(said) == 1 and "skipped 1 damaged line(s) (line 2:" in said[0], err
  assert (wd / "metrics.jsonl.damaged").read_bytes().count(DAMAGE[kind].strip()) == 1
  recs = metrics.read_metrics(str(wd))
  assert [r["step"] for r in recs if r["split"] == "train"] == [2, 4, 6, 8]


def test_read_metrics_skips_damage_and_a_line_cut_short(tmp_path):
  (tmp_path / "metrics.jsonl").write_bytes(
      b'{"step": 1, "split": "train"}\n[1, 2]\n\xff\n{"step": 2, "split": "train"}\n{"step": 3')
  records, damaged = metrics.scan_metrics(str(tmp_path / "metrics.jsonl"))
  assert [r["step"] for r in records] == [1, 2]
  assert [i for i, _ in damaged] == [2, 3]  # the unfinished last line is a kill, not damage
  assert [r["step"] for r in metrics.read_metrics(str(tmp_path), "train")] == [1, 2]


# ----------------------------------------------------------------------------- bug 5


def test_first_progress_line_without_a_terminal_has_no_zero_rate_or_nan_eta():
  out = io.StringIO()  # not a terminal: plain lines
  p = metrics.Progress(total=100, initial=40, stream=out)
  p.restart(50)  # after compilation, as the trainer does
  p.update(50, 1.2345, 0.0)  # the first log line after a resume: no timed steps yet
  p.update(60, 1.0, 1234.0)
  first, second = out.getvalue().splitlines()
  # Before: "step 50/100  loss 1.2345  tokens/s 0  elapsed 0.0s  eta nans".
  assert "nan" not in first and "tokens/s 0 " not in first, first
  assert "tokens/s n/a" in first and "eta n/a" in first
  assert "tokens/s 1,234" in second and "eta " in second and "nan" not in second


# ----------------------------------------------------------------------------- bug 6


def test_error_log_of_an_interrupted_attempt_is_resolved_on_success(finished_run, tmp_path):
  wd, cfg, _ = _copy(finished_run, tmp_path)
  rundir.log_exception(str(wd), KeyboardInterrupt())  # what an interrupted attempt leaves
  assert (wd / "error.log").exists()
  _train(wd, cfg)
  # Before: error.log stayed, and the finished directory looked failed.
  assert not (wd / "error.log").exists()
  assert "KeyboardInterrupt" in (wd / "error.resolved.log").read_text()


# ----------------------------------------------------------------------------- rerun, NaN


def test_rerun_of_a_finished_run_prints_one_readable_line(finished_run, tmp_path, capfd):
  wd, cfg, final = _copy(finished_run, tmp_path, unfinish=False)
  assert _train(wd, cfg, verbose=True) == final
  out = capfd.readouterr().out.strip().splitlines()
  assert len(out) == 1 and "already finished at step 8" in out[0], out
  assert "{" not in out[0] and "validation loss " in out[0] and "parameters" in out[0]


def test_non_finite_loss_before_the_first_checkpoint_says_how_to_start_over(tmp_path):
  cfg = fake_config(steps=8, checkpoint_every=4, log_every=1, steps_per_dispatch=1)
  with pytest.raises(errors.NonFiniteLossError) as e:
    _train(tmp_path / "run", cfg, ds=FakeDataset(nan_at=1))
  msg = str(e.value)
  # Before: "The last checkpoint in .../checkpoints is from before it; try a lower
  # config.optim.lr", which the same workdir then refuses.
  assert "No checkpoint was saved before it" in msg and "starts over in" in msg, msg
  assert not os.listdir(tmp_path / "run" / "checkpoints")
  later = train.trainer.non_finite_message(5, float("nan"), 1.0, "/w/checkpoints", 4)
  assert "last checkpoint (step 4)" in later and "another --workdir" in later


def test_plot_metrics_reads_any_workdir(finished_run, tmp_path):
  pytest.importorskip("matplotlib")
  from linear_attention.train import results
  base, _, _ = finished_run
  out = results.plot_metrics([str(base)], str(tmp_path / "loss.png"))
  assert os.path.getsize(out) > 1000
  with pytest.raises(ValueError, match="no 'nope' records"):
    results.plot_metrics(str(base), str(tmp_path / "x.png"), metric="nope")


def test_peer_hint_names_the_lost_process():
  from linear_attention import main
  barrier = TimeoutError("Barrier timed out. DEADLINE_EXCEEDED: id=x; tasks that did not "
                         "reach it: /job:jax_worker/replica:0/task:1")
  hint = main.peer_hint(barrier, distributed=True)
  assert "process(es) 1 of this multi-process run was probably lost" in hint
  assert "another process" in main.peer_hint(TimeoutError("barrier timed out"), True)
  assert main.peer_hint(barrier, distributed=False) == ""
  assert main.peer_hint(ValueError("bad value"), distributed=True) == ""
