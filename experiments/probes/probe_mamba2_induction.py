"""Why Mamba-2 stays at chance on induction heads while Mamba learns it: one short run per
hypothesis, each changing one thing of Mamba-2 towards Mamba-1 (issue 30, item 3).

The synthetic study (``study_synthetic.py``) trains every mixer on the dense induction task
at T=256 (d 64, 2 layers, the short-conv recipe, lr 3e-3, batch 16) and tests on the paper's
sparse one-trigger task. There Mamba reached 0.994 on the sparse test after 800 steps and
Mamba-2 0.066 (chance 1/15).

Every structural difference between the two layers (``nn/recurrent.py`` ``Mamba``,
``nn/gated.py`` ``Mamba2``) at the study's size (d 64, ``d_inner`` 128, ``N`` 16, 2 heads),
and the option that moves one towards the other:

=================  ================================  ===============================  ============================
part               Mamba-1 (``mamba``)               Mamba-2 (``mamba2``)             option (variant)
=================  ================================  ===============================  ============================
conv runs over     ``x``                             ``x, B, C``                      ``bc_from_conv`` (m2)
``B, C``           ``W_x silu(conv(x))``: signed,    ``silu(conv(W u))``: mostly      ``bc_from_conv``,
                   read from the conv'd ``x``        positive, own conv channels      ``bc_activation=False``
``dt`` from        the conv'd ``x``, rank 4          the layer input ``u``, full      ``dt_from_conv`` (m2),
                                                     rank, before the conv            ``dt_from_input`` (m1)
``dt`` shared by   1 channel (128 per token)         a head of 64 (2 per token)       ``num_heads``
``A``              per channel and state dim,        one per head, uniform [1, 16]    ``scalar_a`` (m1),
                   1..16 (each channel has A = 1)                                     ``a_init_range``
``B, C`` shared    by all channels                   by all heads (``ngroups`` 1)     ``ngroups``
output             ``W_out(y silu(z))``              ``W_out(RMSNorm(y silu(z)))``    ``norm=False``
``D`` skip         per channel                       per head                         (= at head dim 1)
state per layer    128 x 16 = 2048                   2 x 16 x 64 = 2048               (equal)
``dt`` init        log-uniform [1e-3, 0.1]           the same, per head               (equal)
op                 ``selective_scan``                ``ssd`` (chunked matmuls)        ``forms_agree`` check
=================  ================================  ===============================  ============================

Mamba-2 at head dimension 1 with ``dt_from_conv``, ``bc_from_conv`` and ``norm=False`` is
Mamba-1 with ``scalar_a`` up to ``dt``'s rank (``tests/nn/test_mamba_options.py`` copies the
weights across and checks the outputs agree). The variants (``--variants``):

* ``slow_decay``: the decay's starting point, ``a_init_range = (1/32, 1/2)``: Mamba-2's mean
  ``A dt`` (about 0.17 in the first layer) forgets a token 128 positions back.
* ``per_head_bc``: one ``B, C`` group per head (``ngroups = 2``).
* ``small_heads``: 16 heads of 8 (more ``dt`` values per token).
* ``no_norm``: no gated RMSNorm.
* ``channel_dt``: head dimension 1 plus the slow decay (slow: 3x Mamba-1's step time).
* ``linear_bc``: no SiLU on ``B, C`` (signed keys and queries, as Mamba-1's).
* ``m2_as_m1_h2``: every Mamba-1-like change at once at 2 heads: ``dt`` and ``B, C`` from
  the conv'd ``x``, no norm, slow decay; ``m2_as_m1`` the same at head dimension 1.
* ``m1_scalar_a``, ``m1_dt_input``: Mamba-1 with one Mamba-2 property (one ``A`` per
  channel; ``dt`` from the layer input).
* ``m1_equal_a``: Mamba-1 whose ``A`` starts as ``scalar_a``'s (the same draws) but is
  learned per state dimension (``equal_a_init``): ``scalar_a``'s initialisation without its
  sharing. ``m1_scalar_a_slow``: ``scalar_a`` with ``A`` in ``[1/16, 1]`` (no channel decays
  faster than Mamba-1's slowest state dimension): Mamba-1's side of ``m2_as_m1``.
* ``m2_as_m1_h2_2k``, ``m2_dt_conv_2k``, ``m2_as_m1_h16_2k``: Mamba-2's side trained to 2000
  steps: ``m2_as_m1_h2`` longer; only ``dt`` from the conv'd ``x`` (the inverse of
  ``m1_dt_input``); ``m2_as_m1_h2`` at 16 heads of 8 (finer ``dt`` and ``A``).
* ``*_1k``, ``*_1500``, ``*_2k``: 1000, 1500 or 2000 steps instead of 500, for variants that
  leave the loss plateau late (``m1_*_1k``, ``*_1500`` and ``m2_as_m1_h2_2k`` resumed from
  their 500-step run's checkpoint: the same seed, data and constant schedule, so the first
  500 steps are that run's).
* ``mamba``: Mamba-1 itself, the positive control at the same budget.

Each run keeps a checkpoint every ``--eval-every`` steps; each is tested on the sparse task
at the training length (``--test-examples`` sequences), which gives a learning curve per
hypothesis. Two measurements explain the curves: ``init_memory`` (per variant, at init: the
share of channels that still hold a tenth of a token 128 steps later) and
``state_ablation`` (a trained Mamba-1 with some state dimensions never written: which ones
it answers from). Writes ``<out>/mamba2_induction_probe.json``.

    python experiments/probes/probe_mamba2_induction.py                    # every variant
    python experiments/probes/probe_mamba2_induction.py --variants slow_decay,mamba --steps 400
    python experiments/probes/probe_mamba2_induction.py --smoke            # tiny, for CI
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "studies"))
import _study_utils as su  # noqa: E402

_M1 = "model.mixer_kwargs.mamba."
_M2 = "model.mixer_kwargs.mamba2."
VARIANTS = {
    "default": {"model.mixer": "mamba2"},
    "slow_decay": {"model.mixer": "mamba2", _M2 + "a_init_range": (1 / 32, 0.5)},
    "per_head_bc": {"model.mixer": "mamba2", _M2 + "ngroups": 2},
    "small_heads": {"model.mixer": "mamba2", "model.num_heads": 16},
    "no_norm": {"model.mixer": "mamba2", _M2 + "norm": False},
    "channel_dt": {"model.mixer": "mamba2", "model.num_heads": 128,
                   _M2 + "a_init_range": (1 / 32, 0.5)},
    "linear_bc": {"model.mixer": "mamba2", _M2 + "bc_activation": False},
    "mamba": {"model.mixer": "mamba"},
    # Mamba-2 with every Mamba-1-like change at once, at Mamba-2's 2 heads of 64 ...
    "m2_as_m1_h2": {"model.mixer": "mamba2", _M2 + "dt_from_conv": True,
                    _M2 + "bc_from_conv": True, _M2 + "norm": False,
                    _M2 + "a_init_range": (1 / 32, 0.5)},
    # ... and at head dimension 1 (one dt and A per channel, Mamba-1's selection); chunk 8
    # only for speed (128 heads of 1 cost 3x Mamba-1 per step at chunk 8, 5x at 64).
    "m2_as_m1": {"model.mixer": "mamba2", "model.num_heads": 128, _M2 + "chunk_size": 8,
                 _M2 + "dt_from_conv": True, _M2 + "bc_from_conv": True, _M2 + "norm": False,
                 _M2 + "a_init_range": (1 / 32, 0.5)},
    # Mamba-1 with one Mamba-2 property at a time.
    "m1_scalar_a": {"model.mixer": "mamba", _M1 + "scalar_a": True},
    "m1_dt_input": {"model.mixer": "mamba", _M1 + "dt_from_input": True},
    # Longer runs (the schedule is constant after warm-up, so the first steps are the 500-step
    # run's): does a variant that starts to leave the plateau at 500 steps learn later?
    "slow_decay_1k": {"model.mixer": "mamba2", _M2 + "a_init_range": (1 / 32, 0.5),
                      "train.steps": 1000},
    "default_1k": {"model.mixer": "mamba2", "train.steps": 1000},
    "m2_as_m1_h2_1k": {"model.mixer": "mamba2", _M2 + "dt_from_conv": True,
                       _M2 + "bc_from_conv": True, _M2 + "norm": False,
                       _M2 + "a_init_range": (1 / 32, 0.5), "train.steps": 1000},
    # Block or delay: Mamba-1 with one Mamba-2 property, trained longer (the first 500
    # steps are the 500-step run's: the same seed, data and constant schedule).
    "m1_scalar_a_1500": {"model.mixer": "mamba", _M1 + "scalar_a": True, "train.steps": 1500},
    "m1_dt_input_1k": {"model.mixer": "mamba", _M1 + "dt_from_input": True,
                       "train.steps": 1000},
    # scalar_a's initialisation (the same draws) without its sharing: A learned per (channel,
    # state dimension). Learns -> the sharing blocks; stays -> the initialisation does.
    "m1_equal_a": {"model.mixer": "mamba", _M1 + "equal_a_init": True, "train.steps": 1000},
    # scalar_a with every channel's A at most Mamba-1's slowest (A in [1/16, 1]): Mamba-1's
    # side of m2_as_m1 (head dimension 1, slow decay) at a third of its cost.
    "m1_scalar_a_slow": {"model.mixer": "mamba", _M1 + "scalar_a": True,
                         _M1 + "a_init_scale": 1 / 16, "train.steps": 1000},
    # Mamba-2's side, trained long enough to see whether the Mamba-1-like variants learn
    # (m2_as_m1_h2_2k resumed from m2_as_m1_h2's step-500 checkpoint). m2_dt_conv_2k is the
    # inverse of m1_dt_input, the one property that blocked Mamba-1 through 1000 steps.
    "m2_as_m1_h2_2k": {"model.mixer": "mamba2", _M2 + "dt_from_conv": True,
                       _M2 + "bc_from_conv": True, _M2 + "norm": False,
                       _M2 + "a_init_range": (1 / 32, 0.5), "train.steps": 2000},
    "m2_dt_conv_2k": {"model.mixer": "mamba2", _M2 + "dt_from_conv": True, "train.steps": 2000},
    # m2_dt_conv_2k learns (0.63 at step 1600, 0.98 at 1800); the default Mamba-2 to the same
    # 2000 steps (resumed from default_1k), and dt_from_conv with m2_as_m1_h2's slow decay
    # (m2_as_m1_h2_2k, which also reads dt from the conv, stays at chance).
    "default_2k": {"model.mixer": "mamba2", "train.steps": 2000},
    # dt_from_conv changes the init's draws (half the heads keep > 0.1 of a token 128 steps
    # on, none by default): the slow decay alone (all heads keep it) to 2000 steps, resumed
    # from slow_decay_1k.
    "slow_decay_2k": {"model.mixer": "mamba2", _M2 + "a_init_range": (1 / 32, 0.5),
                      "train.steps": 2000},
    "m2_dt_conv_slow_2k": {"model.mixer": "mamba2", _M2 + "dt_from_conv": True,
                           _M2 + "a_init_range": (1 / 32, 0.5), "train.steps": 2000},
    # m2_as_m1_h2 at 16 heads of 8: eight times as many dt and A values per token (Mamba-1
    # has one per channel), the next property when the 2-head runs stay at chance.
    "m2_as_m1_h16_2k": {"model.mixer": "mamba2", "model.num_heads": 16,
                        _M2 + "dt_from_conv": True, _M2 + "bc_from_conv": True,
                        _M2 + "norm": False, _M2 + "a_init_range": (1 / 32, 0.5),
                        "train.steps": 2000},
}
FULL = dict(seq_len=256, batch=16, d_model=64, lr=3e-3, short_conv=3, steps=500,
            eval_every=100, test_examples=128)
SMOKE = dict(seq_len=32, batch=8, d_model=32, lr=3e-3, short_conv=3, steps=20,
             eval_every=10, test_examples=8)


def sized(overrides: dict, size: dict) -> dict:
  """``overrides`` fitted to ``size``: head dimension 1 stays 1 (``num_heads = d_inner``) and
  a longer run keeps its multiple of the full size's steps (so ``--smoke`` stays tiny)."""
  o = dict(overrides)
  if o.get("model.num_heads") == 128:
    o["model.num_heads"] = 2 * size["d_model"]
  if "train.steps" in o:
    o["train.steps"] = o["train.steps"] * size["steps"] // FULL["steps"]
  return o


