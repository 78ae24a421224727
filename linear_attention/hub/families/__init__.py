"""One module per transformers model family; importing this package registers them all.

A new family is a module here that calls ``core.register(core.Family(...))`` at import, and
one line below (see ``linear_attention.hub``'s docstring).
"""

from linear_attention.hub.families import mamba  # noqa: F401
from linear_attention.hub.families import mamba2  # noqa: F401
from linear_attention.hub.families import nemotron_h  # noqa: F401
from linear_attention.hub.families import granitemoehybrid  # noqa: F401
from linear_attention.hub.families import bamba  # noqa: F401
from linear_attention.hub.families import qwen3_next  # noqa: F401
from linear_attention.hub.families import olmo_hybrid  # noqa: F401
from linear_attention.hub.families import kimi_linear  # noqa: F401
from linear_attention.hub.families import xlstm  # noqa: F401
from linear_attention.hub.families import recurrent_gemma  # noqa: F401
from linear_attention.hub.families import lfm2  # noqa: F401
from linear_attention.hub.families import minimax  # noqa: F401
from linear_attention.hub.families import jamba  # noqa: F401
