"""The benchmark cases, declared: an op, its inputs, its keyword arguments, a FLOP count.

A case calls one function of ``linear_attention.ops`` (named, so that listing the cases
imports no JAX) on inputs declared by shape and initialisation::

    add("gla_chunk", "gated", "gla", [*QKV, log_sigmoid("BTHD", scale=1 / 16)],
        flops.chunk, LINEAR, form="chunk", chunk_size=CHUNK)

A new op's case is one such line, or a :func:`forms` call for every form of a matrix-state
variant. Shapes are strings of letters over :class:`Dims`: ``B`` batch, ``T`` the length,
``H`` heads, ``D`` key = value dim, ``C`` channels (scans, SSMs), ``N`` Mamba's state, ``M``
S4D's modes, ``K`` Linformer's rank, ``F`` Based's feature dim, ``L`` log-linear levels; a digit is a literal size. Keyword arguments are passed
as given, except an :class:`Input` (an array built like the positional ones; differentiated
unless ``grad=False``) and a :class:`Dim` (a size read from the run's :class:`Dims`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Mapping

from . import flops

LINEAR = (1024, 4096, 16384, 65536)  # linear-time forms
SHORT = (1024, 4096)  # recurrent forms of matrix-state variants; parallel forms
QUAD = (1024, 4096, 16384)  # naive softmax
SCAN_RECURRENT = (1024, 4096, 16384)  # token-by-token forms of the elementwise ops
SMOKE_T = 256


@dataclasses.dataclass(frozen=True)
class Dims:
  """The problem sizes of one run (``SMOKE_DIMS`` under ``--smoke``)."""
  B: int = 1  # attention cases: batch, heads, key = value dim
  H: int = 4
  D: int = 64
  C: int = 256  # scan / Mamba / RG-LRU / S4D channels
  N: int = 16  # Mamba's state per channel
  M: int = 64  # S4D modes: the S4D paper's default state size
  chunk: int = 64
  window: int = 256  # sliding window and Longformer
  globals: int = 16  # Longformer global tokens (the first ones, like [CLS] + a question)
  bb_block: int = 64
  bb_window: int = 3
  bb_random: int = 2
  bb_global: int = 2
  linformer_k: int = 256
  F: int = 16  # Based / ReBased feature dim of q and k
  L: int = 17  # log-linear levels: log2(64k) + 1, enough for every length measured

  def shape(self, spec: str, t: int) -> tuple[int, ...]:
    """``spec`` (``"BTHD"``) as a shape at length ``t``.

    Raises:
      ValueError: a letter that names no size.
    """
    sizes = {"B": self.B, "T": t, "H": self.H, "D": self.D, "C": self.C, "N": self.N,
             "M": self.M, "K": self.linformer_k, "F": self.F, "L": self.L}
    bad = [c for c in spec if c not in sizes and not c.isdigit()]
    if bad:
      raise ValueError(f"shape {spec!r}: unknown letters {bad}; expected digits or {list(sizes)}.")
    return tuple(int(c) if c.isdigit() else sizes[c] for c in spec)


DIMS = Dims()
SMOKE_DIMS = Dims(window=64, globals=4, bb_block=32, linformer_k=64)


@dataclasses.dataclass(frozen=True)
class Dim:
  """A keyword argument read from the run's :class:`Dims` (``Dim("window")``)."""
  name: str


CHUNK = Dim("chunk")


@dataclasses.dataclass(frozen=True)
class Input:
  """An array argument: ``make(key, shape, dims)`` fills ``shape`` (from the letters)."""
  shape: str
  make: Callable
  grad: bool = True  # differentiated in fwd+bwd (masks and PRNG keys are not)


# ---------------------------------------------------------------------- initialisations


def normal(shape: str, scale: float = 1.0) -> Input:
  def make(key, s, d):
    import jax
    return scale * jax.random.normal(key, s)
  return Input(shape, make)


def unit(shape: str) -> Input:
  """Normal rows scaled to unit L2 norm over the last axis (the delta rule's q and k)."""
  def make(key, s, d):
    import jax
    import jax.numpy as jnp
    x = jax.random.normal(key, s)
    return x / jnp.linalg.norm(x, axis=-1, keepdims=True)
  return Input(shape, make)


def uniform(shape: str, lo: float, hi: float) -> Input:
  def make(key, s, d):
    import jax
    return jax.random.uniform(key, s, minval=lo, maxval=hi)
  return Input(shape, make)