def forms_agree(workdir: str, batch: int = 2) -> dict:
  """The trained model's parallel forward (``ssd``'s chunked form for Mamba-2) against its
  token-by-token decoding (the recurrent step) on ``batch`` sparse test rows at the training
  length: a numerics fault in either form would show here, not only in the unit tests.

  Returns:
    ``{"step", "max_abs_logit_diff", "argmax_agreement"}`` (over every position).
  """
  import jax
  import jax.numpy as jnp
  from flax import nnx

  from linear_attention import data
  from linear_attention.train import results

  model, config, step = results.load_model(workdir)
  ds = data.make_dataset({**config.data.to_dict(), "dense": False, "batch_size": batch})
  tokens = jnp.asarray(next(iter(ds.eval_batches("test", 1)))["inputs"])
  graphdef, state = nnx.split(model)

  @jax.jit
  def both(state, tokens):
    m = nnx.merge(graphdef, state)
    body = lambda cache, tok: tuple(reversed(m.decode_step(tok, cache)))
    _, steps = jax.lax.scan(body, m.init_cache(tokens.shape[0], tokens.shape[1]), tokens.T)
    return m(tokens).astype(jnp.float32), jnp.swapaxes(steps, 0, 1).astype(jnp.float32)

  par, rec = both(state, tokens)
  return {"step": step, "max_abs_logit_diff": float(jnp.max(jnp.abs(par - rec))),
          "argmax_agreement": float(jnp.mean(jnp.argmax(par, -1) == jnp.argmax(rec, -1)))}


