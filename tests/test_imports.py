"""The package's imports form no cycle, and each floor imports only the floors below it.

Reads every module of ``linear_attention`` with ``ast`` (nothing is imported)
and builds the graph of its imports of other package modules. Function-level
(lazy) imports count as much as module-level ones, everywhere: a lazy import
hides a cycle, it does not remove it.
``from a.b import c`` points at module ``a.b.c`` when that is a module, else at
``a.b``. The implicit import of a parent package (``a.b`` runs ``a/__init__``)
is not an edge: ``linear_attention/__init__`` imports no subpackage (they
load on first use), so a parent package is always complete before its children
are imported.
"""

from __future__ import annotations

import ast
import pathlib

import linear_attention

ROOT = pathlib.Path(linear_attention.__file__).parent
PACKAGE = "linear_attention"


def _modules() -> dict[str, pathlib.Path]:
  out = {}
  for path in ROOT.rglob("*.py"):
    parts = (PACKAGE,) + path.relative_to(ROOT).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    out[".".join(parts)] = path
  return out


def _is_package(name: str, modules: dict[str, pathlib.Path]) -> bool:
  return modules[name].name == "__init__.py"


def _imports(name: str, modules: dict[str, pathlib.Path]) -> set[str]:
  """Package modules that ``name`` imports, anywhere in its body."""
  tree = ast.parse(modules[name].read_text(), filename=str(modules[name]))
  here = name if _is_package(name, modules) else name.rpartition(".")[0]
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      targets = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:
        anchor = here.split(".")
        anchor = anchor[:len(anchor) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
      targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                 for a in node.names]
    else:
      continue
    for target in targets:
      # The longest package module that the dotted name starts with.
      while target and target not in modules:
        target = target.rpartition(".")[0]
      if target and target != name:
        out.add(target)
  return out


def _graph() -> dict[str, set[str]]:
  modules = _modules()
  return {name: _imports(name, modules) for name in modules}


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
  state: dict[str, int] = {}  # 1: on the current path, 2: done
  path: list[str] = []

  def visit(node):
    state[node] = 1
    path.append(node)
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 1:
        return path[path.index(nxt):] + [nxt]
      if nxt not in state:
        found = visit(nxt)
        if found:
          return found
    path.pop()
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node)
      if found:
        return found
  return None


def test_no_import_cycle():
  cycle = _find_cycle(_graph())
  assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_cycle_finder_finds_one():
  graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
  assert _find_cycle(graph) == ["a", "b", "c", "a"]
  assert _find_cycle({"a": {"b"}, "b": set()}) is None


E = "linear_attention.engines"
ENGINES = ("decay", "delta", "dplr", "scan", "softmax")
# An engine's kernel may build on another engine's kernel: DPLR's is the delta kernel with
# the DPLR chunk algebra.
KERNEL_BASES = {"dplr": ("delta",)}


def _under(name: str, *prefixes: str) -> bool:
  return any(name == p or name.startswith(p + ".") for p in prefixes)


def _engine_of(name: str) -> str | None:
  parts = name.split(".")
  return parts[2] if len(parts) > 2 and parts[1] == "engines" and parts[2] in ENGINES else None


def test_common_imports_nothing_else_of_the_package():
  for name, targets in _graph().items():
    if _under(name, "linear_attention.common"):
      bad = sorted(t for t in targets if not _under(t, "linear_attention.common"))
      assert not bad, f"{name} imports {bad}; common imports nothing else of the package"


def test_kernels_import_only_their_terms_chunks_dispatch_and_common():
  """An engine's ``pallas`` sees its own ``terms``, ``engines.chunks``, ``engines.dispatch``
  and ``common``: never its engine's XLA forms, ``ops`` or anything above."""
  seen = 0
  for name, targets in _graph().items():
    engine = _engine_of(name)
    if engine is None or not _under(name, f"{E}.{engine}.pallas"):
      continue
    seen += 1
    allowed = (f"{E}.{engine}.pallas", f"{E}.{engine}.terms", f"{E}.chunks", f"{E}.dispatch",
               "linear_attention.common") + tuple(
                   f"{E}.{base}.pallas" for base in KERNEL_BASES.get(engine, ()))
    bad = sorted(t for t in targets if not _under(t, *allowed))
    assert not bad, f"{name} imports {bad}; a kernel may import only {list(allowed)}"
  assert seen >= len(ENGINES)


def test_engines_never_import_upwards():
  """engines -> common only: no engine module reaches ops, nn or anything above."""
  for name, targets in _graph().items():
    if _under(name, E):
      bad = sorted(t for t in targets if not _under(t, E, "linear_attention.common"))
      assert not bad, f"{name} imports {bad}; engines import only engines and common"
  # An engine's terms are shared algebra: they see chunks and common only.
  for engine in ENGINES:
    name = f"{E}.{engine}.terms"
    if name in _graph():
      bad = sorted(t for t in _graph()[name]
                   if not _under(t, f"{E}.chunks", "linear_attention.common"))
      assert not bad, f"{name} imports {bad}"


def test_ops_never_import_a_kernel():
  for name, targets in _graph().items():
    if _under(name, "linear_attention.ops"):
      bad = sorted(t for t in targets if ".pallas" in t)
      assert not bad, f"{name} imports {bad}; ops reach kernels only through an engine"


def test_nn_imports_ops_not_engines():
  """nn -> ops (and engines.context for SeqContext): layers never call an engine directly."""
  for name, targets in _graph().items():
    if _under(name, "linear_attention.nn"):
      bad = sorted(t for t in targets if _under(t, E) and t != f"{E}.context")
      assert not bad, f"{name} imports {bad}; nn imports ops (and {E}.context)"
