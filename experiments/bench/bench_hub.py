"""linear_attention.hub: loading memory, and prefill/decode speed against transformers.

memory: writes a sharded bfloat16 Mamba-2-shaped checkpoint of ``--gb`` GB (deterministic
values, no torch), then loads it with ``hub.from_pretrained`` in a fresh process and reports
its peak RSS over the checkpoint size, raw and above the process's RSS after its imports.

speed: one random float32 Mamba-2-shaped model (``--d-model``, ``--layers``; about 100M
parameters at the defaults), or Qwen3-Next-shaped with ``--model qwen3_next`` (Gated
DeltaNet with 2 value heads per q/k head and gated attention, 3:1, MoE of 16 experts, top 2,
plus a shared expert; about 100M parameters at ``--layers 4``, 154M at 8), made by
transformers, loaded here: prefill of ``--prefill`` tokens (the forward pass, seconds) and
greedy decoding (tokens/s after a prefill of 16), this project's (jit, the O(1) state)
against transformers' (torch, its own cache), in the same process on the same ``--threads``
cores (the process is pinned to them), as ratios.
Needs torch and transformers (``pip install -e ".[hf]"``).

Results go to ``<out>/bench_hub.json`` (``bench_hub_qwen3_next.json`` for that model), by
default under ``runs/results/``; the committed copies only with ``--out results``. A table is
printed.

    python experiments/bench/bench_hub.py                        # both parts, defaults
    python experiments/bench/bench_hub.py --part memory --gb 1.1
    python experiments/bench/bench_hub.py --part speed --threads 1
    python experiments/bench/bench_hub.py --part speed --model qwen3_next --layers 4
    python experiments/bench/bench_hub.py --smoke                # tiny, to check it runs
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # the package and experiments/

from experiments import outputs  # noqa: E402


def _mamba2_config(d_model: int, layers: int, vocab: int, *, head_dim: int = 64,
                   state: int = 128, groups: int = 1) -> dict:
  return {"model_type": "mamba2", "architectures": ["Mamba2ForCausalLM"],
          "hidden_size": d_model, "num_hidden_layers": layers, "vocab_size": vocab,
          "num_heads": 2 * d_model // head_dim, "head_dim": head_dim, "expand": 2,
          "state_size": state, "n_groups": groups, "conv_kernel": 4, "chunk_size": 256,
          "tie_word_embeddings": False, "layer_norm_epsilon": 1e-5, "use_bias": False,
          "use_conv_bias": True, "hidden_act": "silu", "rms_norm": True,
          "time_step_limit": [0.0, 1e30], "pad_token_id": 0, "bos_token_id": 0,
          "eos_token_id": 0, "dtype": "bfloat16"}


def _qwen3_next_config(d_model: int, layers: int, vocab: int) -> dict:
  heads = max(1, d_model // 96)
  kinds = ["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)]
  kinds[-1] = "full_attention"  # at least one (transformers' generate needs an attention layer)
  return {"hidden_size": d_model, "num_hidden_layers": layers, "vocab_size": vocab,
          "layer_types": kinds,
          "num_attention_heads": heads, "num_key_value_heads": 1 if heads < 4 else 2,
          "head_dim": 64, "linear_num_key_heads": heads, "linear_num_value_heads": 2 * heads,
          "linear_key_head_dim": 64, "linear_value_head_dim": 64, "num_experts": 16,
          "num_experts_per_tok": 2, "moe_intermediate_size": max(16, d_model // 48 * 16),
          "shared_expert_intermediate_size": d_model // 2, "intermediate_size": 2 * d_model,
          "tie_word_embeddings": False, "pad_token_id": 0, "bos_token_id": 0,
          "eos_token_id": 0}


# ----------------------------------------------------------------------------- memory


def write_checkpoint(directory: pathlib.Path, config: dict, shard_bytes: int) -> int:
  """Writes ``config`` and a bfloat16 checkpoint of it, one shard in memory at a time;
  returns the bytes of tensor data."""
  import jax.numpy as jnp
  import ml_dtypes
  import numpy as np
  from flax import nnx
  from linear_attention.hub import checkpoint, core, loader
  family = loader.family_of(config)
  model = nnx.eval_shape(lambda: family.build(config, rngs=nnx.Rngs(0), dtype=jnp.bfloat16,
                                              param_dtype=jnp.bfloat16))
  variables = {tuple(p): v for p, v in nnx.to_flat_state(nnx.state(model))}
  tensors = [e for e in family.tensors(config) if isinstance(e, core.Tensor)]
  sizes = {t.names[0]: int(np.prod(variables[t.path].shape)) * 2 for t in tensors}

  def arrays():
    for t in tensors:
      shape = variables[t.path].shape
      # Small deterministic values (content does not change the memory measured).
      value = ((np.arange(int(np.prod(shape)), dtype=np.float32) % 251 - 125) / 1250.0)
      yield t.names[0], t.save(value.reshape(shape).astype(ml_dtypes.bfloat16))[0]

  directory.mkdir(parents=True, exist_ok=True)
  checkpoint.write(directory, arrays(), sizes, shard_bytes)
  (directory / "config.json").write_text(json.dumps(config))
  return sum(sizes.values())


def _status() -> dict:
  """This process's memory counters from ``/proc/self/status``, in bytes."""
  out = {}
  with open("/proc/self/status") as f:
    for line in f:
      key, _, value = line.partition(":")
      if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
        out[key] = int(value.split()[0]) * 1024
  return out