def context_test(workdir: str, examples: int = 128, max_k: int = 3) -> dict:
  """Which key the trained model matches on: the sparse test, and the same rows with the
  ``k`` tokens before the last trigger set equal to the ``k`` before the first one (so a
  ``k + 1``-token context repeats, as long contexts do in the dense training task). A model
  keyed on the trigger alone scores alike on all; one keyed on a longer context rises
  with ``k``.

  Returns:
    ``{"step", "examples", "sparse", "same_prev_1", ..., "same_prev_<max_k>"}`` (accuracies
    at the last position; rows whose first trigger has fewer than ``max_k`` tokens before it
    are moved ``max_k`` to the right).
  """
  import jax
  import jax.numpy as jnp
  import numpy as np

  from linear_attention import data
  from linear_attention.train import results

  model, config, step = results.load_model(workdir)
  ds = data.make_dataset({**config.data.to_dict(), "dense": False, "batch_size": examples})
  tokens = np.array(next(iter(ds.eval_batches("test", 1)))["inputs"])
  b, t = tokens.shape
  trig = ds.trigger_token
  answer, first = np.zeros(b, np.int64), np.zeros(b, np.int64)
  for r in range(b):
    p = int(np.flatnonzero(tokens[r, :t - 1] == trig)[0])
    answer[r] = tokens[r, p + 1]
    if p < max_k:  # room for max_k tokens before the first trigger
      tokens[r, p:p + 2] = tokens[r, max_k:max_k + 2]
      p = max_k
      tokens[r, p], tokens[r, p + 1] = trig, answer[r]
    first[r] = p
  logits = jax.jit(lambda x: model(x, positions=jnp.full((x.shape[0], 1), t - 1)))
  acc = lambda x: float(np.mean(np.argmax(np.asarray(logits(jnp.asarray(x)))[:, 0], -1) == answer))
  out = {"step": step, "examples": b, "sparse": acc(tokens)}
  for k in range(1, max_k + 1):
    same = tokens.copy()
    for r in range(b):
      same[r, t - 1 - k:t - 1] = tokens[r, first[r] - k:first[r]]
    out[f"same_prev_{k}"] = acc(same)
  return out


