"""The op conformance suite: every check below runs on every op of ``conformance.SPECS``.

Checks (a spec's capabilities say which apply):

* forms: every form against the float32 reference written in ``conformance.py``
  and against each other, forward (output and final state) and gradient (every
  differentiable input and the initial state), with packed segments;
* steps: the ``*_step`` function token by token equals the reference;
* packing: a row of packed segments equals the segments called one by one;
* odd lengths: one token, every form (the other checks use T = 37, two
  chunks of 16 and a partial one);
* bfloat16: bfloat16 inputs give bfloat16 outputs and a float32 state (the
  default form), within
  ``helpers.BF16_RTOL``/``BF16_ATOL`` of the float32 reference on the same
  (rounded) inputs;
* bad inputs: integer inputs, a wrong rank, an unknown form, wrong
  ``segment_ids``, a wrong initial state, a positive log gate, and for the
  step function integer inputs, integer, half-precision and misshapen states
  and a positive gate, each a ``ValueError`` naming the argument; an empty
  sequence, one ``ValueError`` naming the sequence length;
* hard resets: a log gate of ``-inf`` (all steps, single steps, one channel)
  gives the reference's output and finite gradients equal across forms;
* transformations: ``jit(vmap(op))`` equals eager calls one slice at a time,
  ``grad`` under ``jit`` is finite (its values are checked against the
  reference by the forms check);
* Pallas kernels (``conformance.KERNEL_CASES``): the op through its kernel
  (``implementation="pallas"``) in the GPU (Triton) and TPU (Mosaic) interpret
  modes, natively on such a host: forward and gradient against the reference
  and the XLA op, with the initial and final state and packed segments (or the
  op refusing them under ``"pallas"``), and one token;
* context parallelism (``spec.context``): the op called with ``context=`` on 4
  fake CPU devices equals the unsharded op, forward and gradient, with packed
  segments and the initial state; one subprocess runs every spec's case and the
  edge cases of ``test_context.py``.

Checks that only make sense for one op stay in that op's test file.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from linear_attention.engines import dispatch
from tests import helpers
from tests.ops import conformance as cf
from tests.ops import multidevice

F32 = jnp.float32
SEG_LENGTHS = (13, 18, 6)  # T = 37 with chunks of 16: boundaries off the chunk grid
PACK_LENGTHS = (13, 18, 1)  # the last segment a single token

by_spec = pytest.mark.parametrize("spec", cf.SPECS, ids=lambda s: s.name)


def _inputs(spec, t, seed, dtype=F32):
  rng = np.random.default_rng(seed)
  arrays = spec.make(rng, t, dtype)
  s0 = None if spec.make_state is None else spec.make_state(rng, arrays)
  return arrays, s0


def _segments(lengths):
  ids = np.repeat(np.arange(len(lengths)), lengths)
  return jnp.asarray(np.stack([ids, np.full_like(ids, 7)]), jnp.int32)  # row 1: one segment


def _default_form(spec):
  return "chunk" if "chunk" in spec.forms else spec.forms[0]


def _bind(spec, fn, arrays, s0):
  """``fn(arrays, s0)`` as a function of the differentiable arrays and the state."""
  diff = spec.differentiable(arrays)

  def call(*xs):
    a = list(arrays)
    for i, x in zip(diff, xs):
      a[i] = x
    return fn(tuple(a), xs[len(diff)] if s0 is not None else None)

  args = tuple(arrays[i] for i in diff) + ((s0,) if s0 is not None else ())
  return call, args


def _check_dtypes(spec, out, dtype):
  o, state = out
  assert o.dtype == dtype, f"{spec.name}: output dtype {o.dtype}, want {dtype}"
  for leaf in jax.tree_util.tree_leaves(state):
    assert leaf.dtype == F32, f"{spec.name}: state dtype {leaf.dtype}, want float32"


def _run_forms(spec, arrays, s0, seg, forms=None):
  """The reference's and every form's (default: ``spec.forms``) ``(out, grads)``, one
  jit each; the gradients are those of the differentiable inputs and the initial state."""
  ref, args = _bind(spec, lambda a, s: spec.reference(a, s, seg), arrays, s0)
  results = {}
  for form in spec.forms if forms is None else forms:
    fn, _ = _bind(spec, lambda a, s, form=form: spec.run(a, form, s, seg), arrays, s0)
    results[form] = helpers.value_and_grads(fn, args)
  return helpers.value_and_grads(ref, args), results


def _assert_forms_agree(spec, results):
  """Every form's results (a pytree per form) against the first form's."""
  first, *others = results
  for form in others:
    helpers.assert_tree_close(results[form], results[first], spec.grad_tol, spec.grad_tol,
                              f"{spec.name}: {form} against {first}")


@by_spec
def test_forms_match_reference_and_each_other(spec):
  """Outputs, final state and gradients (inputs and initial state), packed segments."""
  arrays, s0 = _inputs(spec, 37, 0)
  seg = _segments(SEG_LENGTHS) if spec.segments else None
  (want, want_grads), results = _run_forms(spec, arrays, s0, seg)
  for form, (out, grads) in results.items():
    _check_dtypes(spec, out, F32)
    helpers.assert_tree_close(out, want, spec.rtol, spec.atol, f"{spec.name} {form} forward")
    helpers.assert_tree_close(grads, want_grads, spec.grad_tol, spec.grad_tol,
                              f"{spec.name} {form} gradient")
  _assert_forms_agree(spec, results)


@pytest.mark.parametrize("spec", cf.WITH_STEP, ids=lambda s: s.name)
def test_steps_equal_the_sequence(spec):
  t = 5
  arrays, s0 = _inputs(spec, t, 1)
  want_o, want_s = jax.jit(lambda a, s: spec.reference(a, s, None))(arrays, s0)
  state = s0 if s0 is not None else spec.step_state(arrays)
  step = jax.jit(spec.step)
  outs = []
  for i in range(t):
    o, state = step(state, spec.at(arrays, i))
    assert o.dtype == arrays[0].dtype
    outs.append(o)
  helpers.assert_close(jnp.stack(outs, 1), want_o, spec.rtol, spec.atol)
  if s0 is not None:
    _check_dtypes(spec, (o, state), arrays[0].dtype)
    helpers.assert_tree_close(state, want_s, spec.rtol, spec.atol)


@pytest.mark.parametrize("spec", [s for s in cf.SPECS if s.packs], ids=lambda s: s.name)
def test_packed_segments_equal_separate_calls(spec):
  """The initial state goes to the first segment; the final state is the last one's."""
  arrays, s0 = _inputs(spec, sum(PACK_LENGTHS), 2)
  seg = _segments(PACK_LENGTHS)
  form = _default_form(spec)
  bounds = np.cumsum((0,) + PACK_LENGTHS)

  @jax.jit
  def run(arrays, s0):
    packed = spec.run(arrays, form, s0, seg)
    parts = [spec.run(spec.slice(arrays, lo, hi), form, s0 if lo == 0 else None, None)
             for lo, hi in zip(bounds[:-1], bounds[1:])]
    return packed, parts

  (o, state), parts = run(arrays, s0)
  # Row 1 of seg is one segment: only row 0 is packed.
  helpers.assert_close(o[:1], jnp.concatenate([p[0] for p in parts], 1)[:1], spec.rtol, spec.atol)
  if state is not None:
    helpers.assert_tree_close(jax.tree_util.tree_map(lambda x: x[:1], state),
                              jax.tree_util.tree_map(lambda x: x[:1], parts[-1][1]),
                              spec.rtol, spec.atol)


