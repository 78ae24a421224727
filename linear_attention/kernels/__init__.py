"""Pallas kernels (GPU via Triton, TPU via Mosaic); each has a plain-JAX twin in ``ops/``.

Layout: ``dispatch.py`` (which implementation runs where: ``implementation=``,
``platform=``, ``interpret=``, compiler params), and one package or module per
kernel, split per platform as ``{__init__.py (API + custom_vjp), blocks.py
(tiling and the shared block logic), triton.py (GPU), mosaic_tpu.py (TPU)}``:
``chunk_decay/`` (the diagonal-decay engine), ``chunk_delta/`` (the delta
rule: DeltaNet and Gated DeltaNet), ``chunk_dplr.py`` (the DPLR engine: KDA,
RWKV-7, Gated DeltaProduct; chunk_delta's kernels with the DPLR algebra),
``flash_attention/`` (exact softmax, FlashAttention-2) and ``scan.py`` (the elementwise linear scan; one
small file). ``aot.py`` compiles every kernel for GPU and TPU targets without
a device.

On CPU every kernel runs in interpret mode by default (``interpret=True`` for
the GPU kernels, ``pltpu.InterpretParams()`` for TPU): exact, slow, for tests.
"""

from linear_attention.kernels import dispatch
from linear_attention.kernels.chunk_decay import ChunkDecayBlockSizes, chunk_decay_attention
from linear_attention.kernels.chunk_delta import ChunkDeltaBlockSizes, chunk_delta_attention
from linear_attention.kernels.chunk_dplr import chunk_dplr_attention
from linear_attention.kernels.flash_attention import FlashBlockSizes
from linear_attention.kernels.scan import ScanBlockSizes, linear_scan

# ``kernels.flash_attention`` is the subpackage (its function is
# ``kernels.flash_attention.flash_attention``): re-exporting the function under
# the subpackage's name would hide the module.