def _sparse_rows(config, examples: int):
  """``examples`` sparse test rows at the training length and their answers."""
  import numpy as np

  from linear_attention import data

  ds = data.make_dataset({**config.data.to_dict(), "dense": False, "batch_size": examples})
  batch = next(iter(ds.eval_batches("test", 1)))
  return np.asarray(batch["inputs"]), np.asarray(batch["targets"])[:, -1]


def state_ablation(workdir: str, examples: int = 128, dims=(1, 4)) -> dict:
  """Which state dimensions a trained Mamba-1 answers with: the sparse test with, in one
  layer at a time, the state dimensions ``n < k`` (the slowest: Mamba-1's ``A_n`` starts at
  ``n + 1``) or ``n >= k`` never written (their ``B`` columns zeroed), for ``k`` in ``dims``.

  Returns:
    ``{"step", "examples", "full", "layer<i>_only_n<k>", "layer<i>_without_n<k>", ...,
    "a_mean_by_n": {"layer<i>": [mean over channels of the trained A_n, n = 0..N-1]}}``.
  """
  import jax
  import jax.numpy as jnp
  import numpy as np
  from flax import nnx

  from linear_attention.train import results

  model, config, step = results.load_model(workdir)
  tokens, answer = _sparse_rows(config, examples)
  t = tokens.shape[1]
  graphdef, state = nnx.split(model)

  @jax.jit
  def last_logits(state, x):
    return nnx.merge(graphdef, state)(x, positions=jnp.full((x.shape[0], 1), t - 1))[:, 0]

  def acc(state):
    return float(np.mean(np.argmax(np.asarray(last_logits(state, jnp.asarray(tokens))), -1)
                         == answer))

  blocks = model.backbone.blocks
  out = {"step": step, "examples": int(tokens.shape[0]), "full": acc(state), "a_mean_by_n": {}}
  for i, block in enumerate(blocks):
    m = block.mixer
    r = 0 if m.dt_from_input else m.dt_rank
    kernel = m.x_proj.kernel[...]
    n = m.d_state
    out["a_mean_by_n"][f"layer{i}"] = [float(v) for v in
                                       np.mean(-np.asarray(m._params()[0]), axis=0)]
    for k in dims:
      for name, cut in ((f"only_n<{k}", np.arange(n) >= k), (f"without_n<{k}", np.arange(n) < k)):
        keep = jnp.asarray(np.concatenate([np.ones(r), 1.0 - cut, np.ones(n)]), kernel.dtype)
        m.x_proj.kernel.set_value(kernel * keep)  # B's columns of the cut dimensions: 0
        out[f"layer{i}_{name}"] = acc(nnx.split(model)[1])
      m.x_proj.kernel.set_value(kernel)
  return out


