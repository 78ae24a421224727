"""Scale benchmarks. Part (b): context parallelism (``config.mesh.seq``) on fake CPU devices.

For each mixer of ``--mixer`` (GLA by default, or a comma-separated list such as
``gated_deltanet,mamba``; d 64, 2 layers, byte vocabulary, one row) and a range of sequence
lengths, the trainer's own training step (``trainer.make_steps``: forward,
backward, AdamW) is compiled on a ``("data", "seq")`` mesh of ``1 x seq`` devices for
``seq`` = 1, 2, 4. XLA's ``memory_analysis`` of the compiled step gives the plan of one
device: temporaries + arguments + outputs (bytes; the donated state is counted in both
arguments and outputs, as the brief for this benchmark asks, so it is an upper bound). A
length "fits" when that total is within ``--budget_mb`` per device; steps that fit are
also timed (median of ``--steps`` after the compiling one).

The devices are fake (``--xla_force_host_platform_device_count``): they share the host's
cores, so step times do not speed up with ``seq``; they show the cost of the collectives
and the per-device work, and memory is the measure. Writes ``runs/results/bench_scale_cpu.json``
(``--out``) and prints a table; rows of other mixers already in that file are kept, so runs
of different mixers at different sizes add up in one file.

  python experiments/bench/bench_scale.py                          # GLA, T = 4k .. 256k, 1 GB
  python experiments/bench/bench_scale.py --mixer=gated_deltanet,mamba --lengths=1024,4096 \
      --budget_mb=64

Part (a), ``--part a``: the cost of real cross-process collectives. The trainer's command
(``python -m linear_attention.main``, the MQAR model at d 64, 2 layers, T 256, batch 16) runs
as one process holding 2 CPU devices and as 2 processes of one device each on localhost
(Gloo all-reduces), with data parallelism and with FSDP; tokens/s is the median of the
trainer's own logged windows after the first. Writes ``runs/results/bench_scale_processes_cpu.json``
(``--out results/...`` for the committed files).

  python experiments/bench/bench_scale.py --part a

Part model, ``--part model``: the memory a real-size model needs per device, without the
devices. A Gated DeltaNet hybrid with one softmax layer in four (``"DDDA"``, vocabulary
32,768) at 1B (d_model 2048, 20 layers) and 8B (d_model 4096, 40 layers) parameters; the
trainer's train step (scanned layers, FSDP, one sequence per device) compiled from abstract
shapes for 8 and 64 fake devices, with ``model.remat`` none and block, at 4k and 32k
tokens per sequence; XLA's memory plan per device and whether it fits an 80 GB GPU and a
16 GB TPU v5e chip. Writes ``runs/results/bench_scale_model_cpu.json`` unless ``--out`` names
another file (``results/bench_scale_model_cpu.json`` holds the committed table).

  python experiments/bench/bench_scale.py --part model --out results/bench_scale_model_cpu.json

Part depth, ``--part depth``: the train step's compile time against depth (default 6, 24
and 48 layers of Gated DeltaNet scanned, ``model.scan_layers``, whose parameters and
optimizer state are one stacked array per parameter; 6 and 24 unrolled).
"""

from __future__ import annotations

import os
import sys

# Before JAX starts: 4 fake CPU devices, 64 for the memory table (an explicit XLA_FLAGS count
# wins).
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
  _count = 64 if any(a in ("--part=model", "model") for a in sys.argv[1:]) else 4
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                             + f" --xla_force_host_platform_device_count={_count}").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)  # the package and experiments/

import argparse  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from flax import nnx  # noqa: E402

from experiments import outputs  # noqa: E402
from linear_attention import models  # noqa: E402
from linear_attention.io import write_json  # noqa: E402
from linear_attention.train import optim, sharding, trainer  # noqa: E402

MB = 2**20


