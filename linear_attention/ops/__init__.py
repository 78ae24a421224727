"""Pure attention functions: no parameters, no Flax, no global state.

Layout ``[batch, seq, heads, dim]``; states are float32 ``[batch, heads,
key_dim, value_dim]``; every causal op has ``parallel``, ``chunk`` and
``recurrent`` forms and a ``*_step`` function for decoding. The engines and
their variants take ``context=`` (:class:`SeqContext`) to run with the sequence
split over a mesh axis.

Every ``*_step`` follows one convention::

    out, new_state = foo_step(state, <foo's per-token arguments>, *, <foo's options>)

``state`` comes first (``cache`` for the KV caches of
:func:`sliding_window_step` and :func:`forgetting_attention_step`); the
arguments after it are the sequence op's leading positional arguments, in the
same order and with the same names, one token each (``[B, H, K]`` for
``[B, T, H, K]``); the keyword options are the sequence op's. This is
``lax.scan``'s ``f(carry, x)`` order::

    xs = tuple(jnp.moveaxis(x, 1, 0) for x in (q, k, v, log_g))  # [T, B, H, *]
    state, o = lax.scan(lambda s, x: gla_step(s, *x)[::-1], state, xs)  # (carry, y)

``state`` is what the sequence op takes as ``initial_state`` and returns with
``return_state=True``. A call in another order (the state after the inputs)
raises: a ValueError naming ``state`` (or ``cache``) where the state's rank
tells it apart from a token's input, else a ValueError naming the input
that shifted, or a TypeError where the state was passed by keyword.
"""

from linear_attention.engines.context import SeqContext
from linear_attention.ops.decay import decay_linear_attention, decay_linear_attention_step
from linear_attention.ops.feature_maps import FEATURE_MAPS, random_projection
from linear_attention.ops.linear import (linear_attention, linear_attention_step,
                                         rebased_attention, rebased_attention_step)
from linear_attention.ops.lowrank import linformer_attention
from linear_attention.ops.softmax import (ForgettingCache, forgetting_attention,
                                          forgetting_attention_step, init_forgetting_cache,
                                          softmax_attention)
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
from linear_attention.ops.conv import causal_conv1d, causal_conv1d_step
from linear_attention.ops.delta import (
    delta_rule,
    delta_rule_step,
    deltanet,
    deltanet_step,
    gated_deltanet,
    gated_deltanet_step,
)
from linear_attention.ops.dplr import (
    dplr_attention,
    dplr_attention_step,
    gated_deltaproduct,
    gated_deltaproduct_step,
    kda,
    kda_step,
    rwkv7,
    rwkv7_bonus,
    rwkv7_step,
)
from linear_attention.ops.gated import (
    gla,
    gla_step,
    hgrn2,
    hgrn2_step,
    retention,
    retention_step,
    retnet_gammas,
    rwkv6,
    rwkv6_step,
    ssd,
    ssd_step,
)
from linear_attention.ops.rglru import rg_lru, rg_lru_step
from linear_attention.ops.xlstm import init_mlstm_state, mlstm, mlstm_step
from linear_attention.ops.loglinear import (
    init_loglinear_state,
    loglinear_decay_attention,
    loglinear_decay_step,
)
from linear_attention.ops.loglinear_variants import (
    loglinear_gla,
    loglinear_gla_step,
    loglinear_ssd,
    loglinear_ssd_step,
)
from linear_attention.ops.scan import SCAN_FORMS, linear_scan
from linear_attention.ops.ssm import (
    s4d,
    s4d_discretize,
    s4d_init,
    s4d_kernel,
    s4d_log_dt_init,
    s4d_step,
    selective_scan,
    selective_scan_step,
)