def _load_child(directory: str) -> None:
  """Runs in a fresh process: prints its memory after the imports and after loading."""
  import jax
  from flax import nnx
  from linear_attention import hub
  from linear_attention.hub import loader  # noqa: F401  (imports counted in the baseline)
  jax.numpy.zeros(1).block_until_ready()
  base = _status()
  t0 = time.perf_counter()
  model = hub.from_pretrained(directory)
  jax.block_until_ready(jax.tree_util.tree_leaves(nnx.state(model)))
  seconds = time.perf_counter() - t0
  after = _status()
  print(json.dumps({"rss_after_imports": base["VmRSS"], "peak_rss_after_imports": base["VmHWM"],
                    "peak_rss": after["VmHWM"], "rss_after_load": after["VmRSS"],
                    "rss_file_after_load": after["RssFile"], "load_seconds": seconds}))


def bench_memory(gb: float, workdir: pathlib.Path, shard_gb: float = 0.25) -> dict:
  # d_model 2048, 64 heads of 64: about 25M parameters a layer.
  layers = max(1, round(gb * 2**30 / 2 / 25.5e6))
  config = _mamba2_config(2048, layers, 32000)
  directory = workdir / "ckpt_bf16"
  t0 = time.perf_counter()
  size = write_checkpoint(directory, config, int(shard_gb * 2**30))
  write_s = time.perf_counter() - t0
  out = subprocess.run([sys.executable, __file__, "--load-child", str(directory)],
                       capture_output=True, text=True, check=True,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  child = json.loads(out.stdout.strip().splitlines()[-1])
  shards = len(list(directory.glob("*.safetensors")))
  return {"checkpoint_bytes": size, "shards": shards, "layers": layers, "d_model": 2048,
          "write_seconds": write_s, **child,
          "peak_rss_over_size": child["peak_rss"] / size,
          "peak_rss_above_imports_over_size": (child["peak_rss"] - child["rss_after_imports"])
                                               / size}


# ----------------------------------------------------------------------------- speed


def _time(fn, reps: int) -> float:
  fn()  # warm-up (compiles)
  best = float("inf")
  for _ in range(reps):
    t0 = time.perf_counter()
    fn()
    best = min(best, time.perf_counter() - t0)
  return best


def bench_speed(d_model: int, layers: int, vocab: int, prefill: int, decode: int, reps: int,
                threads: int, workdir: pathlib.Path, model_type: str = "mamba2") -> dict:
  import jax
  import jax.numpy as jnp
  import numpy as np
  import torch
  import transformers
  from flax import nnx
  from linear_attention import hub
  from linear_attention.models import generate
  torch.set_num_threads(threads)
  if model_type == "qwen3_next":
    hf_config = transformers.Qwen3NextConfig(**_qwen3_next_config(d_model, layers, vocab))
  else:
    config = _mamba2_config(d_model, layers, vocab)
    config.pop("architectures")
    config.pop("model_type")
    config["dtype"] = "float32"
    config["time_step_limit"] = [0.0, float("inf")]
    hf_config = transformers.Mamba2Config(**config)
  torch.manual_seed(0)
  ref = transformers.AutoModelForCausalLM.from_config(hf_config).float().eval()
  params = sum(p.numel() for p in ref.parameters())
  ref.save_pretrained(workdir / "ckpt_f32")
  model = hub.from_pretrained(workdir / "ckpt_f32")
  graphdef, state = nnx.split(model)
  forward = jax.jit(lambda s, t: nnx.merge(graphdef, s)(t))
  tokens = np.random.default_rng(0).integers(0, vocab, (1, prefill))
  tt, jt = torch.from_numpy(tokens), jnp.asarray(tokens, jnp.int32)

  def torch_prefill():
    with torch.no_grad():
      ref(tt)

  ours_prefill = _time(lambda: forward(state, jt).block_until_ready(), reps)
  theirs_prefill = _time(torch_prefill, reps)
  prompt = tokens[:, :16]

  def torch_decode():
    with torch.no_grad():
      ids = torch.from_numpy(prompt)
      ref.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=decode,
                   min_new_tokens=decode, do_sample=False)

  ours_decode = _time(lambda: generate(model, jnp.asarray(prompt, jnp.int32), decode,
                                       temperature=0).block_until_ready(), reps)
  theirs_decode = _time(torch_decode, reps)
  return {"model_type": model_type, "params": params, "d_model": d_model, "layers": layers,
          "vocab": vocab,
          "threads": threads, "prefill_tokens": prefill, "decode_tokens": decode,
          "ours_prefill_s": ours_prefill, "transformers_prefill_s": theirs_prefill,
          "prefill_speedup": theirs_prefill / ours_prefill,
          "ours_decode_tok_s": decode / ours_decode,
          "transformers_decode_tok_s": decode / theirs_decode,
          "decode_speedup": theirs_decode / ours_decode,
          "versions": {"jax": jax.__version__, "torch": torch.__version__,
                       "transformers": transformers.__version__}}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--part", choices=("memory", "speed", "both"), default="both")
  parser.add_argument("--model", choices=("mamba2", "qwen3_next"), default="mamba2",
                      help="the speed part's model shape")
  parser.add_argument("--gb", type=float, default=1.1)
  parser.add_argument("--threads", type=int, default=1)
  parser.add_argument("--d-model", type=int, default=768)
  parser.add_argument("--layers", type=int, default=24)
  parser.add_argument("--vocab", type=int, default=32000)
  parser.add_argument("--prefill", type=int, default=4096)
  parser.add_argument("--decode", type=int, default=64)
  parser.add_argument("--reps", type=int, default=3)
  parser.add_argument("--smoke", action="store_true", help="tiny sizes, to check it runs")
  parser.add_argument("--out", default=outputs.RUNS_RESULTS,
                      help="folder of the JSON (default runs/results; the committed copies "
                           "only when named: --out results)")
  parser.add_argument("--load-child", help=argparse.SUPPRESS)
  args = parser.parse_args()
  if args.load_child:
    _load_child(args.load_child)
    return
  if args.smoke:
    args.gb, args.d_model, args.layers, args.vocab = 0.02, 64, 2, 256
    args.prefill, args.decode, args.reps = 128, 8, 1
  cores = sorted(os.sched_getaffinity(0))[:args.threads]
  os.sched_setaffinity(0, cores)  # jax and torch then see and use only these cores
  from linear_attention.io import write_json
  meta = {"argv": sys.argv[1:], "cores": cores, "loadavg_at_start": os.getloadavg(),
          "smoke": args.smoke}
  result = {"meta": meta}
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    if args.part in ("memory", "both"):
      m = bench_memory(args.gb, tmp)
      result["memory"] = m
      print(f"memory: {m['checkpoint_bytes'] / 2**30:.2f} GiB bf16 in {m['shards']} shards: "
            f"peak RSS {m['peak_rss'] / 2**30:.2f} GiB = {m['peak_rss_over_size']:.2f}x the "
            f"checkpoint ({m['peak_rss_above_imports_over_size']:.2f}x above the "
            f"{m['rss_after_imports'] / 2**30:.2f} GiB after imports); load "
            f"{m['load_seconds']:.1f} s")
    if args.part in ("speed", "both"):
      s = bench_speed(args.d_model, args.layers, args.vocab, args.prefill, args.decode,
                      args.reps, args.threads, tmp, args.model)
      result["speed"] = s
      print(f"speed ({args.model}, {s['params'] / 1e6:.0f}M params, {args.threads} "
            f"thread(s)):\n"
            f"  prefill {s['prefill_tokens']} tokens: ours {s['ours_prefill_s']:.3f} s, "
            f"transformers {s['transformers_prefill_s']:.3f} s -> {s['prefill_speedup']:.2f}x\n"
            f"  decode: ours {s['ours_decode_tok_s']:.1f} tok/s, transformers "
            f"{s['transformers_decode_tok_s']:.1f} tok/s -> {s['decode_speedup']:.2f}x")
  meta["loadavg_at_end"] = os.getloadavg()
  name = "bench_hub.json" if args.model == "mamba2" else f"bench_hub_{args.model}.json"
  path = write_json(os.path.join(args.out, name), result)
  print("wrote", path)


if __name__ == "__main__":
  main()