def log_uniform(shape: str, lo: float, hi: float) -> Input:
  """``exp`` of a uniform in ``[log lo, log hi]`` (Mamba's dt init)."""
  def make(key, s, d):
    import jax
    import jax.numpy as jnp
    return jnp.exp(jax.random.uniform(key, s, minval=math.log(lo), maxval=math.log(hi)))
  return Input(shape, make)


def log_sigmoid(shape: str, scale: float = 1.0) -> Input:
  """A gate in log space: ``scale * log_sigmoid(normal)``."""
  def make(key, s, d):
    import jax
    return scale * jax.nn.log_sigmoid(jax.random.normal(key, s))
  return Input(shape, make)


def sigmoid(shape: str, shift: float = 0.0) -> Input:
  def make(key, s, d):
    import jax
    return jax.nn.sigmoid(shift + jax.random.normal(key, s))
  return Input(shape, make)


def ones(shape: str) -> Input:
  def make(key, s, d):
    import jax.numpy as jnp
    return jnp.ones(s)
  return Input(shape, make)


def computed(shape: str, make: Callable, grad: bool = True) -> Input:
  """Any other input: ``make(key, shape, dims) -> array``."""
  return Input(shape, make, grad)


QKV = (normal("BTHD"),) * 3


# -------------------------------------------------------------------------------- cases


@dataclasses.dataclass(frozen=True)
class Case:
  """``ops.<op>(*inputs, **kwargs)`` timed at each length of ``seqs``."""
  op: str  # a function of linear_attention.ops
  inputs: tuple[Input, ...]
  flops: Callable[[int, Dims], float] | None  # forward FLOPs
  seqs: tuple[int, ...]  # default lengths
  group: str
  kwargs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  fwd_mem: Callable[[int, Dims], float] = flops.none  # estimated forward peak bytes
  fwdbwd_mem: Callable[[int, Dims], float] = flops.none  # estimated fwd+bwd peak bytes

  def build(self, t: int, dims: Dims, rng) -> tuple[Callable, tuple, tuple[int, ...]]:
    """``(fn, arrays, argnums)``: ``fn(*arrays)`` runs the op, differentiated in ``argnums``.

    Array keyword arguments come after the positional inputs in ``arrays``.
    """
    import jax
    from linear_attention import ops
    op = getattr(ops, self.op)
    kw_inputs = [(k, v) for k, v in self.kwargs.items() if isinstance(v, Input)]
    static = {k: getattr(dims, v.name) if isinstance(v, Dim) else v
              for k, v in self.kwargs.items() if not isinstance(v, Input)}
    specs = list(self.inputs) + [v for _, v in kw_inputs]
    arrays = tuple(x.make(jax.random.fold_in(rng, i), dims.shape(x.shape, t), dims)
                   for i, x in enumerate(specs))
    n = len(self.inputs)

    def fn(*a):
      return op(*a[:n], **static, **{k: x for (k, _), x in zip(kw_inputs, a[n:])})

    return fn, arrays, tuple(i for i, x in enumerate(specs) if x.grad)


CASES: dict[str, Case] = {}


def add(name: str, group: str, op: str, inputs, flop_count, seqs, *,
        fwd_mem=flops.none, fwdbwd_mem=flops.none, **kwargs) -> None:
  """Registers ``CASES[name]``: ``ops.<op>(*inputs, **kwargs)``; see the module docstring."""
  if name in CASES:
    raise ValueError(f"bench case {name!r} is declared twice.")
  CASES[name] = Case(op, tuple(inputs), flop_count, tuple(seqs), group, dict(kwargs),
                     fwd_mem, fwdbwd_mem)


def forms(variant: str, group: str, op: str, inputs, flop_counts, *,
          parallel_seqs=SHORT, parallel_mem=(flops.scores(2), flops.scores(4)), **kwargs):
  """``<variant>_{chunk,recurrent,parallel}`` of a matrix-state op.

  Args:
    flop_counts: ``(chunk, recurrent, parallel)`` FLOP functions.
    parallel_seqs, parallel_mem: the parallel form's lengths and (fwd, fwd+bwd) estimates.
  """
  f_chunk, f_rec, f_par = flop_counts
  add(f"{variant}_chunk", group, op, inputs, f_chunk, LINEAR, form="chunk", chunk_size=CHUNK,
      **kwargs)
  add(f"{variant}_recurrent", group, op, inputs, f_rec, SHORT, fwdbwd_mem=flops.states(3),
      form="recurrent", chunk_size=CHUNK, **kwargs)
  add(f"{variant}_parallel", group, op, inputs, f_par, parallel_seqs, fwd_mem=parallel_mem[0],
      fwdbwd_mem=parallel_mem[1], form="parallel", chunk_size=CHUNK, **kwargs)


