"""The elementwise linear-recurrence engine's public entry point
(:mod:`linear_attention.engines.scan.engine`): ``h_t = a_t * h_{t-1} + b_t``. RG-LRU, S4D
and Mamba-1's selective scan run on it (:mod:`.rglru`, :mod:`.ssm`)."""

from linear_attention.engines.scan.engine import (  # noqa: F401
    SCAN_FORMS, linear_scan)