def build_step(mixer: str, seq: int, seq_len: int, d_model: int, num_layers: int,
               num_heads: int, vocab: int, batch: int):
  """The trainer's jitted train step on a ``1 x seq`` mesh, its placed state and batch.

  Returns:
    ``(step, state, batch, mesh, num_params)``; ``step`` runs inside the mesh context.
  """
  mcfg = dict(mixer=mixer, pattern="", d_model=d_model, num_layers=num_layers,
              num_heads=num_heads, mlp_ratio=8 / 3, tie_embeddings=True, mixer_kwargs={},
              pooling="mean", dtype="float32")
  model = trainer.create_model(mcfg, vocab, "lm", None, seed=0)
  ocfg = dict(lr=1e-3, warmup_steps=10, final_lr_ratio=0.1, weight_decay=0.1, b1=0.9,
              b2=0.95, eps=1e-8, clip_norm=1.0)
  opt = optim.make_optimizer(model, ocfg, total_steps=100)
  mesh = sharding.make_mesh({"data": 1, "seq": seq})
  graphdef, state = nnx.split((model, opt))
  state_sh = sharding.state_shardings(state, mesh, fsdp=False)
  state = jax.device_put(state, state_sh)
  rng = np.random.default_rng(0)
  toks = rng.integers(0, vocab, (batch, seq_len + 1)).astype(np.int32)
  host = {"inputs": toks[:, :-1], "targets": toks[:, 1:],
          "mask": np.ones((batch, seq_len), np.float32)}
  repl = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  train_fn, _ = trainer.make_steps(graphdef, "lm", state_sh,
                                   sharding.batch_shardings(host, mesh), repl)
  return train_fn, state, sharding.put_batch(host, mesh), mesh, models.count_params(model)


def measure(mixer: str, seq: int, seq_len: int, args) -> dict:
  """The per-device memory plan of one training step and, if it fits, its time."""
  train_fn, state, batch, mesh, num_params = build_step(
      mixer, seq, seq_len, args.d_model, args.num_layers, args.num_heads, args.vocab,
      args.batch)
  t0 = time.perf_counter()
  with sharding.mesh_context(mesh):
    compiled = train_fn.lower(state, batch).compile()
  compile_s = time.perf_counter() - t0
  ma = compiled.memory_analysis()
  mem = {"temp": int(ma.temp_size_in_bytes), "arguments": int(ma.argument_size_in_bytes),
         "outputs": int(ma.output_size_in_bytes), "alias": int(ma.alias_size_in_bytes)}
  mem["total"] = mem["temp"] + mem["arguments"] + mem["outputs"]
  row = {"seq": seq, "seq_len": seq_len, "tokens_per_device": seq_len // seq,
         "memory_bytes": mem, "fits": mem["total"] <= args.budget_mb * MB,
         "compile_s": compile_s, "num_params": num_params, "step_s": None, "loss": None}
  if row["fits"]:
    state, m = compiled(state, batch)  # the first run (allocation) is not timed
    jax.block_until_ready(m["loss"])
    times = []
    for _ in range(args.steps):
      t0 = time.perf_counter()
      state, m = compiled(state, batch)
      jax.block_until_ready(m["loss"])
      times.append(time.perf_counter() - t0)
    row["step_s"] = float(np.median(times))
    row["loss"] = float(m["loss"])
  return row


def _free_port() -> int:
  import socket
  with socket.socket() as sock:
    sock.bind(("127.0.0.1", 0))
    return sock.getsockname()[1]


