"""The chunk forms' shared block and segment helpers (linear_attention.common)."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from linear_attention import common
from linear_attention.engines import chunks


def test_chunk_segments_against_hand_written_masks():
  """Two rows, chunks of 3 over 7 tokens (padded to 9 by repeating the last id)."""
  seg = jnp.asarray([[0, 0, 1, 1, 1, 1, 2], [0, 0, 0, 0, 0, 0, 0]], jnp.int32)
  segp, sees, to_end, carries = chunks.chunk_segments(seg, 3)
  np.testing.assert_array_equal(segp[:, 0], [[[0, 0, 1], [1, 1, 1], [2, 2, 2]],
                                             [[0, 0, 0], [0, 0, 0], [0, 0, 0]]])
  # Row 0: chunk 0 enters in segment 0, chunk 1 in segment 1, chunk 2 after segment 1.
  np.testing.assert_array_equal(sees[0, 0, ..., 0], [[1, 1, 0], [1, 1, 1], [0, 0, 0]])
  np.testing.assert_array_equal(to_end[0, 0, ..., 0], [[0, 0, 1], [1, 1, 1], [1, 1, 1]])
  np.testing.assert_array_equal(carries[:, 0], [[0, 1, 0], [1, 1, 1]])
  # The token before the first: a different segment cuts the first chunk off the state.
  _, sees, _, carries = chunks.chunk_segments(seg, 3, seg_prev=jnp.asarray([5, 0]))
  np.testing.assert_array_equal(sees[:, 0, 0, :, 0], [[0, 0, 0], [1, 1, 1]])
  np.testing.assert_array_equal(carries[:, 0, 0], [0, 1])


def test_block_chunks_by_engine():
  assert chunks.block_chunks("decay") == 16 and chunks.block_chunks("dplr") == 64
  with pytest.raises(ValueError, match=r"engine.*'delta'"):
    chunks.block_chunks("delta")