# The foundation: the diagonal-decay engine (no, scalar and vector decay), ELU linear
# attention, exact softmax.
MATRIX = (flops.chunk, flops.recurrent, flops.quadratic)
DELTA = (flops.delta_chunk, flops.delta_recurrent, flops.delta_parallel)
ENGINE = "decay_linear_attention"
add("chunk", "foundation", ENGINE, QKV, flops.chunk, LINEAR, form="chunk", chunk_size=CHUNK)
add("recurrent", "foundation", ENGINE, QKV, flops.recurrent, SHORT, fwdbwd_mem=flops.states(3),
    form="recurrent", chunk_size=CHUNK)
add("parallel", "foundation", ENGINE, QKV, flops.quadratic, SHORT, fwd_mem=flops.scores(2),
    fwdbwd_mem=flops.scores(4), form="parallel", chunk_size=CHUNK)
add("linear_elu_chunk", "foundation", "linear_attention", QKV, flops.chunk, LINEAR,
    form="chunk", chunk_size=CHUNK)
add("chunk_scalar_decay", "foundation", ENGINE, [*QKV, uniform("BTH", -1, 0)], flops.chunk,
    LINEAR, form="chunk", chunk_size=CHUNK)
add("chunk_vector_decay", "foundation", ENGINE, [*QKV, uniform("BTHD", -1, 0)], flops.chunk,
    LINEAR, form="chunk", chunk_size=CHUNK)
add("naive_softmax", "foundation", "softmax_attention", QKV, flops.quadratic, QUAD,
    fwd_mem=flops.scores(2), fwdbwd_mem=flops.scores(4), causal=True, algorithm="naive")
add("blockwise_softmax", "foundation", "softmax_attention", QKV, flops.quadratic, LINEAR,
    causal=True, algorithm="blockwise")

# Gated and decayed variants, every form, with the gates their papers initialise.
PER_CHANNEL = (flops.channel_scores(2), flops.channel_scores(4))  # a [T, T, K] decay
forms("gla", "gated", "gla", [*QKV, log_sigmoid("BTHD", scale=1 / 16)], MATRIX,
      parallel_mem=PER_CHANNEL)  # log_sigmoid over GLA's normaliser 16
forms("retention", "gated", "retention", QKV, MATRIX)  # fixed multi-scale gammas
forms("hgrn2", "gated", "hgrn2", [QKV[0], log_sigmoid("BTHD"), QKV[2]], MATRIX,
      parallel_mem=PER_CHANNEL)


def _rwkv6_decay(key, s, d):
  import jax
  import jax.numpy as jnp
  return -jnp.exp(-5 + 4 * jax.random.uniform(key, s))  # -exp(w), w over [-5, -1] as at init


forms("rwkv6", "gated", "rwkv6", [*QKV, computed("BTHD", _rwkv6_decay), normal("HD", 0.1)],
      MATRIX, parallel_mem=PER_CHANNEL)
# Mamba-2: dt log-uniform in [1e-3, 0.1] and A in -[1, 16] (its inits), one group of B, C.
forms("ssd", "gated", "ssd", [normal("BTHD"), log_uniform("BTH", 1e-3, 0.1),
                              uniform("H", -16, -1), normal("BT1D"), normal("BT1D")], MATRIX)
# The delta rule: L2-normalised q and k, beta = sigmoid(noise).
DELTA_PARALLEL = dict(parallel_seqs=(1024,),  # cubic as written: over 3 minutes at 4k
                      parallel_mem=(flops.scores(3), flops.delta_parallel_bwd))
forms("deltanet", "gated", "deltanet", [unit("BTHD"), unit("BTHD"), normal("BTHD"),
                                        sigmoid("BTH")], DELTA, **DELTA_PARALLEL)
forms("gated_deltanet", "gated", "gated_deltanet",
      [unit("BTHD"), unit("BTHD"), normal("BTHD"), sigmoid("BTH"), log_sigmoid("BTH")], DELTA,
      **DELTA_PARALLEL)