def run_processes(workdir: str, processes: int, fsdp: bool, steps: int, timeout: float) -> dict:
  """Trains through the CLI as ``processes`` processes (1 device each) or one of 2 devices;
  returns tokens/s (median of the logged windows after the first) and the final loss."""
  import json
  import subprocess
  devices = 1 if processes > 1 else 2
  env = {**os.environ, "JAX_PLATFORMS": "cpu",
         "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"}
  cmd = [sys.executable, "-m", "linear_attention.main", f"--workdir={workdir}", "--quiet",
         "--config=configs/mqar.py:size=small", "--config.data.seq_len=256",
         "--config.data.num_kv_pairs=16", "--config.data.batch_size=16",
         f"--config.train.steps={steps}", "--config.train.eval_every=0",
         "--config.train.log_every=10", f"--config.train.checkpoint_every={10 * steps}",
         "--config.train.eval_batches=1", f"--config.mesh.fsdp={fsdp}"]
  if processes > 1:
    cmd += [f"--coordinator_address=127.0.0.1:{_free_port()}", f"--num_processes={processes}"]
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  procs = [subprocess.Popen(cmd + ([f"--process_id={i}"] if processes > 1 else []), cwd=root,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
           for i in range(processes)]
  try:
    errs = [p.communicate(timeout=timeout)[1] for p in procs]
  except subprocess.TimeoutExpired:
    for p in procs:
      p.kill()
    raise SystemExit(f"error: the {processes}-process run did not finish in {timeout:.0f} s")
  for p, err in zip(procs, errs):
    if p.returncode:
      raise SystemExit(f"error: a process exited {p.returncode}: {err[-2000:]}")
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    recs = [json.loads(line) for line in f]
  train = [r for r in recs if r["split"] == "train"]
  return {"tokens_per_s": float(np.median([r["tokens_per_s"] for r in train[1:]])),
          "windows": len(train) - 1, "final_train_loss": train[-1]["loss"]}


def main_processes(argv=None) -> dict:
  """Part (a): 1 process x 2 devices against 2 processes x 1 device (see the docstring)."""
  import tempfile
  p = argparse.ArgumentParser(description="bench_scale part (a)")
  p.add_argument("--part", default="a")
  p.add_argument("--steps", type=int, default=60)
  p.add_argument("--timeout", type=float, default=900.0)
  outputs.add_out(p, "bench_scale_processes_cpu.json")
  args = p.parse_args(argv)
  rows = []
  with tempfile.TemporaryDirectory() as tmp:
    for fsdp in (False, True):
      for processes in (1, 2):
        r = run_processes(os.path.join(tmp, f"{processes}-{fsdp}"), processes, fsdp,
                          args.steps, args.timeout)
        rows.append({"processes": processes, "devices_per_process": 2 // processes,
                     "fsdp": fsdp, **r})
        print(f"{'FSDP' if fsdp else 'data parallel':>13} {processes} process(es) x "
              f"{2 // processes} device(s): {r['tokens_per_s']:9.0f} tokens/s", flush=True)
  for r in rows:
    one = next(x for x in rows if x["fsdp"] == r["fsdp"] and x["processes"] == 1)
    r["vs_one_process"] = r["tokens_per_s"] / one["tokens_per_s"]
  print(f"\n{'sharding':>13} {'layout':>10} {'tokens/s':>10} {'vs 1 process':>13}")
  for r in rows:
    print(f"{'FSDP' if r['fsdp'] else 'data':>13} {r['processes']}x{r['devices_per_process']:<8} "
          f"{r['tokens_per_s']:>10.0f} {r['vs_one_process']:>12.2f}x")
  out = {"benchmark": "bench_scale (a): 1 process x 2 devices vs 2 processes x 1 device",
         "model": "configs/mqar.py:size=small, T 256, 16 pairs, batch 16 (global)",
         "device": f"CPU, {os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
                   f"Gloo collectives between processes, jax {jax.__version__}",
         "steps": args.steps, "rows": rows}
  write_json(args.out, out)
  print(f"wrote {args.out}", flush=True)
  return out


def main(argv=None) -> dict:
  argv = sys.argv[1:] if argv is None else argv
  part = next((a.split("=", 1)[1] for a in argv if a.startswith("--part=")), None)
  if part is None and "--part" in argv:
    part = argv[argv.index("--part") + 1]
  if part in ("a", "model", "depth"):
    return {"a": main_processes, "model": main_model, "depth": main_depth}[part](argv)
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--part", default="b", choices=["a", "b", "model", "depth"],
                 help="a: processes; b: mesh.seq; model: memory table; depth: compile time")
  p.add_argument("--mixer", default="gla", help="a registry mixer or a comma-separated list")
  p.add_argument("--lengths", default="4096,16384,65536,131072,262144")
  p.add_argument("--seqs", default="1,2,4")
  p.add_argument("--budget_mb", type=float, default=1024.0)
  p.add_argument("--d_model", type=int, default=64)
  p.add_argument("--num_layers", type=int, default=2)
  p.add_argument("--num_heads", type=int, default=4)
  p.add_argument("--vocab", type=int, default=256)
  p.add_argument("--batch", type=int, default=1)
  p.add_argument("--steps", type=int, default=2)
  outputs.add_out(p, "bench_scale_cpu.json")
  args = p.parse_args(argv)
  lengths = [int(x) for x in args.lengths.split(",")]
  seqs = [int(x) for x in args.seqs.split(",")]
  if jax.device_count() < max(seqs):
    raise SystemExit(f"error: --seqs up to {max(seqs)} needs that many devices, got "
                     f"{jax.device_count()} (XLA_FLAGS={os.environ.get('XLA_FLAGS')!r}).")
  out = {"benchmark": "bench_scale (b): context parallelism, fake CPU devices",
         "memory": "XLA memory_analysis of the compiled train step, per device: temp + "
                   "arguments + outputs (the donated state counted in both; 'alias' bytes "
                   "of it are shared)",
         "device": f"{jax.device_count()} fake CPU devices on {os.cpu_count()} cores "
                   f"({platform.processor() or platform.machine()}), jax {jax.__version__}",
         "configs": {}, "rows": [], "summary": {}}
  out.update(_previous(args.out))
  for mixer in args.mixer.split(","):
    rows, summary = _part_b(mixer, lengths, seqs, args)
    out["rows"] = [r for r in out["rows"] if r["mixer"] != mixer] + rows
    out["configs"][mixer] = {k: v for k, v in vars(args).items() if k not in ("out", "mixer")}
    out["summary"][mixer] = summary
  write_json(args.out, out)
  print(f"wrote {args.out}", flush=True)
  return out


