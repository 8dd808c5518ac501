"""The emulator's layers: every import points down the order below (README.md's module map
says the same), no modules import each other in a circle, and no project module is
imported inside a function, where an upward edge or a circle would hide.

The graph is read from the source with ``ast``: every ``import`` and ``from ... import``
of every file under ``emulator/``, at module level and inside functions, relative imports
resolved. ``from package import name`` is an edge to ``package.name`` when that is a
module, else to ``package`` (its ``__init__``). Importing ``a.b.c`` also runs ``a`` and
``a.b`` first; those implied edges to enclosing packages are not counted.
"""

import ast
import pathlib
import re
from dataclasses import dataclass

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "emulator"

# emulator's top-level packages and modules, bottom first. A name may import only names in
# layers below its own; names that share a layer do not import each other. The package's
# own __init__ (the facade: ``from emulator import World``) sits above them all, and
# nothing inside the package imports it.
LAYERS = [
    ("errors", "_version"),
    ("arrays",),       # ShapeArray: arrays with a shape and no values
    ("machine",),      # topology, links, kernels, devices, declared work, precision policies, software stacks
    ("mesh",),
    ("algorithms",),   # collectives on stacked buffers, P2POp
    ("records",),      # calls, trace, timeline, memory ledger, tables
    ("cost",),
    ("engine",),       # World, Comm, the clock's streams
    ("nn",),
    ("accounting",),
    ("parallel",),
    ("training",),
    ("planner",),
    ("viz",),
    ("widgets",),
    ("grading",),
    ("notebook",),
]

# The only imports allowed inside a function: third-party packages loaded on first use,
# each for the reason given. A project module is never among them.
LAZY = {
    "greenlet": "World.run needs it, a notebook that only steps the global view does not",
}

# The only modules that import by name at run time (importlib.import_module, __import__),
# which the graph cannot see; none of them reaches another layer.
DYNAMIC = {
    "emulator": "``emulator.nn``, ``emulator.viz``, ... load on first use (module __getattr__)",
    "emulator.grading": "imports its own lessonNN modules to wrap their checks (progress.watch)",
    "emulator.grading.refuse": "imports itself: its code runs as a refused function's, under that function's globals",
}


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


def upward(all_edges, layers=LAYERS, package=PACKAGE):
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


def function_level(all_edges, lazy=LAZY):
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


@pytest.fixture(scope="module")
def real():
    return edges(sources())


def test_every_name_has_a_layer():
    names = {p.stem if p.is_file() else p.name for p in (ROOT / PACKAGE).iterdir()
             if (p.suffix == ".py" and p.name != "__init__.py") or (p / "__init__.py").exists()}
    listed = [n for layer in LAYERS for n in layer]
    assert sorted(names - set(listed)) == [], "give each new top-level module or package a place in LAYERS"
    assert sorted(set(listed) - names) == [], "LAYERS names something emulator/ no longer has"
    assert len(listed) == len(set(listed))


def test_no_import_goes_up_a_layer(real):
    assert upward(real) == []


def test_no_project_import_inside_a_function(real):
    assert function_level(real) == []


def test_imports_by_name_only_where_documented():
    found = dynamic_imports(sources())
    assert sorted({m for m, _ in found}) == sorted(DYNAMIC), found


def test_no_circles_between_modules(real):
    assert cycles(module_graph(real)) == []


def test_no_circles_between_top_level_names(real):
    assert cycles(top_graph(real)) == []


def test_readme_module_map_states_the_order():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("### Module map", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^(\d+)\. (.+)$", section, flags=re.M)
    stated = [tuple(re.findall(r"`([\w]+)/?`", line.split(":")[0])) for _, line in rows]
    assert stated == LAYERS, "README.md's module map lists the layers, bottom first, one line per layer"



# The checker itself: a synthetic package with one fault of each kind.

FAKE_LAYERS = [("errors",), ("low",), ("high",)]


def _package(files):
    """{module: (source, is_package)} from {"pkg/low/__init__.py": source, ...}."""
    out = {}
    for path, text in files.items():
        parts = path[:-3].split("/")
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        out[".".join(parts)] = (text, is_package)
    return out


def test_checker_flags_an_upward_import():
    mods = _package({
        "pkg/__init__.py": "from .high import run\n",
        "pkg/errors.py": "",
        "pkg/low/__init__.py": "",
        "pkg/low/a.py": "from ..high.b import thing\n",   # low reaches up to high
        "pkg/high/__init__.py": "",
        "pkg/high/b.py": "from ..low import a\nfrom .. import errors\nthing = 1\n",
    })
    found = edges(mods, "pkg")
    bad = upward(found, FAKE_LAYERS, "pkg")
    assert bad == ["pkg.low.a:1 imports pkg.high.b: an import of a higher layer (high above low)"]
    assert cycles(module_graph(found)) == [["pkg.high.b", "pkg.low.a"]]
    assert cycles(top_graph(found, "pkg")) == [["high", "low"]]


def test_checker_flags_an_upward_import_hidden_in_a_function():
    mods = _package({
        "pkg/errors.py": "def fail():\n    from .low.a import helper\n    import numpy\n    import greenlet\n",
        "pkg/low/__init__.py": "",
        "pkg/low/a.py": "from .. import errors\n\ndef helper():\n    pass\n",
    })
    found = edges(mods, "pkg")
    assert upward(found, FAKE_LAYERS, "pkg") == [
        "pkg.errors:2 imports pkg.low.a inside a function: an import of a higher layer (low above errors)"]
    assert [b.split(":")[0] + ":" + b.split(":")[1].split(" ")[0] for b in function_level(found)] == [
        "pkg.errors:2", "pkg.errors:3"]  # greenlet is a documented lazy import; numpy is not
    assert cycles(module_graph(found)) == [["pkg.errors", "pkg.low.a"]]


def test_checker_flags_a_circle_inside_a_layer_and_the_facade():
    mods = _package({
        "pkg/__init__.py": "",
        "pkg/errors.py": "",
        "pkg/low/__init__.py": "from .b import B\nA = 1\n",
        "pkg/low/b.py": "from . import A\nfrom .. import errors\nB = 2\n",  # the package's __init__ and b
        "pkg/high/__init__.py": "import pkg\nfrom pkg.low import b\n",
    })
    found = edges(mods, "pkg")
    assert cycles(module_graph(found)) == [["pkg.low", "pkg.low.b"]]
    assert upward(found, FAKE_LAYERS, "pkg") == [
        "pkg.high:1 imports pkg: nothing inside the package imports its facade; import the module"]
    assert Edge("pkg.high", "pkg.low.b", 2, False, True) in found
    assert Edge("pkg.low.b", "pkg.errors", 2, False, True) in found  # `from .. import errors` is the module


def test_checker_finds_imports_by_name():
    mods = _package({"pkg/a.py": "import importlib\n\ndef f():\n    return importlib.import_module('pkg.b')\n",
                     "pkg/b.py": "x = __import__('pkg.a')\n", "pkg/c.py": "import_it = 1\n"})
    assert dynamic_imports(mods) == [("pkg.a", 4), ("pkg.b", 1)]


def test_checker_flags_a_name_without_a_layer():
    mods = _package({"pkg/errors.py": "", "pkg/extra.py": "from . import errors\n"})
    assert upward(edges(mods, "pkg"), FAKE_LAYERS, "pkg") == [
        "pkg.extra:1 imports pkg.errors: 'extra' has no layer in LAYERS"]
