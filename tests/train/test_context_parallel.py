"""Context parallelism (``config.mesh.seq``): the sequence sharded over 4 fake CPU devices
gives the unsharded model's loss and gradients, and the trainer's steps.

The checks that need 4 devices run in one subprocess (``XLA_FLAGS=
--xla_force_host_platform_device_count=4``), bounded by a timeout:

- a tiny language model with one block of several context-parallel mixers (a hybrid
  pattern; every one of them is checked in ``tests/nn/test_context_parallel_model.py``) and
  ``short_conv=3`` (Mamba-2 has its own, width 4): loss and parameter gradients with
  ``("data", "seq")`` meshes ``(1, 4)`` and ``(2, 2)`` against the same model without a
  mesh. Tolerance: float32 reduction order, ``rtol=atol=2e-4`` on the loss and on every
  gradient leaf (the sharded path sums the per-device states in another order);
- packed segments through the halo convolution and all-gather attention (boundaries
  inside a slice and on a slice edge), outputs and gradients, same tolerance (the
  engine's segments are covered by the conformance suite's context check);
- (the trainer's ``mesh.seq=2`` against ``mesh.seq=1`` is in
  ``test_context_parallel_trainer.py``);
- the errors: an unsupported mixer, ``seq`` not dividing ``T`` or the device count.

The model's three compilations run two at a time in threads (XLA compiles outside the
GIL), for the 2-core CI machine.
"""

from __future__ import annotations

import textwrap

import jax
import pytest

from linear_attention.train import sharding
from tests.helpers import run_on_fake_devices