def _previous(path: str) -> dict:
  """The rows, configs and summaries of ``path`` (if it exists), keyed by mixer; the
  one-mixer layout of earlier versions (``config``, ``summary``) is read too."""
  import json
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    old = json.load(f)
  if "configs" in old:
    return {k: old[k] for k in ("configs", "rows", "summary")}
  mixer = old["config"]["mixer"]
  return {"configs": {mixer: {k: v for k, v in old["config"].items() if k != "mixer"}},
          "rows": [{"mixer": mixer, **r} for r in old["rows"]],
          "summary": {mixer: old["summary"]}}


def _part_b(mixer: str, lengths: list[int], seqs: list[int], args) -> tuple[list, dict]:
  """Measures ``mixer`` at every length and seq; prints the table; returns (rows, summary)."""
  rows = []
  print(f"{mixer}, d {args.d_model}, {args.num_layers} layers, batch {args.batch}; "
        f"budget {args.budget_mb:.0f} MiB per device", flush=True)
  print(f"{'T':>8} {'seq':>4} {'T/dev':>8} {'temp MiB':>9} {'args MiB':>9} {'out MiB':>8} "
        f"{'total MiB':>10} {'fits':>5} {'step s':>8}", flush=True)
  for t in lengths:
    for s in seqs:
      r = {"mixer": mixer, **measure(mixer, s, t, args)}
      rows.append(r)
      m = r["memory_bytes"]
      step = "-" if r["step_s"] is None else f"{r['step_s']:.3f}"
      print(f"{t:>8} {s:>4} {t // s:>8} {m['temp'] / MB:>9.1f} {m['arguments'] / MB:>9.1f} "
            f"{m['outputs'] / MB:>8.1f} {m['total'] / MB:>10.1f} {str(r['fits']):>5} "
            f"{step:>8}", flush=True)
  # The headline: the longest length each seq fits, and the memory at the longest both fit.
  longest = {s: max([r["seq_len"] for r in rows if r["seq"] == s and r["fits"]], default=None)
             for s in seqs}
  both = [t for t in lengths if all(r["fits"] for r in rows if r["seq_len"] == t)]
  at = max(both, default=None)
  ratio = None
  if at is not None:
    tot = {r["seq"]: r["memory_bytes"]["total"] for r in rows if r["seq_len"] == at}
    ratio = {s: tot[s] / tot[seqs[0]] for s in seqs}
  summary = {"longest_fitting_seq_len": {str(s): v for s, v in longest.items()},
             "longest_length_all_fit": at,
             "memory_vs_seq1_at_that_length": None if ratio is None else
             {str(s): v for s, v in ratio.items()}}
  print(f"longest length within the budget: {summary['longest_fitting_seq_len']}; at T={at} "
        f"(all fit) memory per device relative to seq={seqs[0]}: "
        + ("-" if ratio is None else ", ".join(f"seq {s}: {v:.2f}" for s, v in ratio.items())),
        flush=True)
  return rows, summary