@pytest.mark.parametrize("spec,t", [(s, t) for s in cf.SPECS for t in s.lengths],
                         ids=lambda x: getattr(x, "name", str(x)))
def test_odd_lengths(spec, t):
  arrays, s0 = _inputs(spec, t, 3)

  @jax.jit
  def run(arrays, s0):
    return spec.reference(arrays, s0, None), [spec.run(arrays, f, s0, None) for f in spec.forms]

  want, outs = run(arrays, s0)
  for form, out in zip(spec.forms, outs):
    helpers.assert_tree_close(out, want, spec.rtol, spec.atol, f"{spec.name} {form} T={t}")


@by_spec
def test_bfloat16_inputs(spec):
  """bfloat16 in, bfloat16 out, float32 state; the tolerance is ``helpers.BF16_*``."""
  arrays, s0 = _inputs(spec, 37, 4)
  low = spec.low_precision(arrays)
  arrays = tuple(a.astype(jnp.bfloat16) if i in low else a for i, a in enumerate(arrays))
  seg = _segments(SEG_LENGTHS) if spec.segments else None

  form = _default_form(spec)  # every form accumulates in float32: checked above

  @jax.jit
  def run(arrays, s0):
    f32 = tuple(a.astype(F32) if i in low else a for i, a in enumerate(arrays))
    return spec.reference(f32, s0, seg), spec.run(arrays, form, s0, seg)

  want, out = run(arrays, s0)
  _check_dtypes(spec, out, jnp.bfloat16)
  helpers.assert_tree_close(out, want, helpers.BF16_RTOL, helpers.BF16_ATOL,
                            f"{spec.name} {form} bfloat16")


