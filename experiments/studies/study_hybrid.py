"""Hybrids: one softmax-attention layer in four recurrent ones, on recall (MQAR) and on text.

Four-layer models at equal parameters (``models.matched_mlp_ratio`` against the softmax
model): a Mamba-2 stack with one softmax attention layer, last (``"SSSA"``: three recurrent
layers then attention, the layout of Qwen3-Next-style hybrids) or first (``"ASSS"``, MQAR
only), the pure recurrent stack (``"SSSS"``) and pure softmax (``"AAAA"``). A run stopped
part-way (the study's budget ran out) is scored at its newest checkpoint and says so
(``stopped_at``). Every MQAR run with attention also reports where its attention layers look
(``value_slot_attention``: the best head's mean weight from a query to its key's value slot).
Two tasks:

* MQAR at the recall study's larger setting (``study_mqar.py``: T=128, 8 key-value pairs,
  vocabulary 8192, width 64, a width-3 short convolution before every mixer, constant
  learning rate 3e-3 after a 10% warmup, early stopping at 0.99), scored on fresh test
  queries with the binomial standard error. At two layers Mamba-2 sits near 1/pairs there.
  The attention layer's place decides this task at this budget (``hybrid_diagnosis.py``
  holds the runs): one softmax layer with the short convolution solves it alone, and in
  ``AAAA`` the first layer does the lookup (0.93 of its attention on the value slot). First
  in the stack, where it reads the token embeddings, it learns as fast as ``AAAA``; last, it
  reads a residual stream that three recurrent layers and their MLPs have filled (rms 2.7
  against the embeddings' 0.16 at step 500) and its loss leaves the plateau only after about
  350 steps, as pure Mamba-2's does. Not the cause, as far as the shorter diagnosis runs
  show: Mamba-2's output scale at init (without its gated RMSNorm, 0.05 instead of 1.0, the
  hybrid tracks ``SSSA`` to step 205) or Mamba-2 itself (a GLA hybrid ``GGGA`` is no faster to
  step 130).
* The byte-level LM (``study_lm.py``'s recipe at four layers and half its steps: King James
  Bible, width 64, sequences of 256 bytes, batch 16, 150 steps, matched to softmax with a
  4x MLP), scored in validation bits per byte.

The published finding (Zoology, Arora et al. 2023; Based 2024; Jamba 2024; Samba 2024; and
Qwen3-Next-style hybrids): a few attention layers give a recurrent model back the recall
it lacks, at little cost in quality or speed.

    python experiments/studies/study_hybrid.py           # full size
    python experiments/studies/study_hybrid.py --smoke   # tiny, for CI

Writes ``<out>/hybrid.json`` (runs, curves, table) and ``<out>/hybrid.csv`` (one row per
task and model), and prints the table.
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _study_utils as su  # noqa: E402
import study_mqar  # noqa: E402

# The whole design. A four-layer MQAR run costs 1-5 s a step on the shared 2 cores (the
# vocabulary-8192 output layer dominates), hence 500 steps where Zoology trains 100k examples
# for 64 epochs; the LM trains half the LM study's steps for the same reason (and has no
# ASSS point).
FULL = dict(num_layers=4, num_heads=2,
            mqar=dict(patterns=("SSSA", "ASSS", "SSSS", "AAAA"), d_model=64, seq_len=128, num_kv_pairs=8,
                      vocab=8192, batch=64, steps=500, lr=3e-3, eval_every=100, eval_batches=2,
                      short_conv=3, early_stop=0.99, reference_mlp_ratio=2.0, test_queries=2048,
                      eval_batch_size=64),
            lm=dict(patterns=("SSSA", "SSSS", "AAAA"), d_model=64, seq_len=256, batch=16,
                    steps=150, lr=3e-3, eval_batches=16, reference_mlp_ratio=4.0))
SMOKE = dict(num_layers=2, num_heads=2,
             mqar=dict(patterns=("SS", "SA"), d_model=32, seq_len=32, num_kv_pairs=4,
                       vocab=64, batch=8, steps=10, lr=3e-3, eval_every=10, eval_batches=1,
                       short_conv=3, early_stop=0.99, reference_mlp_ratio=2.0, test_queries=16,
                       eval_batch_size=8),
             lm=dict(patterns=("AA", "SS", "SA"), d_model=32, seq_len=32, batch=4, steps=10,
                     lr=3e-3, eval_batches=2, reference_mlp_ratio=8 / 3))


def points(size: dict, task: str, vocab: int) -> list[dict]:
  """One override dict per pattern, its MLP width matched to the all-softmax model."""
  from linear_attention import models
  t = size[task]
  return [{"model.pattern": p, "model.mlp_ratio": models.matched_mlp_ratio(
      vocab, t["d_model"], size["num_layers"], pattern=p, num_heads=size["num_heads"],
      reference_mlp_ratio=t["reference_mlp_ratio"])} for p in t["patterns"]]


def value_slot_mass(probs, inputs, mask, num_pairs: int):
  """Where MQAR's query positions attend: the mean attention weight on the queried key's value
  slot, per head.

  A one-layer lookup (a short convolution puts the previous token, the key, into the value
  slot's features; the query matches it) puts its weight there; uniform attention puts about
  ``1 / t`` there.

  Args:
    probs: attention weights ``[B, H, T, T]`` (rows sum to 1).
    inputs: the tokens ``[B, T]``; the pairs ``k_1 v_1 ... k_N v_N`` open every row.
    mask: ``[B, T]``, 1 at the query positions.
    num_pairs: ``N``.

  Returns:
    ``[H]`` numpy floats.
  """
  import numpy as np
  probs, inputs, mask = np.asarray(probs), np.asarray(inputs), np.asarray(mask)
  rows, cols = np.nonzero(mask)
  if rows.size == 0:
    raise ValueError(f"mask has no query position (shape {mask.shape}).")
  keys = inputs[rows, :2 * num_pairs:2]  # [Q, N]: each query's row's keys
  which = np.argmax(keys == inputs[rows, cols][:, None], axis=1)
  return probs[rows, :, cols, 2 * which + 1].mean(axis=0)


def value_slot_attention(workdir: str, batches: int = 2) -> list[float | None]:
  """Per layer of a trained MQAR run (None where the mixer is not softmax): its best head's
  mean attention weight from a query to the queried key's value slot (``value_slot_mass``),
  on ``batches`` test batches. Reads the blocks' parts as ``Block.__call__`` chains them; the
  weights are the softmax layer's own (``SoftmaxAttention.attention_weights``)."""
  import jax.numpy as jnp
  import numpy as np
  from linear_attention import data
  from linear_attention.train import results
  model, config, _ = results.load_model(workdir)
  ds = data.make_dataset(config.data)
  per_layer = []
  for i in range(batches):
    bt = ds.batch(i, "test")
    x = model.backbone.embed(jnp.asarray(bt["inputs"]))
    masses = []
    for blk in model.backbone.blocks:
      h = blk.mixer_norm(x)
      h = h if blk.pre_conv is None else blk.pre_conv(h)
      if blk.mixer_name == "softmax":
        masses.append(value_slot_mass(blk.mixer.attention_weights(h), bt["inputs"], bt["mask"],
                                      config.data.num_kv_pairs))
      else:
        masses.append(None)
      x = blk._mlp(x + blk.mixer(h))
    per_layer.append(masses)
  return [None if m[0] is None else float(np.max(np.mean(m, axis=0)))
          for m in zip(*per_layer)]


def mqar_flags(size: dict, steps: int) -> tuple[str, ...]:
  """The ``--config.*`` flags every MQAR point of ``size`` trains with (``steps`` steps)."""
  m = size["mqar"]
  return (f"--config.data.vocab_size={m['vocab']}", "--config.data.random_non_queries=False",
          f"--config.data.batch_size={m['batch']}", f"--config.data.seq_len={m['seq_len']}",
          f"--config.data.num_kv_pairs={m['num_kv_pairs']}",
          f"--config.model.d_model={m['d_model']}", f"--config.model.num_layers={size['num_layers']}",
          f"--config.model.num_heads={size['num_heads']}",
          f"--config.model.short_conv={m['short_conv']}", f"--config.optim.lr={m['lr']}",
          "--config.optim.schedule=constant", f"--config.train.steps={steps}",
          f"--config.optim.warmup_steps={max(steps // 10, 1)}",
          f"--config.train.eval_every={m['eval_every']}",
          f"--config.train.log_every={max(steps // 20, 1)}",
          f"--config.train.eval_batches={m['eval_batches']}",
          f"--config.train.checkpoint_every={steps}",
          "--config.train.early_stop_metric=accuracy",
          f"--config.train.early_stop_value={m['early_stop']}")


def mqar_rows(size: dict, args) -> list[dict]:
  """Trains and scores the MQAR points; returns the runs with their test accuracy. A run
  stopped before its last step is scored at its newest checkpoint (``stopped_at``)."""
  from linear_attention import models
  from linear_attention.train import checkpoint, results
  m = size["mqar"]
  flags = mqar_flags(size, su.scaled_steps(m["steps"], args))
  rows = su.train_grid("configs/mqar.py:size=small", points(size, "mqar", m["vocab"]),
                       os.path.join(su.runs_dir(args, "hybrid"), "mqar"), args.workers, flags,
                       collect_only=args.collect)
  per_batch = m["eval_batch_size"] * m["num_kv_pairs"]
  num_batches = -(-m["test_queries"] // per_batch)
  for r in rows:
    r["task"] = "mqar"
    # Stopped part-way (``collect`` reports such a point "not run"): its newest checkpoint.
    stopped_at = None if r["status"] == "done" else checkpoint.newest_step_on_disk(r["workdir"])
    if r["status"] != "done" and not stopped_at:
      continue
    if stopped_at:
      r["status"] = "stopped"
    res = results.evaluate_checkpoint(r["workdir"], {"batch_size": m["eval_batch_size"]},
                                      num_batches=num_batches, split="test")
    n = num_batches * per_batch
    r.update(score=res["accuracy"], se=su.binomial_se(res["accuracy"], n), test_items=n,
             state_floats=study_mqar.state_floats(r["workdir"], m["seq_len"]),
             steps_run=stopped_at or r["metrics"]["step"], stopped_at=stopped_at,
             value_slot_attention=value_slot_attention(r["workdir"]),
             num_params=(r.get("metrics") or {}).get("num_params") or models.count_params(
                 results.load_model(r["workdir"])[0]))
  return rows


def lm_rows(size: dict, args) -> list[dict]:
  """Trains the LM points; returns the runs with their validation bits per byte."""
  t = size["lm"]
  steps = su.scaled_steps(t["steps"], args)
  flags = (f"--config.data.seq_len={t['seq_len']}", f"--config.data.batch_size={t['batch']}",
           f"--config.model.d_model={t['d_model']}", f"--config.model.num_layers={size['num_layers']}",
           f"--config.model.num_heads={size['num_heads']}", f"--config.optim.lr={t['lr']}",
           *su.schedule_flags(steps, t["eval_batches"]))
  rows = su.train_grid("configs/text_lm.py:size=small", points(size, "lm", 256),
                       os.path.join(su.runs_dir(args, "hybrid"), "lm"), args.workers, flags,
                       collect_only=args.collect)
  for r in rows:
    r["task"] = "lm"
    if r["status"] == "done":
      r.update(score=r["metrics"]["validation_bits_per_byte"], steps_run=r["metrics"]["step"],
               test_items=t["eval_batches"] * t["batch"] * t["seq_len"],
               num_params=r["metrics"]["num_params"])
  return rows


def main() -> int:
  t0 = time.time()
  p = su.study_args(__doc__, "hybrid")
  p.add_argument("--tasks", default="mqar,lm", help="comma-separated: mqar, lm")
  p.add_argument("--patterns", help="comma-separated patterns to keep among the size's "
                 "(default: all); a subset trains (or collects) only those points")
  args = p.parse_args()
  size = dict(SMOKE if args.smoke else FULL)
  if args.patterns:
    keep = args.patterns.split(",")
    known = {q for t in ("mqar", "lm") for q in size[t]["patterns"]}
    if not set(keep) <= known:
      raise ValueError(f"--patterns must be among {sorted(known)}; got {sorted(set(keep) - known)}.")
    size = {**size, **{t: {**size[t], "patterns": tuple(q for q in size[t]["patterns"] if q in keep)}
                       for t in ("mqar", "lm")}}
  tasks = args.tasks.split(",")
  unknown = sorted(set(tasks) - {"mqar", "lm"})
  if unknown:
    raise ValueError(f"--tasks must be among mqar, lm; got {unknown}.")
  rows = (mqar_rows(size, args) if "mqar" in tasks else []) + \
         (lm_rows(size, args) if "lm" in tasks else [])
  from linear_attention import models
  table = []
  for r in rows:
    if "score" not in r:
      continue
    pat = r["overrides"]["model.pattern"]
    table.append({"task": r["task"], "pattern": pat,
                  "mixers": "+".join(models.resolve_pattern(None, pattern=pat)),
                  "metric": "test accuracy" if r["task"] == "mqar" else "val bits/byte",
                  "score": r["score"], "se": r.get("se"), "test_items": r["test_items"],
                  "num_params": r.get("num_params"), "steps_run": r["steps_run"],
                  "stopped_at": r.get("stopped_at"), "state_floats": r.get("state_floats"),
                  "value_slot_attention": r.get("value_slot_attention"),
                  "attn_value": ", ".join(f"L{i} {m:.2f}" for i, m in enumerate(
                      r.get("value_slot_attention") or []) if m is not None) or None})
    r["workdir"] = su.relative_path(r["workdir"])
  out = {"study": "hybrid", "config": {"smoke": args.smoke, **size, "tasks": tasks},
         "elapsed_s": time.time() - t0,
         "budget": {"mqar_examples_max": size["mqar"]["batch"] * size["mqar"]["steps"],
                    "mqar_steps_max": size["mqar"]["steps"],
                    "lm_tokens": size["lm"]["batch"] * size["lm"]["seq_len"] * size["lm"]["steps"],
                    "paper": "Zoology trains MQAR on 6.4M examples (100k x 64 epochs); Jamba/"
                             "Samba train 1-7B-parameter hybrids on 100B+ tokens"},
         "environment": su.environment(shared_machine=True), "table": table, "runs": rows}
  cols = [("task", "task", "{}"), ("pattern", "pattern", "{}"), ("metric", "metric", "{}"),
          ("score", "score", "{:.3f}"), ("se", "se", "{:.3f}"), ("test_items", "items", "{:,}"),
          ("num_params", "params", "{:,}"), ("steps_run", "steps", "{}"),
          ("state_floats", "state", "{:,}"), ("attn_value", "attn->value", "{}")]
  return su.finish(args.out, "hybrid", out, table, cols, rows)


if __name__ == "__main__":
  sys.exit(main())