# ----------------------------------------------------------------------------- part model

# The hybrid of the memory table: Gated DeltaNet with one softmax layer in four.
MODEL_SHAPES = {"1B": dict(d_model=2048, num_layers=20, num_heads=16),
                "8B": dict(d_model=4096, num_layers=40, num_heads=32)}
# An imported checkpoint's shape: state-spaces/mamba2-2.7b as transformers' config.json
# describes it (2.7B parameters, 64 Mamba-2 layers, no MLP, tied embeddings).
IMPORTED_SHAPES = {"mamba2-2.7b": dict(hf_config=dict(
    model_type="mamba2", hidden_size=2560, num_hidden_layers=64, num_heads=80, head_dim=64,
    state_size=128, n_groups=1, conv_kernel=4, expand=2, vocab_size=50288,
    tie_word_embeddings=True, layer_norm_epsilon=1e-5, rms_norm=True, use_bias=False,
    use_conv_bias=True, hidden_act="silu", chunk_size=256, residual_in_fp32=True))}
DEVICE_BUDGETS_GB = {"gpu_80gb": 80.0, "tpu_v5e_16gb": 16.0}
GB = 1e9


def abstract_step(shape: dict, devices: int, seq_len: int, remat: str, *, scan: bool = True,
                  vocab: int = 32768, pattern: str = "DDDA", mixer: str | None = None,
                  fsdp: bool = True, rows_per_device: int = 1):
  """The trainer's train step compiled for ``devices`` data-parallel devices (FSDP) with
  ``rows_per_device`` sequences of ``seq_len`` tokens per device, from abstract shapes only
  (``nnx.eval_shape``: no parameter is allocated).

  Returns:
    ``(compiled, num_params, compile_s, compile_cpu_s)`` (wall and CPU seconds).
  """
  mesh = sharding.make_mesh({"data": devices, "seq": 1})
  ocfg = dict(lr=1e-3, warmup_steps=10, final_lr_ratio=0.1, weight_decay=0.1, b1=0.9,
              b2=0.95, eps=1e-8, clip_norm=1.0)

  def build():
    if "hf_config" in shape:  # an imported checkpoint's model, from its config.json alone
      from linear_attention.hub import loader
      model = loader.family_of(shape["hf_config"]).build(shape["hf_config"], rngs=nnx.Rngs(0))
      model.backbone.set_layout(remat=remat, scan_layers=scan)
    else:
      model = models.LanguageModel(vocab, shape["d_model"], shape["num_layers"],
                                   mixer=mixer, pattern=None if mixer else pattern,
                                   num_heads=shape["num_heads"], rngs=nnx.Rngs(0),
                                   remat=remat, scan_layers=scan)
    return model, optim.make_optimizer(model, ocfg, total_steps=100)

  graphdef, state = nnx.split(nnx.eval_shape(build))
  num_params = sum(x.size for x in jax.tree.leaves(nnx.state(nnx.eval_shape(build)[0],
                                                               nnx.Param)))
  state_sh = sharding.state_shardings(state, mesh, fsdp)
  abstract = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                          state, state_sh)
  batch_sh = sharding.batch_sharding(mesh)
  rows = devices * rows_per_device
  batch = {"inputs": jax.ShapeDtypeStruct((rows, seq_len), np.int32, sharding=batch_sh),
           "targets": jax.ShapeDtypeStruct((rows, seq_len), np.int32, sharding=batch_sh),
           "mask": jax.ShapeDtypeStruct((rows, seq_len), np.float32, sharding=batch_sh)}
  repl = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  train_fn, _ = trainer.make_steps(graphdef, "lm", state_sh, batch_sh, repl)
  t0, c0 = time.perf_counter(), time.process_time()
  with sharding.mesh_context(mesh):  # the model reads the mesh at trace time, as in the trainer
    compiled = train_fn.lower(abstract, batch).compile()
  # CPU seconds too: steadier than wall-clock ones on a shared host.
  return compiled, int(num_params), time.perf_counter() - t0, time.process_time() - c0


