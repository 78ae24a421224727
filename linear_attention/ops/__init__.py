"""Pure attention functions: no parameters, no Flax, no global state.

Layout ``[batch, seq, heads, dim]``; states are float32 ``[batch, heads,
key_dim, value_dim]``; every causal op has ``parallel``, ``chunk`` and
``recurrent`` forms and a ``*_step`` function for decoding.
"""

from linear_attention.ops.decay import decay_linear_attention, decay_linear_attention_step
from linear_attention.ops.feature_maps import FEATURE_MAPS, random_projection
from linear_attention.ops.linear import linear_attention, linear_attention_step
from linear_attention.ops.lowrank import linformer_attention
from linear_attention.ops.softmax import softmax_attention
from linear_attention.ops.sparse import (
    BigBirdPattern,
    SlidingWindowCache,
    bigbird_attention,
    bigbird_pattern,
    init_sliding_window_cache,
    longformer_attention,
    sliding_window_attention,
    sliding_window_step,
)