@by_spec
def test_jit_vmap_grad(spec):
  t = max(9, min(spec.lengths))
  (a1, s1), (a2, s2) = _inputs(spec, t, 5), _inputs(spec, t, 6)
  form = _default_form(spec)
  fn = lambda a, s: spec.run(a, form, s, None)
  # jit(vmap(fn)) against eager calls: jit and vmap at once, one compile.
  stack = lambda x, y: None if x is None else jax.tree_util.tree_map(
      lambda p, q: jnp.stack([p, q]), x, y)
  batched = jax.jit(jax.vmap(fn))(stack(a1, a2), stack(s1, s2))
  for i, (a, s) in enumerate(((a1, s1), (a2, s2))):
    helpers.assert_tree_close(jax.tree_util.tree_map(lambda x: x[i], batched), fn(a, s),
                              1e-5, 1e-5, f"jit(vmap) slice {i} against eager")
  # Gradients against the reference: test_forms_match_reference_and_each_other.
  loss = lambda x0: jnp.sum(jnp.sin(fn((x0,) + a1[1:], s1)[0].astype(F32)))
  grad = np.asarray(jax.jit(jax.grad(loss))(a1[0]))
  assert np.all(np.isfinite(grad)) and np.any(grad != 0)


def _sequence_cases(spec):
  """(description, call, message regex) for the bad inputs of the sequence op."""
  arrays, s0 = _inputs(spec, 6, 7)
  form = _default_form(spec)
  run = lambda a, s=s0: spec.run(a, form, s, None)
  name = spec.names[0]
  with_first = lambda x: (x,) + arrays[1:]
  cases = [
      ("integer input", lambda: run(with_first(arrays[0].astype(jnp.int32))), rf"\b{name}\b"),
      ("missing batch axis", lambda: run(with_first(arrays[0][0])), rf"\b{name}\b"),
  ]
  if spec.forms != ("default",):
    cases.append(("unknown form", lambda: spec.run(arrays, "fast", s0, None),
                  r"\b(form|algorithm) must be one of"))
  if spec.segments:
    seg = jnp.zeros((arrays[0].shape[0], 5), jnp.int32)  # one token short
    cases.append(("segment_ids shape", lambda: spec.run(arrays, form, s0, seg),
                  r"\bsegment_ids must have shape"))
  if s0 is not None:
    bad = jax.tree_util.tree_map(lambda x: x[..., :1], s0)
    cases.append(("initial state shape", lambda: run(arrays, bad), rf"\b{spec.state_name}\b"))
  if spec.log_gate is not None:
    i = spec.log_gate
    flipped = arrays[:i] + (0.5 - arrays[i],) + arrays[i + 1:]
    cases.append(("positive log gate", lambda: run(flipped), rf"\b{spec.names[i]}\b"))
  return cases