# State-space ops on Mamba's problem size: C channels, N state.
SCAN = [sigmoid("BTCN", shift=3), normal("BTCN")]  # a in (0, 1), mostly close to 1
for _f in ("chunk", "associative", "recurrent"):
  add(f"scan_{_f}", "ssm", "linear_scan", SCAN, flops.scan,
      SCAN_RECURRENT if _f == "recurrent" else LINEAR, form=_f, chunk_size=CHUNK)


def _mamba_a(key, s, d):
  import jax.numpy as jnp
  return -jnp.broadcast_to(jnp.arange(1, s[1] + 1, dtype=jnp.float32), s)  # S4D-real


def _mamba_dt_bias(key, s, d):
  import jax
  import jax.numpy as jnp
  dt = jnp.exp(jax.random.uniform(key, s, minval=math.log(1e-3), maxval=math.log(1e-1)))
  return dt + jnp.log(-jnp.expm1(-dt))  # inverse softplus, as Mamba initialises it


MAMBA = [normal("BTC"), normal("BTC", 0.1), computed("CN", _mamba_a), normal("BTN"),
         normal("BTN"), ones("C"), normal("BTC")]
# "default" omits form=: whatever the op picks on this backend, measured as such.
add("mamba_default", "ssm", "selective_scan", MAMBA, flops.mamba, LINEAR,
    dt_bias=computed("C", _mamba_dt_bias), chunk_size=CHUNK)
for _f in ("chunk", "associative", "recurrent", "decay"):
  add(f"mamba_{_f}", "ssm", "selective_scan", MAMBA, flops.mamba,
      SCAN_RECURRENT if _f == "recurrent" else LINEAR, dt_bias=computed("C", _mamba_dt_bias),
      form=_f, chunk_size=CHUNK)


def _rglru_lambda(key, s, d):
  import jax
  import jax.numpy as jnp
  a = jax.random.uniform(key, s, minval=0.9, maxval=0.999)  # Griffin: sigmoid(Lambda) there
  return jnp.log(a) - jnp.log1p(-a)


RGLRU = [normal("BTC"), normal("BTC"), normal("BTC"), computed("C", _rglru_lambda)]
add("rglru_chunk", "ssm", "rg_lru", RGLRU, flops.rglru, LINEAR, form="chunk", chunk_size=CHUNK)
add("rglru_recurrent", "ssm", "rg_lru", RGLRU, flops.rglru, SCAN_RECURRENT, form="recurrent",
    chunk_size=CHUNK)


def _s4d_a(part):
  def make(key, s, d):
    from linear_attention import ops
    return ops.s4d_init("lin", s[1], s[0])[part]  # S4D-Lin
  return computed("CM", make)


def _s4d_c(key, s, d):
  import jax
  real, imag = jax.random.normal(key, (2, *s))
  return (real + 1j * imag) * 0.5 ** 0.5  # complex C, differentiated as it is


def _s4d_log_dt(key, s, d):
  from linear_attention import ops
  return ops.s4d_log_dt_init(key, s[0])  # dt in [1e-3, 0.1]


S4D = [normal("BTC"), _s4d_a(0), _s4d_a(1), ones("CM"), computed("CM", _s4d_c),
       computed("C", _s4d_log_dt), ones("C")]
add("s4d_fft", "ssm", "s4d", S4D, flops.s4d_fft, LINEAR, form="fft", chunk_size=CHUNK)
add("s4d_recurrent", "ssm", "s4d", S4D, flops.s4d_recurrent, SCAN_RECURRENT, form="recurrent",
    chunk_size=CHUNK)


# Sparse and low-rank attention: sliding window causal, the others bidirectional (as
# published). The global mask and the BigBird key are inputs, not constants: XLA would
# spend minutes folding the gathers they index.
def _first_globals(key, s, d):
  import jax.numpy as jnp
  return jnp.zeros(s, bool).at[:, :d.globals].set(True)


def _forget_preact(key, s, d):
  import jax
  return 3.0 + jax.random.normal(key, s)


def _softplus_normal(key, s, d):
  import jax
  return jax.nn.softplus(jax.random.normal(key, s))


def _prng_key(key, s, d):
  return key


def _linformer_projection(key, s, d):
  import jax
  return jax.random.normal(key, s) / math.sqrt(d.linformer_k)  # N(0, 1/k), as initialised


add("sliding_window", "sparse", "sliding_window_attention", QKV, flops.window, LINEAR,
    window=Dim("window"), causal=True)
add("longformer", "sparse", "longformer_attention",
    [*QKV, computed("BT", _first_globals, grad=False)], flops.longformer, LINEAR,
    window=Dim("window"), max_globals=Dim("globals"))
