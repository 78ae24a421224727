"""Real checkpoints: transformers' format in and out.

    from linear_attention import hub
    model = hub.from_pretrained("/path/to/mamba-130m-hf")       # a local directory
    logits = model(tokens)                                       # [B, T, vocab]
    out = linear_attention.models.generate(model, prompt, 20, temperature=0)
    hub.save_pretrained(model, "/path/to/out")                   # transformers loads it

:func:`from_pretrained` reads ``config.json`` and ``model.safetensors`` (or the shards named
in ``model.safetensors.index.json``; float32, bfloat16 or float16) one tensor at a time,
each read straight from its offset in the file (no memory map left resident), into a model
built abstractly (no random init), so peak host memory stays near one copy of the model. Every checkpoint tensor must be used and every parameter
set, or the ``ValueError`` names each one that is not. No network: a hub name gets an
error saying how to download it (``huggingface-cli download NAME --local-dir DIR``).

Supported ``model_type`` values: :func:`supported` (the keys of :data:`FAMILIES`).

Adding a family (the extension API)
-----------------------------------
A family is one module ``linear_attention/hub/families/<name>.py`` plus one import line in
``families/__init__.py``. The module registers a :class:`Family` per transformers
``model_type``::

    from linear_attention.hub import core
    from linear_attention.hub.families.common import get, require, embeddings_and_head
    from linear_attention.models.blocks import LayerSpec
    from linear_attention.models.lm import LanguageModel

    def build(config, *, rngs, dtype=None, param_dtype=jnp.float32):
      # config: the parsed config.json (a dict). get(config, key, default) reads a key
      # with transformers' default; require(config, key, supported, default) refuses a
      # value the model cannot express (ValueError naming the key).
      layers = [LayerSpec("mamba2", heads, mixer_kwargs={...}, mlp="swiglu",
                          mlp_hidden=..., norm_eps=eps) for i in range(n)]
      return LanguageModel(vocab, d_model, layers=layers, tie_embeddings=..., norm_eps=eps,
                           rngs=rngs, dtype=dtype, param_dtype=param_dtype)

    def tensors(config):
      # One entry per model parameter: its path in nnx.state(model) and the checkpoint
      # tensor name(s) it comes from, with the conversion both ways.
      out = embeddings_and_head(config, "model.embed_tokens.weight", "model.norm.weight",
                                tie_default=False)
      out += [core.same("model.layers.0.input_layernorm.weight",
                        ("backbone", "blocks", 0, "mixer_norm", "scale")),
              core.linear("...q_proj.weight", (..., "mixer", "q_proj", "kernel")),
              core.linears(["...gate_proj.weight", "...up_proj.weight"],
                           (..., "mlp", "up", "kernel"))]
      return out

    core.register(core.Family("my_type", "MyTypeForCausalLM", build, tensors))

Building blocks:

- the model: :class:`~linear_attention.models.lm.LanguageModel` with ``layers=`` a list of
  :class:`~linear_attention.models.blocks.LayerSpec` (per layer: registry mixer name or
  ``None`` for an MLP-only layer, heads, the mixer's own options, MLP kind ``"swiglu"`` /
  ``"relu2"`` and width, norm epsilon). A block is ``x + mixer(RMSNorm(x))`` then
  ``x + MLP(RMSNorm(x))``; parameter paths are ``backbone/embed/embedding``,
  ``backbone/blocks/<i>/{mixer_norm,mlp_norm}/scale``, ``backbone/blocks/<i>/mixer/...``,
  ``backbone/blocks/<i>/mlp/{up,down}/kernel`` (SwiGLU's ``up`` is gate then up side by
  side), ``backbone/final_norm/scale``, ``lm_head/kernel`` (absent when tied). A layer
  option the checkpoints need belongs in the ``nn/`` layer (e.g. ``nn.Mamba2``'s
  ``norm_per_channel`` and ``dt_limit``), never in a per-family copy of the layer.
- weight-map entries (:mod:`~linear_attention.hub.core`): :func:`~core.same` (stored as is),
  :func:`~core.linear` (torch ``[out, in]`` -> kernel ``[in, out]``), :func:`~core.linears`
  (several projections fused into one kernel), :func:`~core.conv1d` (depthwise
  ``[C, 1, W]`` -> ``[W, C]``), :func:`~core.reshaped`, or a :class:`~core.Tensor` with
  your own ``load``/``save``; :class:`~core.Split` for one checkpoint tensor that several
  parameters share (a fused projection); :class:`~core.Alias` for an optional duplicate (a tied
  ``lm_head.weight``); :class:`~core.Constant` for a buffer the config determines (checked
  at load, written at save). ``core.check_coverage`` verifies the map against the model at load
  and save.
- tests: add the family to ``tests/hub/make_fixtures.py`` (a tiny transformers config),
  run it with torch installed to write the fixture, and the shared tests in
  ``tests/hub/`` pick it up (logits, greedy generation, save round trip; the ``hf`` ones
  against transformers itself).
"""

from linear_attention.hub.core import FAMILIES, Alias, Constant, Family, Split, Tensor, register
from linear_attention.hub.loader import family_of, from_pretrained, save_pretrained, supported

__all__ = ["FAMILIES", "Alias", "Constant", "Family", "Split", "Tensor", "family_of",
           "from_pretrained", "register", "save_pretrained", "supported"]