def _step_cases(spec):
  """(description, call, message regex) for the bad inputs of the step function."""
  arrays, s0 = _inputs(spec, 2, 8)
  x = spec.at(arrays, 0)
  state = s0 if s0 is not None else spec.step_state(arrays)
  step = lambda a=x, s=state: spec.step(s, a)
  each = lambda f: jax.tree_util.tree_map(f, state)  # a state may be a tuple of arrays
  name = spec.names[0]
  cases = [("step: integer input", lambda: step((x[0].astype(jnp.int32),) + x[1:]),
            rf"\b{name}\b")]
  if spec.step_state_checked:
    cases += [
        ("step: integer state", lambda: step(s=each(lambda x: x.astype(jnp.int32))), r"\bstate\b"),
        ("step: float16 state", lambda: step(s=each(lambda x: x.astype(jnp.float16))),
         r"\bstate\b"),
        ("step: state shape", lambda: step(s=each(lambda x: x[..., :1])), r"\bstate\b"),
    ]
  if spec.log_gate is not None:
    i = spec.log_gate
    flipped = x[:i] + (0.5 - x[i],) + x[i + 1:]
    cases.append(("step: positive log gate", lambda: step(flipped), rf"\b{spec.names[i]}\b"))
  return cases


@by_spec
def test_bad_inputs_raise(spec):
  """The generic bad inputs, the step function's included, then the op's own."""
  cases = _sequence_cases(spec) + (_step_cases(spec) if spec.step else [])
  cases += [("op-specific", call, match) for call, match in (spec.bad() if spec.bad else [])]
  failures = []
  for what, call, match in cases:
    try:
      call()
    except ValueError as e:
      if not re.search(match, str(e)):
        failures.append(f"{what}: message {str(e)!r} does not match {match!r}")
    except Exception as e:  # noqa: BLE001 - any other exception is the failure
      failures.append(f"{what}: {type(e).__name__}: {e}")
    else:
      failures.append(f"{what}: no error")
  assert not failures, f"{spec.name}:\n" + "\n".join(failures)


@by_spec
def test_empty_sequence_raises(spec):
  """T = 0 gets one ValueError naming the sequence length, for every op."""
  arrays, s0 = _inputs(spec, 4, 9)
  empty = spec.slice(arrays, 0, 0)
  with pytest.raises(ValueError, match=r"sequence length .* must be >= 1, got 0"):
    spec.run(empty, _default_form(spec), s0, None)


def _with_neg_inf(spec, arrays):
  """The log gate with ``-inf`` in three patterns at once (one compile per form):
  all steps of batch row 1, two single steps (mid-chunk and a chunk start) and
  one channel (or head) throughout. A rate without a time axis (SSD's and
  Mamba's ``A``) gets it in one channel (or head): every step of it."""
  i = spec.log_gate
  g = arrays[i]
  if spec.timed[i]:
    g = g.at[1].set(-jnp.inf).at[:, 5].set(-jnp.inf).at[:, 16].set(-jnp.inf)
  g = g.at[..., 0].set(-jnp.inf)
  return arrays[:i] + (g,) + arrays[i + 1:]


