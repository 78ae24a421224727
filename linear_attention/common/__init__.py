"""The package's vocabulary: argument checks (:mod:`.checks`), sequence helpers
(:mod:`.sequence`) and form pairing (:mod:`.forms`). Imports nothing else of the package.

Shape notation used in docstrings across ``ops/`` and ``engines/``:
B batch, T sequence length, H heads, K key (feature) dimension, V value
dimension, C chunk size. Every check raises a ``ValueError`` that names the
argument, what was expected and what was received.
"""

from linear_attention.common.checks import (  # noqa: F401
    FORMS, check_rank, check_shape, check_float, check_same_dtype, check_choice,
    check_positive_int, check_qkv, check_seq_len, check_attention, check_step_qkv,
    STATE_DTYPES, check_step_state, check_step_state_first, concrete, check_range,
    check_log_decay, log_decay_checks, check_segment_ids, check_sequence_args,
    check_state_parts, check_state, resolve_scale, check_beta, check_value_groups)
from linear_attention.common.sequence import (  # noqa: F401
    log_zero, floor_log_decay, pad_axis, pad_segment_ids, segment_starts, segment_index,
    zero_state, group_heads, ungroup_heads, REMAT_CHUNK, remat_scan, acc_dtype)
from linear_attention.common.forms import (  # noqa: F401
    resolve_auto_form, with_gradient_of, in_forms, forward_mode_needs_a_form,
    one_cpu_thread)
