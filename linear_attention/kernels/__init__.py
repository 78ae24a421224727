"""Pallas kernels (GPU via Triton, TPU via Mosaic); each has a plain-JAX twin in ``ops/``.

On CPU every kernel runs in interpret mode (``interpret=True`` for the GPU
kernels, ``pltpu.InterpretParams()`` for TPU): exact, slow, for tests.
"""

# Chunked diagonal-decay linear attention and the linear scan.
from linear_attention.kernels.chunk_decay import BlockSizes, chunk_decay_attention
from linear_attention.kernels.scan import ScanBlockSizes, linear_scan

# Flash attention (exact softmax, FlashAttention-2).
from linear_attention.kernels.flash_attention import BlockSizes as FlashBlockSizes
from linear_attention.kernels.flash_attention import flash_attention
