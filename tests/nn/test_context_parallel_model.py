"""Every context-parallel mixer of the registry, inside a model, with the sequence sharded.

For every mixer that ``registry.select(context_parallel=True)`` lists, a tiny backbone
holding one block of each mixer of its family (short convolutions of width 3 in front of
each; Mamba, Mamba-2, Hawk and mLSTM with their own of width 4) gives the loss and every
parameter gradient of the same backbone without a mesh, on the ``("data", "seq")`` mesh
``(2, 2)`` of fake CPU devices: the batch and the sequence split at once. (Every op's
4-way sequence split is checked by the conformance suite, ``test_conformance.py``; what
this test adds is the model around the ops, so one mesh holds what it checks, in a third
fewer compilations than with a second mesh.) The causal mixers run packed segments whose
boundaries fall inside a slice and on the slice edge; the encoder ones (Linformer: no
segments) a plain batch. ``T = 16``: 8 tokens a device, two chunks of 4. Tolerance
``rtol = atol = 2e-4`` on the loss and on every gradient leaf (the sharded path sums
per-device states and gathered keys in another order).

Also: the refusal list of ``nn.context_parallel`` holds exactly the registry mixers that
are not context-parallel, and a refused one raises a ``ValueError`` naming it.

One subprocess per registry family (so that a parallel runner spreads them, and no
single compilation holds every mixer) with ``XLA_FLAGS=
--xla_force_host_platform_device_count=4``; the compilations run two at a time in threads
(XLA compiles outside the GIL).
"""

from __future__ import annotations

import textwrap

import pytest

from linear_attention.nn import context_parallel as cp
from linear_attention.nn import registry
from tests.helpers import run_on_fake_devices

SCRIPT = textwrap.dedent("""
    import os, time
    from concurrent.futures import ThreadPoolExecutor
    import jax, jax.numpy as jnp, numpy as np
    from flax import nnx
    from linear_attention.models.lm import Backbone
    from linear_attention.nn import registry
    assert jax.device_count() == 4, jax.devices()
    t0 = time.time()
    TOL = dict(rtol=2e-4, atol=2e-4)
    B, T, D = 4, 16, 16
    MESHES = ((2, 2),)

    def kwargs(names):
      out = {}
      for n in names:
        out[n] = dict(registry.spec(n).tiny)
        if "chunk_size" in registry.mixer_kwargs(n):
          out[n]["chunk_size"] = 4
        if n == "linformer":
          out[n].update(max_len=T)
      return out

    names = registry.select(context_parallel=True, family=os.environ["FAMILY"])
    print("mixers:", list(names), flush=True)
    causal = [n for n in names if registry.spec(n).causal]
    encoder = [n for n in names if not registry.spec(n).causal]
    tokens = jax.random.randint(jax.random.PRNGKey(1), (B, T), 0, 32)
    # Boundaries inside slices (rows 0, 2), on the slice edge 8 (row 1), none (row 3).
    seg = np.zeros((B, T), np.int32)
    seg[0, 3:] = 1; seg[0, 11:] = 2; seg[1, 8:] = 1; seg[2, 5:] = 3; seg[2, 14:] = 4
    seg = jnp.asarray(seg)
    weights = jax.random.normal(jax.random.PRNGKey(2), (B, T, D))

    def case(names, segment_ids):
      model = Backbone(32, D, pattern=list(names), num_heads=2, mlp_ratio=0,
                       mixer_kwargs=kwargs(names), short_conv=3, rngs=nnx.Rngs(0))
      graphdef, params = nnx.split(model)

      def loss(params):
        h = nnx.merge(graphdef, params)(tokens, segment_ids)
        return jnp.mean(h.astype(jnp.float32) * weights)

      return params, jax.value_and_grad(loss)

    cases = {}
    if causal:
      cases["causal"] = case(causal, seg)
    if encoder:
      cases["encoder"] = case(encoder, None)
    lowered = {}
    for name, (params, vg) in cases.items():
      lowered[name, None] = jax.jit(vg).lower(params)
      for shape in MESHES:
        mesh = jax.make_mesh(shape, ("data", "seq"),
                             axis_types=(jax.sharding.AxisType.Auto,) * 2)
        with jax.set_mesh(mesh):
          lowered[name, shape] = jax.jit(vg).lower(params)
    with ThreadPoolExecutor(2) as pool:
      compiled = dict(zip(lowered, pool.map(lambda l: l.compile(), lowered.values())))
    print(f"compiled {time.time() - t0:.1f}s", flush=True)
    for name, (params, _) in cases.items():
      ref = compiled[name, None](params)
      for shape in MESHES:
        got = compiled[name, shape](params)
        np.testing.assert_allclose(got[0], ref[0], err_msg=f"{name} {shape} loss", **TOL)
        for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got[1]),
                                jax.tree.leaves(ref[1])):
          np.testing.assert_allclose(a, b, err_msg=f"{name} {shape} {jax.tree_util.keystr(path)}",
                                     **TOL)
    print(f"MODEL OK {time.time() - t0:.1f}s", flush=True)
""")


FAMILIES = sorted({registry.spec(n).family for n in registry.select(context_parallel=True)})


@pytest.mark.parametrize("family", FAMILIES)
def test_every_context_parallel_mixer_matches_unsharded(family, monkeypatch):
  monkeypatch.setenv("FAMILY", family)
  run_on_fake_devices(SCRIPT, "MODEL OK", timeout=900, fast_compile=True)


def test_refusal_list_is_the_registry_rest():
  able = set(registry.select(context_parallel=True))
  assert set(cp.REFUSED) == set(registry.MIXERS) - able
  for name in cp.REFUSED:  # each is documented, with its reason, in the module docstring
    assert f"``{name}``" in cp.__doc__, name
  # The registry's selection reads the classes' declarations.
  assert all(registry.spec(n).cls.context_parallel for n in able)
  assert registry.select(context_parallel=False) == tuple(
      n for n in registry.MIXERS if n in cp.REFUSED)


def test_context_is_none_without_a_seq_axis():
  import jax
  assert cp.context() is None
  with jax.set_mesh(jax.make_mesh((1,), ("seq",))):
    assert cp.context() is None  # a seq axis of size 1 shards nothing


def test_a_refused_mixer_names_itself(monkeypatch):
  """The check the Mixer base class runs on every call, with the seq axis faked to 2
  devices (the real mesh is exercised in the subprocess tests)."""
  import jax.numpy as jnp
  from flax import nnx
  from linear_attention.nn import mixer
  name = next(iter(cp.REFUSED))
  layer = registry.make_mixer(name, 16, 2, rngs=nnx.Rngs(0), **registry.spec(name).tiny)
  able = registry.make_mixer("gla", 16, 2, rngs=nnx.Rngs(0), **registry.spec("gla").tiny)
  monkeypatch.setattr(cp, "seq_size", lambda: 2)
  with pytest.raises(ValueError, match=f"mixer {type(layer).__name__} cannot run with the "
                                       "sequence sharded"):
    layer(jnp.ones((1, 17, 16)))
  mixer.check_context_parallel(able)  # no error
