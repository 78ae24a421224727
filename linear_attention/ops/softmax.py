"""Exact softmax attention (:mod:`linear_attention.engines.softmax.engine`), its block
machinery shared with the sparse and low-rank ops, and Forgetting Attention
(:mod:`.forgetting`), re-exported under this module's old names."""

from linear_attention.engines.softmax.engine import (  # noqa: F401
    IMPLEMENTATIONS, ALGORITHMS, NAIVE_MAX_LEN, MASK_VALUE, PAD_KEY_SEG, PAD_QUERY_SEG,
    BlockMask, flash_attention_stats, dense_attention_stats, merge_attention,
    segment_or_zeros, positions, self_attention_stats, softmax_attention,
    check_implementation, resolve_implementation, pallas_attention, forget_cumsum)
from linear_attention.ops.forgetting import (  # noqa: F401
    ForgettingCache, forgetting_attention, forgetting_attention_step, forgetting_step_bias,
    init_forgetting_cache)
