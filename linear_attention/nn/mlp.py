"""Feed-forward layers: the gated MLP (SwiGLU, GeGLU) and the plain one (relu^2, GELU).

``MLP(d_model, hidden, activation=..., gated=...)`` maps ``[..., D] -> [..., D]``:

- ``gated=True``: ``W_down(act(W_gate x) * W_up x)``; ``W_gate`` and ``W_up`` are one
  ``[D, 2 * hidden]`` matmul (``up``; gate columns first).
- ``gated=False``: ``W_down(act(W_up x))`` (Nemotron-H's relu^2 MLP).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from linear_attention.nn import modules
from linear_attention.nn.mixer import check_positive

Array = jax.Array

ACTIVATIONS: dict[str, Callable[[Array], Array]] = {
    "silu": jax.nn.silu,
    "gelu": lambda x: jax.nn.gelu(x, approximate=False),
    "gelu_tanh": lambda x: jax.nn.gelu(x, approximate=True),
    "relu": jax.nn.relu,
    "relu2": lambda x: jnp.square(jax.nn.relu(x)),
    "sigmoid": jax.nn.sigmoid,
}


def get_activation(name: str) -> Callable[[Array], Array]:
  """The activation function called ``name`` (a key of :data:`ACTIVATIONS`)."""
  if name not in ACTIVATIONS:
    raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {name!r}.")
  return ACTIVATIONS[name]


class MLP(nnx.Module):
  """Feed-forward layer of hidden width ``hidden`` (module docstring)."""

  def __init__(self, d_model: int, hidden: int, *, activation: str = "silu", gated: bool = True,
               use_bias: bool = False, rngs: nnx.Rngs, dtype=None, param_dtype=jnp.float32):
    check_positive("d_model", d_model)
    check_positive("hidden", hidden)
    get_activation(activation)
    self.hidden, self.activation, self.gated = hidden, activation, bool(gated)
    kw = dict(rngs=rngs, dtype=dtype, param_dtype=param_dtype, use_bias=use_bias)
    self.up = modules.dense(d_model, (2 if gated else 1) * hidden, **kw)
    self.down = modules.dense(hidden, d_model, **kw)

  def __call__(self, x: Array) -> Array:
    """``[..., D] -> [..., D]``."""
    act = ACTIVATIONS[self.activation]
    h = self.up(x)
    h = act(h[..., :self.hidden]) * h[..., self.hidden:] if self.gated else act(h)
    return self.down(h)

