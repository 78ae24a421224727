"""The trainer with the sequence sharded (``config.mesh.seq=2``) trains as with
``mesh.seq=1``: GLA with ``short_conv=3`` (the decay engine and the halo convolution), Gated
DeltaNet (the delta-rule engine) and Mamba (the scan engine, its own convolution).

For each, 4 steps (two per fused dispatch) of the fake copy task, ``T = 16`` (8 tokens
a device), with ``mesh.seq=2`` against ``mesh.seq=1``: the logged losses and the validation
loss within ``rtol=2e-5``, the final parameters within ``rtol=2e-4, atol=2e-6`` (the
tolerances of ``test_context_parallel.py``: float32 sums in another order, through 4 AdamW
steps). One subprocess with 2 fake CPU devices.
"""

from __future__ import annotations

import textwrap

from tests.helpers import run_on_fake_devices

SCRIPT = textwrap.dedent("""
    import time
    import jax, numpy as np
    from linear_attention import train
    from tests.train.fake_data import FakeDataset, fake_config
    assert jax.device_count() == 2, jax.devices()
    t0 = time.time()

    def run(mixer, seq):
      cfg = fake_config(mixer=mixer, steps=4, eval_every=0, log_every=2, checkpoint_every=0,
                        steps_per_dispatch=2)
      cfg.model.mixer_kwargs = {mixer: {"chunk_size": 4}}
      cfg.model.short_conv = 3 if mixer == "gla" else 0
      cfg.mesh.seq = seq
      wd = f"{WORKDIR}/{mixer}-seq{seq}"
      final = train.train_and_evaluate(cfg, wd, dataset=FakeDataset(), verbose=False)
      losses = [r["loss"] for r in train.metrics.read_metrics(wd, "train")]
      leaves = [np.asarray(x) for x in jax.tree.leaves(train.load_checkpoint(wd))]
      return losses, final["validation_loss"], leaves

    for mixer in ("gla", "gated_deltanet", "mamba"):
      one, two = run(mixer, 1), run(mixer, 2)
      assert len(one[0]) == 2, one[0]
      np.testing.assert_allclose(two[0], one[0], rtol=2e-5, err_msg=mixer)
      np.testing.assert_allclose(two[1], one[1], rtol=2e-5, err_msg=mixer)
      for a, b in zip(two[2], one[2]):
        np.testing.assert_allclose(a, b, rtol=2e-4, atol=2e-6, err_msg=mixer)
      print(f"{mixer}: losses {one[0]} / {two[0]} ({time.time() - t0:.1f}s)", flush=True)
    print("TRAINER OK", flush=True)
""")


def test_trainer_seq2_matches_seq1(tmp_path):
  run_on_fake_devices(SCRIPT, "TRAINER OK", devices=2, workdir=tmp_path)