@pytest.mark.parametrize("spec", cf.WITH_LOG_GATE, ids=lambda s: s.name)
def test_neg_inf_log_gate_is_a_hard_reset(spec):
  """A decay of exactly zero: every form gives the reference's output and the same
  finite gradients (equal to the reference's wherever the reference is finite)."""
  arrays, s0 = _inputs(spec, 21, 10)
  arrays = _with_neg_inf(spec, arrays)
  (want, want_grads), results = _run_forms(spec, arrays, s0, None)
  for form, (out, grads) in results.items():
    helpers.assert_tree_close(out, want, spec.rtol, spec.atol, f"{form} forward")
    # A plain reference may itself meet 0 * inf in its gradient (exp(dt * A)
    # at A = -inf, d/d dt): compare where it is finite; ours must be finite.
    for got, ref_g in zip(jax.tree_util.tree_leaves(grads), jax.tree_util.tree_leaves(want_grads)):
      got, ref_g = np.asarray(got, np.float32), np.asarray(ref_g, np.float32)
      assert np.all(np.isfinite(got)), f"{form}: non-finite gradient"
      ok = np.isfinite(ref_g)
      helpers.assert_close(got[ok], ref_g[ok], spec.grad_tol, spec.grad_tol, f"{form} gradient")
  _assert_forms_agree(spec, {form: grads for form, (_, grads) in results.items()})


def _send_kernels_to(platform, monkeypatch, request):
  """Sends the ops' kernel launches to ``platform`` (interpret mode unless this host
  is one) and returns the list each launch appends ``(entry point, platform)`` to."""
  launches = []
  resolve = dispatch.resolve_launch

  def record(what, *args, **kwargs):
    out = resolve(what, *args, **kwargs)
    launches.append((what, out[0]))
    return out

  monkeypatch.setattr(dispatch, "default_platform", lambda: platform)
  monkeypatch.setattr(dispatch, "resolve_launch", record)
  # An op that jits inside (mlstm) would replay a trace of another platform's
  # kernel: traced afresh here, and forgotten after the test.
  jax.clear_caches()
  request.addfinalizer(jax.clear_caches)
  return launches


@pytest.mark.parametrize("case,platform", cf.KERNEL_RUNS,
                         ids=lambda x: getattr(x, "name", str(x)))
def test_kernel_matches_reference_and_xla(case, platform, monkeypatch, request):
  """Forward and gradient (inputs and initial state) of the op through its kernel
  against the float32 reference and the op's XLA form, T = 37 with packed segments
  where the kernel takes them; then T = 1 (forward)."""
  spec, kernel = case.spec, case.kernel
  launches = _send_kernels_to(platform, monkeypatch, request)
  arrays, s0 = _inputs(spec, 37, 0)
  segments = _segments(SEG_LENGTHS) if spec.segments else None
  seg = segments if kernel.segments else None
  if segments is not None and seg is None:
    with pytest.raises(ValueError, match=r"\bsegment_ids\b"):
      spec.run(arrays, cf.PALLAS, s0, segments)
  xla = _default_form(spec)
  (want, want_grads), results = _run_forms(spec, arrays, s0, seg, forms=(xla, cf.PALLAS))
  out, grads = results[cf.PALLAS]
  _check_dtypes(spec, out, F32)
  helpers.assert_tree_close(out, want, spec.rtol, spec.atol, f"{spec.name} pallas forward")
  helpers.assert_tree_close(grads, want_grads, spec.grad_tol, spec.grad_tol,
                            f"{spec.name} pallas gradient")
  _assert_forms_agree(spec, results)
  assert launches and set(launches) == {(kernel.entry, platform)}, launches

  if platform != "gpu":
    return  # one token: the GPU path only (the TPU interpreter takes 2-4 s more)
  one, s1 = _inputs(spec, 1, 3)
  want, out = jax.jit(lambda a, s: (spec.reference(a, s, None), spec.run(a, cf.PALLAS, s, None)))(
      one, s1)
  helpers.assert_tree_close(out, want, spec.rtol, spec.atol, f"{spec.name} pallas T=1")


# ------------------------------------------------------------ context= on 4 devices