SCRIPT = textwrap.dedent("""
    import time
    from concurrent.futures import ThreadPoolExecutor
    import jax, jax.numpy as jnp, numpy as np, optax
    from flax import nnx
    from linear_attention import models, train
    from linear_attention.nn import registry
    from tests.train.fake_data import FakeDataset, fake_config
    assert jax.device_count() == 4, jax.devices()
    t0 = time.time()
    TOL = dict(rtol=2e-4, atol=2e-4)

    # ---- one block of several context-parallel mixers, short convolutions on
    names = ["softmax", "linear", "performer", "retnet", "gla", "hgrn2", "mamba2"]
    kwargs = {}
    for n in names:
      kwargs[n] = dict(registry.spec(n).tiny)
      if "chunk_size" in registry.mixer_kwargs(n):
        kwargs[n]["chunk_size"] = 4
    lm = models.LanguageModel(32, 16, pattern=list(names), num_heads=2, mlp_ratio=0,
                              mixer_kwargs=kwargs, short_conv=3, rngs=nnx.Rngs(0))
    graphdef, params = nnx.split(lm)
    B, T = 4, 16   # 4 tokens a device on the seq axis of 4
    tokens = jax.random.randint(jax.random.PRNGKey(1), (B, T + 1), 0, 32)

    def loss(params, tokens):
      logits = nnx.merge(graphdef, params)(tokens[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(
          logits.astype(jnp.float32), tokens[:, 1:]).mean()

    vg = jax.value_and_grad(loss)
    lowered = {"ref": jax.jit(vg).lower(params, tokens)}
    for shape in ((1, 4), (2, 2)):
      mesh = jax.make_mesh(shape, ("data", "seq"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
      with jax.set_mesh(mesh):
        lowered[shape] = jax.jit(vg).lower(params, tokens)
    with ThreadPoolExecutor(2) as pool:
      compiled = dict(zip(lowered, pool.map(lambda l: l.compile(), lowered.values())))
    ref = compiled["ref"](params, tokens)
    for shape in ((1, 4), (2, 2)):
      hlo = compiled[shape].as_text()
      # The halo (ppermute) and the state / key-value gathers are there.
      assert "collective-permute" in hlo and "all-gather" in hlo, shape
      got = compiled[shape](params, tokens)
      np.testing.assert_allclose(got[0], ref[0], **TOL)
      for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got[1]),
                              jax.tree.leaves(ref[1])):
        np.testing.assert_allclose(a, b, err_msg=f"{shape} {jax.tree_util.keystr(path)}", **TOL)
    print(f"model {time.time() - t0:.1f}s", flush=True)

    # ---- packed segments: boundaries inside a slice (row 0) and on the slice edge 8 (row 1)
    from linear_attention import ops
    seg = jnp.asarray(np.array([[0] * 3 + [1] * 9 + [2] * 4, [5] * 8 + [6] * 8], np.int32))
    k1, k2, k3, k4 = jax.random.split(jax.random.PRNGKey(2), 4)
    x = jax.random.normal(k1, (2, 16, 8))
    w = jax.random.normal(k2, (4, 8))
    q, k, v = (jax.random.normal(kk, (2, 16, 2, 4)) for kk in jax.random.split(k3, 3))
    pairs = {
        "conv": (lambda x, w: ops.causal_conv1d(x, w, segment_ids=seg, activation="silu"),
                 lambda x, w: ops.causal_conv1d(
                     x, w, segment_ids=seg, activation="silu",
                     context=ops.SeqContext(mesh, "seq", "data")),
                 (x, w)),
        "softmax": (lambda q, k, v: ops.softmax_attention(q, k, v, causal=True, segment_ids=seg),
                    lambda q, k, v: ops.softmax_attention(
                        q, k, v, causal=True, segment_ids=seg,
                        context=ops.SeqContext(mesh, "seq", "data")),
                    (q, k, v)),
    }
    mesh = jax.make_mesh((2, 2), ("data", "seq"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    for name, (f_ref, f_sp, args) in pairs.items():
      both = lambda f: jax.jit(lambda *a: (f(*a), jax.grad(lambda *b: jnp.sum(f(*b) ** 2),
                                                            argnums=tuple(range(len(a))))(*a)))
      want = both(f_ref)(*args)
      with jax.set_mesh(mesh):
        got = both(f_sp)(*args)
      for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want)):
        np.testing.assert_allclose(a, b, err_msg=name, **TOL)
    # Each device's slice must hold the halo.
    try:
      ops.causal_conv1d(x[:, :8], jnp.ones((6, 8)), context=ops.SeqContext(mesh, "seq", "data"))
    except ValueError as e:
      assert "needs at least 5 tokens per device" in str(e), e
    else:
      raise AssertionError("a halo longer than the slice was accepted")
    print(f"segments {time.time() - t0:.1f}s", flush=True)

    # ---- a layer that cannot run sharded says so, naming itself
    mesh = jax.make_mesh((1, 4), ("data", "seq"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    layer = registry.make_mixer("longformer", 16, 2, rngs=nnx.Rngs(0))
    with jax.set_mesh(mesh):
      try:
        layer(jnp.ones((1, 16, 16)))
      except ValueError as e:
        assert "mixer LongformerAttention cannot run with the sequence sharded" in str(e), e
      else:
        raise AssertionError("Longformer ran with the sequence sharded")

    # ---- configuration errors, refused before anything runs
    def refused(match, mixer="gla", dataset=None, **mesh):
      cfg = fake_config(mixer=mixer, steps=1)
      cfg.mesh.update(mesh)
      try:
        train.train_and_evaluate(cfg, f"{WORKDIR}/bad", dataset=dataset or FakeDataset(),
                                 verbose=False)
      except ValueError as e:
        assert match in str(e), (match, str(e))
      else:
        raise AssertionError(f"not refused: {match}")
    # Every causal mixer runs sharded now and the refused ones (Longformer, BigBird) are
    # encoder mixers a causal LM refuses first, so the trainer's own refusal is checked on a
    # causal mixer marked as unable for the duration.
    gla_cls = registry.spec("gla").cls
    gla_cls.context_parallel = False
    try:
      refused("mixer(s) ['gla'] cannot run that way", mixer="gla", seq=2)
    finally:
      gla_cls.context_parallel = True
    refused("config.mesh.seq=4 must divide the sequence length T=18",
            dataset=FakeDataset(seq_len=18), seq=4)
    refused("config.mesh.seq=3 must divide the device count 4", data=-1, seq=3)
    refused("config.mesh.data * config.mesh.seq = 4 * 2", data=4, seq=2)
    print("CONTEXT PARALLEL OK", flush=True)
""")


def test_context_parallel_matches_unsharded(tmp_path):
  run_on_fake_devices(SCRIPT, "CONTEXT PARALLEL OK", workdir=tmp_path)


def test_mesh_errors_on_one_device():
  n = jax.device_count()
  with pytest.raises(ValueError, match=r"config\.mesh\.seq must be an int in \[1, "):
    sharding.make_mesh({"data": 1, "seq": n + 1})
  with pytest.raises(ValueError, match=r"config\.mesh\.seq must be an int"):
    sharding.make_mesh({"data": 1, "seq": 0})
  mesh = sharding.make_mesh({"data": -1, "fsdp": False})  # no seq field: 1
  assert mesh.axis_names == ("data", "seq") and sharding.seq_size(mesh) == 1