def decay_stats(workdir: str, step: int) -> dict:
  """A trained Mamba-1's ``A`` at ``step``, per layer: does training move it towards the slow
  decays that Mamba-1 starts with (every channel has an ``A_n = 1``)?

  Returns:
    ``{"step", "layer<i>": {"mean_a", "slow_share" (channels whose smallest A_n < 2),
    "spread" (mean over channels of max_n A_n - min_n A_n)}}``.
  """
  import numpy as np

  from linear_attention.train import results

  model, _, step = results.load_model(workdir, step)
  out = {"step": step}
  for i, block in enumerate(model.backbone.blocks):
    a = -np.asarray(block.mixer._params()[0])  # [d_inner, N], scalar_a broadcast
    out[f"layer{i}"] = {"mean_a": float(a.mean()), "slow_share": float(np.mean(a.min(-1) < 2)),
                        "spread": float(np.mean(a.max(-1) - a.min(-1)))}
  return out


def init_memory(overrides: dict, size: dict, distance: int = 128, seed: int = 0) -> dict:
  """How much of a token the initialised first layer still holds ``distance`` tokens later,
  per channel at its bias ``dt`` (``softplus(dt_bias)``, the input-dependent part left
  out): ``exp(-min_n A_n dt distance)`` for the slowest state dimension of each channel
  (Mamba-1; a head's ``A`` and ``dt`` for Mamba-2).

  Returns:
    ``{"distance", "median", "frac_above_0.1"}`` over the channels (heads for Mamba-2).
  """
  import jax
  import numpy as np
  from flax import nnx

  from linear_attention import nn as lnn

  mixer = overrides["model.mixer"]
  prefix = f"model.mixer_kwargs.{mixer}."
  kw = {k[len(prefix):]: v for k, v in overrides.items() if k.startswith(prefix)}
  heads = overrides.get("model.num_heads", 2)
  layer = lnn.make_mixer(mixer, size["d_model"], heads, rngs=nnx.Rngs(seed), **kw)
  a = np.exp(np.asarray(layer.A_log[...]))
  a_min = a.min(axis=-1) if a.ndim == 2 else a
  dt = np.asarray(jax.nn.softplus(layer.dt_bias[...]))
  keep = np.exp(-a_min * dt * distance)
  return {"distance": distance, "median": float(np.median(keep)),
          "frac_above_0.1": float(np.mean(keep > 0.1))}