add("bigbird", "sparse", "bigbird_attention", QKV, flops.bigbird, LINEAR,
    key=computed("2", _prng_key, grad=False), block_size=Dim("bb_block"),
    num_window_blocks=Dim("bb_window"), num_random_blocks=Dim("bb_random"),
    num_global_blocks=Dim("bb_global"))
add("linformer", "sparse", "linformer_attention",
    [*QKV, computed("KT", _linformer_projection), computed("KT", _linformer_projection)],
    flops.linformer, LINEAR)

# The 2025 generation: chunk against recurrent forms. Based and ReBased: q and k projected
# to 16 features, then the Taylor / squared map (1 + 16 + 136 and 136 features, the
# products stored as upper triangles).
QK16 = (normal("BTHF", 0.5), normal("BTHF", 0.5))
DPLR_FLOPS = (flops.delta_chunk, flops.delta_recurrent)
NEW_VARIANTS = [
    ("based", "linear_attention", [*QK16, normal("BTHD")],
     (flops.feature_chunk(153), flops.feature_recurrent(153)), dict(feature_map="taylor")),
    ("rebased", "rebased_attention", [*QK16, normal("BTHD"), ones("F"), normal("F", 0.0)],
     (flops.feature_chunk(136), flops.feature_recurrent(136)), {}),
    # On the diagonal-plus-low-rank engine: RWKV-7 (decay as RWKV-6's, unit removal keys,
    # learning rates in (0, 1)), Kimi Delta Attention, Gated DeltaProduct with 2 steps a token.
    ("rwkv7", "rwkv7", [*QKV, computed("BTHD", _rwkv6_decay), unit("BTHD"), sigmoid("BTHD")],
     DPLR_FLOPS, {}),
    ("kda", "kda", [unit("BTHD"), unit("BTHD"), normal("BTHD"), sigmoid("BTH"),
                    log_sigmoid("BTHD", scale=1 / 16)], DPLR_FLOPS, {}),
    ("gated_deltaproduct", "gated_deltaproduct",
     [unit("BTHD"), unit("BTH2D"), normal("BTH2D"), sigmoid("BTH2"), log_sigmoid("BTH")],
     tuple(lambda t, d, f=f: 2 * f(t, d) for f in DPLR_FLOPS), {}),
    # mLSTM: input-gate pre-activations N(0, 1), forget gates around sigmoid(3).
    ("mlstm", "mlstm", [*QKV, normal("BTH"), computed("BTH", _forget_preact)],
     (flops.chunk, flops.recurrent), {}),
    # Log-linear Mamba-2 on SSD's inputs, level weights softplus(N(0, 1)) (about 0.7).
    ("loglinear_ssd", "loglinear_ssd",
     [normal("BTHD"), log_uniform("BTH", 1e-3, 0.1), uniform("H", -16, -1), normal("BT1D"),
      normal("BT1D"), computed("BTHL", _softplus_normal)],
     (lambda t, d: d.L * flops.chunk(t, d), lambda t, d: d.L * flops.recurrent(t, d)), {}),
]
for _name, _op, _inputs, (_f_chunk, _f_rec), _kw in NEW_VARIANTS:
  add(f"{_name}_chunk", "2025", _op, _inputs, _f_chunk, LINEAR, form="chunk", chunk_size=CHUNK,
      **_kw)
  add(f"{_name}_recurrent", "2025", _op, _inputs, _f_rec, SHORT, fwdbwd_mem=flops.states(3),
      form="recurrent", chunk_size=CHUNK, **_kw)
# The Fenwick reference form moves all L = 17 level states every token: 1k only.
CASES["loglinear_ssd_recurrent"] = dataclasses.replace(CASES["loglinear_ssd_recurrent"],
                                                       seqs=(1024,))
# Forgetting attention: softmax with forget gates around sigmoid(2) (its bias init).
for _alg, _seqs in (("naive", QUAD), ("blockwise", LINEAR)):
  add(f"forgetting_{_alg}", "2025", "forgetting_attention",
      [*QKV, log_sigmoid("BTH", scale=0.1)], flops.quadratic, _seqs, algorithm=_alg)

GROUPS = {g: [c for c, case in CASES.items() if case.group == g]
          for g in ("foundation", "gated", "ssm", "sparse", "2025")}
GROUPS["sparse"].append("naive_softmax")  # the baseline of the sparse methods
GROUPS["all"] = list(CASES)
