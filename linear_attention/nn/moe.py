"""Mixture of experts: a top-k router over gated-MLP experts, plus optional shared experts.

Routing of one token ``x [D]`` over ``E`` experts (logits ``l = x W_r`` in float32):

- ``score="softmax"``: ``s = softmax(l)`` (Qwen3-Next, Granite-4.0-H, Mixtral);
  ``score="sigmoid"``: ``s = sigmoid(l)`` (DeepSeek-V3, Kimi Linear).
- The experts are chosen by the top ``top_k`` of ``s + b``, where ``b`` is the
  load-balancing bias (``score_bias=True``; a :class:`RouterBias`, not a trained ``Param``),
  within the ``topk_groups`` best of ``num_groups`` expert groups (a group's score is the
  sum of its two best ``s + b``; one group: no restriction).
- Their weights are ``s`` of the chosen experts, divided by their sum with
  ``renormalize=True``, times ``routed_scale``.

The output is ``sum_i w_i E_i(x)`` (each expert a SwiGLU of width ``hidden``), plus the
shared expert ``S(x)`` (width ``shared_hidden``; times ``sigmoid(x W_s)`` with
``shared_gate=True``, as Qwen3-Next). The experts run as grouped matmuls
(:func:`grouped_matmul`) over the tokens sorted by expert, so the cost is ``top_k``
experts per token, not ``E``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from linear_attention.nn import mlp as mlp_lib
from linear_attention.nn import modules
from linear_attention.nn.mixer import check_positive

Array = jax.Array

SCORES = ("softmax", "sigmoid")


def _block_rows(rows: int, groups: int) -> int:
  """Rows per block of :func:`grouped_matmul`: about the mean group size, a power of two
  in [8, 128] (small blocks waste little padding at decode, large ones run at matmul speed)."""
  return min(128, max(8, 1 << max(0, rows // groups - 1).bit_length()))


def _blocks_times(xp: Array, w: Array, block_group: Array, used: Array) -> Array:
  """``xp [nb, b, D]``, each block times ``w[block_group]``; unused blocks are zeros
  (float32 ``[nb, b, F]``)."""
  def one(a):
    xb, g, u = a
    return jax.lax.cond(
        u, lambda: jnp.dot(xb, jnp.asarray(w)[g], preferred_element_type=jnp.float32),
        lambda: jnp.zeros((xb.shape[0], w.shape[-1]), jnp.float32))
  return jax.lax.map(one, (xp, block_group, used))


@jax.custom_vjp
def _padded_grouped_matmul(xp, w, block_group, used):
  return _blocks_times(xp, w, block_group, used)


def _padded_fwd(xp, w, block_group, used):
  return _blocks_times(xp, w, block_group, used), (xp, w, block_group, used)


def _padded_bwd(res, dy):
  xp, w, block_group, used = res
  dxp = _blocks_times(dy.astype(w.dtype), jnp.swapaxes(w, 1, 2), block_group, used)

  def add(dw, a):  # in place: one expert's slice per block, not a full [E, D, F] add
    xb, dyb, g, u = a
    upd = jax.lax.cond(u, lambda: jnp.dot(xb.T.astype(jnp.float32), dyb),
                       lambda: jnp.zeros(w.shape[1:], jnp.float32))
    return dw.at[g].add(upd), None

  dw, _ = jax.lax.scan(add, jnp.zeros(w.shape, jnp.float32), (xp, dy, block_group, used))
  return dxp.astype(xp.dtype), dw.astype(w.dtype), None, None


_padded_grouped_matmul.defvjp(_padded_fwd, _padded_bwd)


def grouped_matmul(x: Array, w: Array, group_sizes: Array, *, block: int | None = None) -> Array:
  """Rows of ``x [M, D]`` sorted by group, group ``g``'s rows times ``w[g]`` (``w
  [E, D, F]``; ``group_sizes [E]`` int, summing to ``M``) -> float32 ``[M, F]``.

  The values of ``jax.lax.ragged_dot(x, w, group_sizes, preferred_element_type=float32)``,
  which it is on TPU. On CPU and GPU, XLA (jaxlib 0.10) lowers ``ragged_dot`` to a dense
  product with every group, ``E`` times the work; there each group's rows are padded to a
  multiple of ``block`` rows and every block is multiplied by its group's matrix alone,
  blocks past the last row skipped (``block=None``: :func:`_block_rows`).

  Examples:
    >>> x = jnp.ones((5, 4)); w = jnp.stack([jnp.eye(4), 2 * jnp.eye(4)])
    >>> grouped_matmul(x, w, jnp.array([2, 3]))[:, 0].tolist()
    [1.0, 1.0, 2.0, 2.0, 2.0]
  """
  x, w, group_sizes = jnp.asarray(x), jnp.asarray(w), jnp.asarray(group_sizes)
  m, d = x.shape
  if w.ndim != 3 or w.shape[1] != d:
    raise ValueError(f"w must have shape [E, D={d}, F], got {tuple(w.shape)}.")
  e, f = w.shape[0], w.shape[-1]
  if group_sizes.shape != (e,):
    raise ValueError(f"group_sizes must have shape ({e},), got {tuple(group_sizes.shape)}.")
  if jax.default_backend() == "tpu":
    return jax.lax.ragged_dot(x, w, group_sizes, preferred_element_type=jnp.float32)
  b = block or _block_rows(m, e)
  padded = (group_sizes + b - 1) // b * b
  ends = jnp.cumsum(padded)
  row_group = jnp.repeat(jnp.arange(e), group_sizes, total_repeat_length=m)
  rank = jnp.arange(m) - (jnp.cumsum(group_sizes) - group_sizes)[row_group]
  pos = (ends - padded)[row_group] + rank  # each row's place in the padded layout
  blocks = -(-(m + e * (b - 1)) // b)  # the most blocks any split of M rows can need
  xp = jnp.zeros((blocks * b, d), x.dtype).at[pos].set(x).reshape(blocks, b, d)
  start = jnp.arange(blocks) * b
  block_group = jnp.minimum(jnp.searchsorted(ends, start, side="right"), e - 1)
  y = _padded_grouped_matmul(xp, w, block_group, start < ends[-1])
  return y.reshape(blocks * b, f)[pos]


class RouterBias(nnx.Variable):
  """The router's load-balancing bias ``[E]``: it changes which experts are chosen, never
  their weights, so it has no gradient; optimisers built with ``wrt=nnx.Param`` leave it
  alone (DeepSeek-V3 updates it from expert loads, outside the optimiser)."""


def route(logits: Array, top_k: int, *, score: str = "softmax", bias: Array | None = None,
          renormalize: bool = True, routed_scale: float = 1.0, num_groups: int = 1,
          topk_groups: int = 1) -> tuple[Array, Array]:
  """Top-k routing of router logits ``[N, E]`` (module docstring).

  Returns:
    ``(weights [N, top_k] float32, experts [N, top_k] int32)``.
  """
  if score not in SCORES:
    raise ValueError(f"score must be one of {SCORES}, got {score!r}.")
  n, e = logits.shape
  logits = logits.astype(jnp.float32)
  s = jax.nn.softmax(logits, axis=-1) if score == "softmax" else jax.nn.sigmoid(logits)
  choice = s if bias is None else s + bias.astype(jnp.float32)
  if num_groups > 1:
    grouped = choice.reshape(n, num_groups, e // num_groups)
    group_score = jnp.sum(jax.lax.top_k(grouped, min(2, e // num_groups))[0], axis=-1)
    _, best = jax.lax.top_k(group_score, topk_groups)  # [N, topk_groups]
    keep = jnp.any(jnp.arange(num_groups)[None, :, None] == best[:, None, :], axis=-1)
    choice = jnp.where(jnp.repeat(keep, e // num_groups, axis=-1), choice, -jnp.inf)
  _, experts = jax.lax.top_k(choice, top_k)
  w = jnp.take_along_axis(s, experts, axis=-1)
  if renormalize:
    w = w / (jnp.sum(w, axis=-1, keepdims=True) + 1e-20)
  return w * routed_scale, experts.astype(jnp.int32)


class MoE(nnx.Module):
  """Top-k mixture of SwiGLU experts with optional shared experts (module docstring).

  Args:
    d_model: width ``D``.
    num_experts: ``E``.
    top_k: experts per token.
    hidden: each routed expert's hidden width.
    score, renormalize, routed_scale, num_groups, topk_groups: the routing (:func:`route`).
    score_bias: keep a load-balancing bias ``[E]`` (a :class:`RouterBias`, zeros at init).
    shared_hidden: hidden width of the shared expert, 0 for none.
    shared_gate: gate the shared expert by ``sigmoid(x W_s)`` (``W_s [D, 1]``).
    activation: the experts' gate activation (:data:`~linear_attention.nn.mlp.ACTIVATIONS`).

  Parameters: ``router [D, E]`` (float32), ``gate_up [E, D, 2 * hidden]`` (gate columns
  first), ``down [E, hidden, D]``, ``shared`` (a :class:`~linear_attention.nn.mlp.MLP`),
  ``shared_gate`` (``nnx.Linear`` ``D -> 1``).
  """

  def __init__(self, d_model: int, num_experts: int, top_k: int, hidden: int, *,
               score: str = "softmax", renormalize: bool = True, routed_scale: float = 1.0,
               score_bias: bool = False, num_groups: int = 1, topk_groups: int = 1,
               shared_hidden: int = 0, shared_gate: bool = False, activation: str = "silu",
               rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    for name, value in (("d_model", d_model), ("num_experts", num_experts), ("top_k", top_k),
                        ("hidden", hidden), ("num_groups", num_groups),
                        ("topk_groups", topk_groups)):
      check_positive(name, value)
    if top_k > num_experts:
      raise ValueError(f"top_k must be <= num_experts={num_experts}, got {top_k}.")
    if num_experts % num_groups or topk_groups > num_groups:
      raise ValueError(f"num_groups={num_groups} must divide num_experts={num_experts} and be "
                       f">= topk_groups={topk_groups}.")
    if num_groups > 1 and top_k > topk_groups * (num_experts // num_groups):
      raise ValueError(f"top_k={top_k} must be <= topk_groups * experts per group = "
                       f"{topk_groups * (num_experts // num_groups)}.")
    if score not in SCORES:
      raise ValueError(f"score must be one of {SCORES}, got {score!r}.")
    if isinstance(shared_hidden, bool) or not isinstance(shared_hidden, int) or shared_hidden < 0:
      raise ValueError(f"shared_hidden must be an int >= 0, got {shared_hidden!r}.")
    if shared_gate and not shared_hidden:
      raise ValueError("shared_gate=True needs a shared expert (shared_hidden > 0).")
    mlp_lib.get_activation(activation)
    self.d_model, self.num_experts, self.top_k, self.hidden = d_model, num_experts, top_k, hidden
    self.score, self.renormalize, self.routed_scale = score, bool(renormalize), float(routed_scale)
    self.num_groups, self.topk_groups, self.activation = num_groups, topk_groups, activation
    self.dtype = dtype
    init = nnx.initializers.lecun_normal()
    self.router = nnx.Param(init(rngs.params(), (d_model, num_experts), jnp.float32))
    self.score_bias = (RouterBias(jnp.zeros((num_experts,), jnp.float32)) if score_bias
                       else None)
    expert_init = nnx.initializers.variance_scaling(1.0, "fan_in", "truncated_normal",
                                                    in_axis=-2, out_axis=-1, batch_axis=(0,))
    self.gate_up = nnx.Param(expert_init(rngs.params(), (num_experts, d_model, 2 * hidden),
                                         param_dtype))
    self.down = nnx.Param(expert_init(rngs.params(), (num_experts, hidden, d_model), param_dtype))
    self.shared = (mlp_lib.MLP(d_model, shared_hidden, activation=activation, rngs=rngs,
                               dtype=dtype, param_dtype=param_dtype) if shared_hidden else None)
    self.shared_gate = (modules.dense(d_model, 1, rngs=rngs, dtype=dtype,
                                      param_dtype=param_dtype) if shared_gate else None)

  def router_logits(self, x: Array) -> Array:
    """``x [..., D]`` -> float32 logits ``[..., E]``."""
    return jnp.einsum("...d,de->...e", x.astype(jnp.float32), self.router[...].astype(jnp.float32))

  def __call__(self, x: Array) -> Array:
    """``x [..., D]`` -> ``[..., D]`` in the dtype of ``x`` (the layer's ``dtype`` if set)."""
    if x.shape[-1] != self.d_model:
      raise ValueError(f"x must have last axis d_model={self.d_model}, got shape {tuple(x.shape)}.")
    dt = x.dtype if self.dtype is None else self.dtype
    lead = x.shape[:-1]
    x2 = x.reshape(-1, self.d_model).astype(dt)
    bias = None if self.score_bias is None else self.score_bias[...]
    w, experts = route(self.router_logits(x2), self.top_k, score=self.score, bias=bias,
                       renormalize=self.renormalize, routed_scale=self.routed_scale,
                       num_groups=self.num_groups, topk_groups=self.topk_groups)
    k = self.top_k
    flat = experts.reshape(-1)  # [N * k]
    order = jnp.argsort(flat, stable=True)
    token = order // k
    sizes = jnp.bincount(flat, length=self.num_experts).astype(jnp.int32)
    act = mlp_lib.ACTIVATIONS[self.activation]
    f32 = jnp.float32  # accumulate in float32, whatever the compute dtype
    h = grouped_matmul(x2[token], self.gate_up[...].astype(dt), sizes)
    h = (act(h[:, :self.hidden]) * h[:, self.hidden:]).astype(dt)
    y = grouped_matmul(h, self.down[...].astype(dt), sizes)
    y = y * w.reshape(-1)[order][:, None]
    out = jnp.zeros((x2.shape[0], self.d_model), jnp.float32).at[token].add(y)
    if self.shared is not None:
      s = self.shared(x2).astype(jnp.float32)
      if self.shared_gate is not None:
        s = s * jax.nn.sigmoid(self.shared_gate(x2).astype(jnp.float32))
      out = out + s
    return out.astype(dt).reshape(lead + (self.d_model,))
