"""Per-token decode latency of a 4-layer language model against the context position.

Each mixer's model (``d_model`` 256, 4 layers, 4 heads) decodes one token with
its cache already at position ``p`` (1k, 16k, 64k by default). Linear and
recurrent mixers keep an O(1) state, so their latency should not move with
``p``; softmax reads a KV cache of ``p + 1`` tokens per layer, so its latency
grows linearly; local attention reads a fixed window. The cache contents are
zeros (latency does not depend on them); only the position and sizes matter.
With ``--batches 1,4,16,64`` it also decodes at batch: tokens per second
(``batch`` rows per step) against the batch size, the rows and caches split
over every device of the backend (``models.generate``'s ``mesh``) when there
are several. Results go to ``<out>/bench_decode.json``; tables are printed.

    python experiments/bench/bench_decode.py
    python experiments/bench/bench_decode.py --mixers softmax,gla --positions 1024,4096
    python experiments/bench/bench_decode.py --positions 4096 --batches 1,4,16,64
    python experiments/bench/bench_decode.py --smoke              # tiny, for CI
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # the package and experiments/

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from flax import nnx  # noqa: E402

from experiments import outputs  # noqa: E402
from linear_attention import models  # noqa: E402
from linear_attention.models.generate import shard_batch  # noqa: E402
from linear_attention.io import write_json  # noqa: E402
from linear_attention.nn import registry  # noqa: E402

DEFAULT_MIXERS = registry.select(study="bench_decode")


def _at_position(cache, position: int):
  """Sets every ``"pos"`` counter in the cache to ``position``."""

  def fix(path, leaf):
    return jnp.asarray(position, leaf.dtype) if path[-1].key == "pos" else leaf

  return jax.tree_util.tree_map_with_path(fix, cache)


def bench_one(mixer: str, position: int, *, d_model: int, num_layers: int, num_heads: int,
              vocab: int, batch: int, reps: int) -> dict:
  """Median seconds per decoded token for one mixer at one context position."""
  model = models.LanguageModel(vocab, d_model, num_layers, mixer=mixer, num_heads=num_heads,
                               mixer_kwargs={"local": {"window": 1024}}, rngs=nnx.Rngs(0))
  graphdef, state = nnx.split(model)
  cache = _at_position(model.init_cache(batch, position + reps + 2), position)
  cache_bytes = sum(x.nbytes for x in jax.tree_util.tree_leaves(cache))
  n = jax.device_count()
  mesh = (jax.make_mesh((n,), ("data",), axis_types=(jax.sharding.AxisType.Auto,))
          if n > 1 and batch % n == 0 else None)
  # Placed as the step returns it, so the timed calls never recompile for a new layout.
  cache = jax.jit(lambda c: shard_batch(c, mesh, batch))(cache)

  # The cache is donated, so the KV write is in place (as inside generate's scan)
  # instead of a copy of the whole cache per token.
  @functools.partial(jax.jit, donate_argnums=2)
  def step(state, tok, cache):
    out, cache = nnx.merge(graphdef, state).decode_step(shard_batch(tok, mesh, batch),
                                                       shard_batch(cache, mesh, batch))
    return out, shard_batch(cache, mesh, batch)

  tok = jnp.zeros((batch,), jnp.int32)
  t0 = time.perf_counter()
  _, cache = jax.block_until_ready(step(state, tok, cache))
  compile_s = time.perf_counter() - t0
  times = []
  for _ in range(reps):
    # Positions move on by one per rep (p + reps at most): negligible for p >= 1k.
    t0 = time.perf_counter()
    _, cache = jax.block_until_ready(step(state, tok, cache))
    times.append(time.perf_counter() - t0)
  times.sort()
  return {"mixer": mixer, "position": position, "batch": batch,
          "devices": 1 if mesh is None else n,
          "ms_per_token": 1e3 * times[len(times) // 2], "ms_min": 1e3 * times[0],
          "tokens_per_s": batch / times[len(times) // 2],
          "cache_mib": cache_bytes / 2**20, "compile_s": compile_s,
          "params": models.count_params(model)}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--mixers", default=",".join(DEFAULT_MIXERS))
  parser.add_argument("--positions", default="1024,16384,65536")
  parser.add_argument("--d_model", type=int, default=256)
  parser.add_argument("--num_layers", type=int, default=4)
  parser.add_argument("--num_heads", type=int, default=4)
  parser.add_argument("--vocab", type=int, default=1024)
  parser.add_argument("--batch", type=int, default=1, help="rows per step of the latency table")
  parser.add_argument("--batches", default="",
                      help="comma-separated batch sizes for the tokens/s table (at the first "
                           "position); empty: none")
  parser.add_argument("--reps", type=int, default=20)
  outputs.add_out(parser, "", what="output folder")
  parser.add_argument("--smoke", action="store_true", help="tiny sizes, for CI")
  args = parser.parse_args(argv)
  if args.smoke:
    args.mixers, args.positions, args.d_model, args.reps = "softmax,gla", "16,64", 32, 2
  rows = []
  for mixer in args.mixers.split(","):
    for p in (int(x) for x in args.positions.split(",")):
      row = bench_one(mixer, p, d_model=args.d_model, num_layers=args.num_layers,
                      num_heads=args.num_heads, vocab=args.vocab, batch=args.batch,
                      reps=args.reps)
      rows.append(row)
      print(f"{mixer:>15} pos {p:>6}: {row['ms_per_token']:8.3f} ms/token  "
            f"cache {row['cache_mib']:9.2f} MiB", flush=True)
  batches = [int(x) for x in args.batches.split(",") if x]
  at_batch = []
  for mixer in args.mixers.split(",") if batches else ():
    for b in batches:
      at_batch.append(bench_one(mixer, int(args.positions.split(",")[0]), d_model=args.d_model,
                                num_layers=args.num_layers, num_heads=args.num_heads,
                                vocab=args.vocab, batch=b, reps=args.reps))
  meta = {"backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
          "jax": jax.__version__, "config": vars(args)}
  path = os.path.join(args.out, "bench_decode.json")
  write_json(path, {"meta": meta, "results": rows, "at_batch": at_batch})
  positions = sorted({r["position"] for r in rows})
  print("\nms per token (median) | " + " | ".join(f"pos {p}" for p in positions))
  for mixer in dict.fromkeys(r["mixer"] for r in rows):
    vals = {r["position"]: r["ms_per_token"] for r in rows if r["mixer"] == mixer}
    print(f"{mixer:>15} | " + " | ".join(f"{vals.get(p, float('nan')):8.3f}" for p in positions))
  if at_batch:
    print(f"\ntokens/s at position {at_batch[0]['position']} | "
          + " | ".join(f"batch {b}" for b in batches))
    for mixer in dict.fromkeys(r["mixer"] for r in at_batch):
      vals = {r["batch"]: r["tokens_per_s"] for r in at_batch if r["mixer"] == mixer}
      print(f"{mixer:>15} | " + " | ".join(f"{vals[b]:8.0f}" for b in batches))
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
