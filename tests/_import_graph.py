"""The import graph of a package and what breaks its layers, for tests/test_layers.py.

The graph is read from the source with ``ast``: every ``import`` and ``from ... import``
of every file under ``emulator/``, at module level and inside functions, relative imports
resolved. ``from package import name`` is an edge to ``package.name`` when that is a
module, else to ``package`` (its ``__init__``). Importing ``a.b.c`` also runs ``a`` and
``a.b`` first; those implied edges to enclosing packages are not counted.
"""

import ast
import pathlib
from dataclasses import dataclass

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "emulator"


@dataclass(frozen=True)
class Edge:
    src: str          # importing module, e.g. "emulator.engine.world"
    dst: str          # imported module (a project module, or the top-level name of another package)
    line: int
    in_function: bool
    project: bool     # dst is part of the package

    def where(self):
        return f"{self.src}:{self.line} imports {self.dst}" + (" inside a function" if self.in_function else "")


def sources(root=ROOT / PACKAGE):
    """{module name: (source text, is a package)} for every file under ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = (path.read_text(encoding="utf-8"), is_package)
    return out


def _functions(tree):
    """The import nodes that sit inside a function body (at any depth)."""
    inside = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            inside.update(id(n) for n in ast.walk(fn) if isinstance(n, (ast.Import, ast.ImportFrom)))
    return inside


def edges(modules, package=PACKAGE):
    """Every import of ``modules`` ({name: (source, is_package)}) as an :class:`Edge`."""
    out = []
    for name, (text, is_package) in modules.items():
        tree = ast.parse(text, filename=name)
        inside = _functions(tree)
        here = name.split(".") if is_package else name.split(".")[:-1]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here[:len(here) - node.level + 1]
                    source = ".".join(base + ([node.module] if node.module else []))
                else:
                    source = node.module
                subs = [f"{source}.{a.name}" for a in node.names if f"{source}.{a.name}" in modules]
                rest = [a for a in node.names if f"{source}.{a.name}" not in modules]
                targets = subs + ([source] if rest or not subs else [])
            else:
                continue
            for target in targets:
                project = target == package or target.startswith(package + ".")
                if not project:
                    target = target.split(".")[0]
                out.append(Edge(name, target, node.lineno, id(node) in inside, project))
    return out


def top(module, package=PACKAGE):
    """The top-level name a module belongs to ("engine" for emulator.engine.world); the
    package's own __init__ is ``package``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else package


def upward(all_edges, layers, package=PACKAGE):
    """What breaks the layer order: an import of a higher (or the same) layer's name, of
    the package's facade, or by a name that has no layer."""
    rank = {n: i for i, layer in enumerate(layers) for n in layer}
    bad = []
    for e in all_edges:
        if not e.project:
            continue
        a, b = top(e.src, package), top(e.dst, package)
        if a == b:
            continue
        if a == package:
            continue  # the facade may import anything
        if b == package:
            bad.append(f"{e.where()}: nothing inside the package imports its facade; import the module")
        elif a not in rank or b not in rank:
            bad.append(f"{e.where()}: {a if a not in rank else b!r} has no layer in LAYERS")
        elif rank[b] >= rank[a]:
            what = "the same layer" if rank[a] == rank[b] else f"a higher layer ({b} above {a})"
            bad.append(f"{e.where()}: an import of {what}")
    return bad


def function_level(all_edges, lazy):
    """Imports inside functions other than the documented lazy third-party ones."""
    return [f"{e.where()}: move the import to the top of the module (a project module is never imported lazily)"
            if e.project else f"{e.where()}: hoist it, or document why it loads lazily in LAZY"
            for e in all_edges if e.in_function and (e.project or e.dst not in lazy)]


def dynamic_imports(modules):
    """(module, line) of every call of ``importlib.import_module`` or ``__import__``."""
    out = []
    for name, (text, _) in modules.items():
        for node in ast.walk(ast.parse(text, filename=name)):
            if isinstance(node, ast.Call):
                f = node.func
                called = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
                if called in ("import_module", "__import__"):
                    out.append((name, node.lineno))
    return out


def cycles(graph):
    """The strongly connected components of more than one node of ``graph`` ({node: set of
    nodes}), each sorted (Tarjan's algorithm, iterative)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on.add(start)
        while work:
            v, children = work[-1]
            for w in children:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
    return found


def module_graph(all_edges):
    graph = {}
    for e in all_edges:
        if e.project and e.dst != e.src:
            graph.setdefault(e.src, set()).add(e.dst)
    return graph


def top_graph(all_edges, package=PACKAGE):
    graph = {}
    for e in all_edges:
        a, b = top(e.src, package), top(e.dst, package)
        if e.project and a != b:
            graph.setdefault(a, set()).add(b)
    return graph