def _fresh(path: str, workdir: str):
  """A cached per-model measurement, or None when it was taken at another step than the run's
  newest checkpoint (a longer run resumed from a copy of a shorter one's directory)."""
  from linear_attention.train import rundir

  cached = su.read_json(path)
  return cached if cached and cached.get("step") == rundir.newest_step_on_disk(workdir) else None


def main() -> int:
  t0 = time.time()
  p = su.study_args(__doc__, "synthetic")
  p.add_argument("--variants", default=",".join(v for v in VARIANTS if v != "default"),
                 help=f"comma-separated among {', '.join(VARIANTS)}")
  p.add_argument("--steps", type=int, help="training steps (default: the size's)")
  p.add_argument("--check-forms", default="slow_decay,slow_decay_1k,default_1k",
                 help="variants whose final model is decoded step by step against its "
                      "parallel forward (about a minute each; cached in the run directory)")
  p.add_argument("--context-test", default="mamba,slow_decay_1k,m1_scalar_a",
                 help="variants whose final model is tested with the token before the second "
                      "trigger repeated (see context_test; cached in the run directory)")
  p.add_argument("--ablate-state", default="mamba",
                 help="Mamba-1 variants whose final model is tested with some state dimensions "
                      "never written (see state_ablation; cached in the run directory)")
  p.add_argument("--merge", action="store_true",
                 help="keep the runs of the other variants already in <out>'s JSON (runs "
                      "trained in another --runs folder or session); these variants' rows "
                      "are replaced")
  args = p.parse_args()
  size = dict(SMOKE if args.smoke else FULL)
  if args.steps:
    size["steps"] = args.steps
  names = args.variants.split(",")
  bad = sorted(set(names) - set(VARIANTS))
  if bad:
    raise ValueError(f"--variants must be among {', '.join(VARIANTS)}; got {bad}.")
  steps = size["steps"]
  points = [sized(VARIANTS[n], size) for n in names]
  # A variant may train longer ("train.steps"); every run keeps all its evaluated checkpoints.
  longest = max([steps] + [p.get("train.steps", 0) for p in points])
  flags = (f"--config.data.seq_len={size['seq_len']}", f"--config.data.batch_size={size['batch']}",
           f"--config.model.d_model={size['d_model']}", f"--config.optim.lr={size['lr']}",
           "--config.optim.schedule=constant", f"--config.train.steps={steps}",
           f"--config.optim.warmup_steps={max(steps // 10, 1)}",
           f"--config.train.eval_every={size['eval_every']}",
           f"--config.train.log_every={max(steps // 20, 1)}", "--config.train.eval_batches=4",
           f"--config.train.checkpoint_every={size['eval_every']}",
           f"--config.train.keep_checkpoints={longest // size['eval_every'] + 1}",
           f"--config.model.short_conv={size['short_conv']}", "--config.data.dense=True")
  runs = os.path.join(su.runs_dir(args, "synthetic"), "mamba2_induction_probe")
  rows = su.train_grid("configs/induction_heads.py:size=small", points,
                       runs, args.workers, flags, collect_only=args.collect)

  from linear_attention.train import results, rundir
  b = min(size["test_examples"], 64)
  batches = -(-size["test_examples"] // b)
  for name, r in zip(names, rows):
    r["variant"] = name
    if r["status"] == "done":
      last = r["metrics"]["step"]
    else:
      # A run stopped part-way (the session's time ran out) is reported at its newest
      # evaluated checkpoint, marked with the step it stopped at.
      newest = rundir.newest_step_on_disk(r["workdir"]) or 0
      last = newest // size["eval_every"] * size["eval_every"]
      if last == 0:
        continue
      r["status"], r["stopped_at"] = "stopped", last
    cache_path = os.path.join(r["workdir"], "sparse_curve.json")
    cache = su.read_json(cache_path) or {}
    curve = []
    for step in range(size["eval_every"], last + 1, size["eval_every"]):
      key = f"{step}:{size['seq_len']}:{b}x{batches}"
      if key not in cache:
        res = results.evaluate_checkpoint(r["workdir"], {"seq_len": size["seq_len"],
                                                         "batch_size": b, "dense": False},
                                          num_batches=batches, split="test", step=step)
        cache[key] = res["accuracy"]
        su.write_json(cache_path, cache)
      n = b * batches
      curve.append({"step": step, "accuracy": cache[key], "examples": n,
                    "se": su.binomial_se(cache[key], n)})
    r["sparse_test_curve"] = curve
    if name in args.context_test.split(","):
      ctx_path = os.path.join(r["workdir"], "context_test.json")
      r["context_test"] = _fresh(ctx_path, r["workdir"]) or context_test(r["workdir"])
      su.write_json(ctx_path, r["context_test"])
    if name in args.ablate_state.split(",") and r["overrides"]["model.mixer"] == "mamba":
      abl_path = os.path.join(r["workdir"], "state_ablation.json")
      r["state_ablation"] = _fresh(abl_path, r["workdir"]) or state_ablation(
          r["workdir"], size["test_examples"])
      su.write_json(abl_path, r["state_ablation"])
    if r["overrides"]["model.mixer"] == "mamba" and curve:
      a_path = os.path.join(r["workdir"], "decay_stats.json")
      r["decay_stats"] = su.read_json(a_path) or [
          decay_stats(r["workdir"], c["step"]) for c in (curve[0], curve[-1])]
      su.write_json(a_path, r["decay_stats"])
    if name in args.check_forms.split(","):
      check_path = os.path.join(r["workdir"], "forms_agree.json")
      r["forms_agree"] = _fresh(check_path, r["workdir"]) or forms_agree(r["workdir"])
      su.write_json(check_path, r["forms_agree"])
    print(f"{name:>12}: sparse test " + " ".join(f"{c['step']}:{c['accuracy']:.2f}"
                                              for c in curve), flush=True)
    r["workdir"] = su.relative_path(r["workdir"])

  memory = {n: init_memory(pt, size) for n, pt in zip(names, points)}
  variants = dict(zip(names, points))
  out_path = os.path.join(args.out, "mamba2_induction_probe.json")
  earlier = []
  old = su.read_json(out_path) if args.merge else None
  if old:
    kept = [r for r in old["runs"] if r["variant"] not in variants]
    rows = kept + rows
    memory = {**{r["variant"]: old["init_memory"][r["variant"]] for r in kept}, **memory}
    variants = {**{r["variant"]: old["config"]["variants"][r["variant"]] for r in kept},
                **variants}
    earlier = old.get("earlier_environments", []) + [old["environment"]]
  table = [{"variant": r["variant"], "mixer": r["overrides"]["model.mixer"],
            "init_memory": memory[r["variant"]]["frac_above_0.1"],
            "dense_val": next((v["accuracy"] for v in r["validation_curve"]
                               if v["step"] == r["sparse_test_curve"][-1]["step"]), None),
            "sparse_test": r["sparse_test_curve"][-1]["accuracy"],
            "sparse_se": r["sparse_test_curve"][-1]["se"],
            "steps": r["sparse_test_curve"][-1]["step"],
            "stopped_at": r.get("stopped_at")}
           for r in rows if r.get("sparse_test_curve")]
  out = {"study": "mamba2_induction_probe", "config": {"smoke": args.smoke, **size,
                                                      "variants": variants},
         "chance": 1 / 15, "init_memory": memory, "elapsed_s": time.time() - t0,
         "environment": su.environment(shared_machine=True), "table": table, "runs": rows}
  if earlier:  # the sessions whose runs were kept by --merge
    out["earlier_environments"] = earlier
  os.makedirs(args.out, exist_ok=True)
  su.write_json(out_path, out)
  print(su.format_table(table, [("variant", "variant", "{}"), ("mixer", "mixer", "{}"),
                                ("init_memory", "init mem", "{:.2f}"),
                                ("dense_val", "dense val", "{:.3f}"),
                                ("sparse_test", "sparse test", "{:.3f}"),
                                ("sparse_se", "se", "{:.3f}"), ("steps", "steps", "{}")]))
  return 0 if all(r["status"] in ("done", "stopped") for r in rows) else 1


if __name__ == "__main__":
  sys.exit(main())