def memory_row(compiled) -> dict:
  """XLA's per-device memory plan of ``compiled``; ``peak`` counts the donated state once
  (temporaries + arguments + outputs - aliased outputs)."""
  ma = compiled.memory_analysis()
  mem = {"temp": int(ma.temp_size_in_bytes), "arguments": int(ma.argument_size_in_bytes),
         "outputs": int(ma.output_size_in_bytes), "alias": int(ma.alias_size_in_bytes)}
  mem["peak"] = mem["temp"] + mem["arguments"] + mem["outputs"] - mem["alias"]
  return mem


def main_model(argv=None) -> dict:
  """Part model: the memory table of 1B and 8B hybrids on 8 and 64 fake devices."""
  p = argparse.ArgumentParser(description="bench_scale part model: memory per device")
  p.add_argument("--part", default="model")
  p.add_argument("--sizes", default="1B,8B")
  p.add_argument("--devices", default="8,64")
  p.add_argument("--lengths", default="4096,32768")
  p.add_argument("--remat", default="none,block")
  p.add_argument("--cases", default="",
                 help="size/devices/T/remat;... in this order, instead of every combination "
                      "of the lists above (each compile takes minutes on a loaded CPU)")
  outputs.add_out(p, "bench_scale_model_cpu.json")
  args = p.parse_args(argv)
  sizes, devs = args.sizes.split(","), [int(x) for x in args.devices.split(",")]
  lengths, remats = [int(x) for x in args.lengths.split(",")], args.remat.split(",")
  out = {"benchmark": "bench_scale (model): train-step memory per device of a Gated DeltaNet "
                      "hybrid (one softmax layer in four), FSDP over fake CPU devices",
         "memory": "XLA memory_analysis of the compiled train step (forward, backward, AdamW) "
                   "per device, from abstract shapes; peak = temp + arguments + outputs - "
                   "alias (the donated state counted once). XLA on CPU plans it; a GPU or "
                   "TPU compiler fuses and schedules differently, so it is an estimate.",
         "model": {**{k: {**v, "pattern": "DDDA", "vocab": 32768, "mlp_ratio": 8 / 3,
                          "scan_layers": True} for k, v in MODEL_SHAPES.items()},
                   **{k: {**v["hf_config"], "scan_layers": True}
                      for k, v in IMPORTED_SHAPES.items()}},
         "batch": "one sequence per device (global batch = devices), float32",
         "budgets_gb": DEVICE_BUDGETS_GB,
         "device": f"{jax.device_count()} fake CPU devices on {os.cpu_count()} cores, "
                   f"jax {jax.__version__}",
         "rows": []}
  print(f"{'size':>4} {'dev':>4} {'T':>6} {'remat':>6} {'params':>7} {'temp GB':>8} "
        f"{'state GB':>9} {'peak GB':>8} {'80GB':>5} {'16GB':>5} {'compile s':>9}", flush=True)
  if args.cases:
    cases = [(c[0], int(c[1]), int(c[2]), c[3])
             for c in (x.split("/") for x in args.cases.split(";"))]
  else:
    cases = [(size, n, t, remat) for size in sizes for t in lengths for n in devs
             for remat in remats]
  if jax.device_count() < max(c[1] for c in cases):
    raise SystemExit(f"error: {max(c[1] for c in cases)} devices needed, got "
                     f"{jax.device_count()} (XLA_FLAGS={os.environ.get('XLA_FLAGS')!r}).")
  if os.path.exists(args.out):  # rows of earlier runs into the same file are kept
    import json
    with open(args.out) as f:
      key = lambda r: (r["size"], r["devices"], r["seq_len"], r["remat"])
      out["rows"] = [r for r in json.load(f)["rows"] if key(r) not in
                     {(c[0], c[1], c[2], c[3]) for c in cases}]
  for size, n, t, remat in cases:
    compiled, num_params, compile_s, _ = abstract_step({**MODEL_SHAPES, **IMPORTED_SHAPES}[size],
                                                       n, t, remat)
    mem = memory_row(compiled)
    del compiled
    row = {"size": size, "devices": n, "seq_len": t, "remat": remat,
           "num_params": num_params, "memory_bytes": mem, "compile_s": compile_s,
           "fits": {k: mem["peak"] <= v * GB for k, v in DEVICE_BUDGETS_GB.items()}}
    out["rows"].append(row)
    print(f"{size:>4} {n:>4} {t:>6} {remat:>6} {num_params / 1e9:>6.2f}B "
          f"{mem['temp'] / GB:>8.2f} {mem['arguments'] / GB:>9.2f} "
          f"{mem['peak'] / GB:>8.2f} {str(row['fits']['gpu_80gb']):>5} "
          f"{str(row['fits']['tpu_v5e_16gb']):>5} {compile_s:>9.1f}", flush=True)
    write_json(args.out, out)  # after every row: a long run keeps what it measured
  print(f"wrote {args.out}", flush=True)
  return out


