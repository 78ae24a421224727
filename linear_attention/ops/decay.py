"""The diagonal-decay linear-attention engine's public entry points
(:mod:`linear_attention.engines.decay.engine`): linear attention with a state decayed by
``exp(log_decay_t)`` per head or per key channel, ``S_t = exp(g_t) S_{t-1} + k_t v_t^T``.
The variants on it (GLA, RetNet, Mamba-2, HGRN2, RWKV-6) are in :mod:`.gated`."""

from linear_attention.engines.decay.engine import (  # noqa: F401
    decay_linear_attention, decay_linear_attention_step)