# 18 tokens a device on the 4-way "seq" axis (a chunk of 16 and a partial one), 36 on
# the 2-way one; packed segments with boundaries inside slices (row 0: 5, 30) and on the
# slice edges (row 1: 18, 36).
CONTEXT_T = 72
CONTEXT_SEG_LENGTHS = ((5, 25, 42), (18, 18, 36))
CONTEXT_TOL = 2e-4  # float32 sums in another order (per-device states, gathered keys)
# name: (shape, axis names, batch axis, Auto axes): Auto axes as the trainer's mesh (XLA's
# partitioner then places the ops around the context's shard_map itself).
CONTEXT_MESHES = {"seq4": ((4,), ("seq",), None, False),
                  "data2_seq2": ((2, 2), ("data", "seq"), "data", False),
                  "seq4_auto": ((4,), ("seq",), None, True),
                  "data2_seq2_auto": ((2, 2), ("data", "seq"), "data", True)}
WITH_CONTEXT = tuple(s for s in cf.SPECS if s.context)


def test_every_op_that_takes_a_context_declares_context_forms():
  """A spec whose op has a ``context`` argument lists forms to check with it, and only then
  (so no op's context path goes unchecked by omission)."""
  import inspect

  from linear_attention import ops
  for spec in cf.SPECS:
    op = getattr(ops, spec.name, None)
    if op is None:  # a variant spec of another op (based, mlstm_exp)
      continue
    takes = "context" in inspect.signature(op).parameters
    assert bool(spec.context) == takes, (spec.name, takes, spec.context)
    assert set(spec.context) <= set(spec.forms) | {"default"}, spec.name
    assert set(spec.context_meshes) <= set(CONTEXT_MESHES), spec.name


def _context_segments():
  return jnp.asarray(np.stack([np.repeat(np.arange(len(l)), l) for l in CONTEXT_SEG_LENGTHS]),
                     jnp.int32)


def check_context(spec):
  """``spec.run`` with ``context=`` against the same call without, for every form of
  ``spec.context`` (the first on every mesh of ``spec.context_meshes``, the others on its
  first): output, final state and the gradients of the differentiable inputs and the
  initial state, with packed segments. Needs 4 devices."""
  from linear_attention.ops import SeqContext
  arrays, s0 = _inputs(spec, CONTEXT_T, 5)
  seg = _context_segments() if spec.segments else None
  for i, form in enumerate(spec.context):
    fn, args = _bind(spec, lambda a, s, f=form: spec.run(a, f, s, seg), arrays, s0)
    want = helpers.value_and_grads(fn, args)
    for mesh_name in spec.context_meshes[:len(spec.context_meshes) if i == 0 else 1]:
      shape, names, batch_axis, auto = CONTEXT_MESHES[mesh_name]
      types = (jax.sharding.AxisType.Auto,) * len(names) if auto else None
      mesh = jax.make_mesh(shape, names, axis_types=types)
      sharded = cf.Sharded(form, SeqContext(mesh, "seq", batch_axis))
      fn, _ = _bind(spec, lambda a, s: spec.run(a, sharded, s, seg), arrays, s0)
      with jax.set_mesh(mesh):
        got = helpers.value_and_grads(fn, args)
      where = f"{spec.name} {form} on {mesh_name}"
      if not auto:
        assert got[0][0].sharding.spec[1] == "seq", (where, got[0][0].sharding)
      helpers.assert_tree_close(got, want, CONTEXT_TOL, CONTEXT_TOL, where)


def context_cases() -> dict:
  """The 4-device cases: :func:`check_context` for every spec that takes a context, and
  the edge cases of ``test_context.py``, run in one subprocess."""
  from tests.ops import test_context
  out = {f"context_{s.name}": (lambda s=s: check_context(s)) for s in WITH_CONTEXT}
  out.update(test_context.CASES)
  return out


def _run_cases() -> None:
  """Subprocess entry point (4 fake devices)."""
  multidevice.run_cases(context_cases())


def test_context_matches_unsharded_on_four_devices():
  """Every op that declares ``context`` forms, sharded over 4 fake CPU devices, equals the
  unsharded op (forward and gradient); with the edge cases of ``test_context.py``."""
  multidevice.check_in_subprocess("tests.ops.test_conformance", context_cases())