def main_depth(argv=None) -> dict:
  """Part depth: compile time of the train step at two depths, unrolled and scanned."""
  p = argparse.ArgumentParser(description="bench_scale part depth: compile time vs depth")
  p.add_argument("--part", default="depth")
  p.add_argument("--depths", default="6,24,48")
  p.add_argument("--unrolled_depths", default="6,24",
                 help="the depths also compiled unrolled (the deepest unrolled step takes "
                      "minutes)")
  p.add_argument("--mixer", default="gated_deltanet")
  outputs.add_out(p, "bench_scale_depth_cpu.json")
  args = p.parse_args(argv)
  shape = dict(d_model=64, num_heads=2)
  out = {"benchmark": "bench_scale (depth): train-step compile time against depth (lowering "
                      "and XLA compile; wall and CPU seconds of this process)",
         "model": {**shape, "mixer": args.mixer, "vocab": 256, "seq_len": 512, "devices": 1},
         "device": f"CPU, {os.cpu_count()} cores, jax {jax.__version__}", "rows": []}
  for scan in (False, True):
    for depth in (int(x) for x in (args.depths if scan else args.unrolled_depths).split(",")
                  if x):
      _, _, compile_s, cpu_s = abstract_step({**shape, "num_layers": depth}, 1, 512, "none",
                                             scan=scan, vocab=256, mixer=args.mixer,
                                             fsdp=False)
      out["rows"].append({"scan_layers": scan, "num_layers": depth, "compile_s": compile_s,
                          "compile_cpu_s": cpu_s})
      print(f"scan_layers={scan!s:>5} layers {depth:>3}: compile {compile_s:6.1f} s wall, "
            f"{cpu_s:6.1f} s CPU", flush=True)
      write_json(args.out, out)
  print(f"wrote {args.out}", flush=True)
  return out


if __name__ == "__main__":
  main()
