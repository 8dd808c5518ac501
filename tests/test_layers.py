"""The emulator's layers: every import points down the order below (README.md's module map
says the same), no modules import each other in a circle, and no project module is
imported inside a function, where an upward edge or a circle would hide. The graph,
read from the source, and its checks are in tests/_import_graph.py; they are shown here
to catch a fault of each kind in a synthetic package.
"""

import re

import pytest

from tests._import_graph import (PACKAGE, ROOT, Edge, cycles, dynamic_imports, edges, function_level, module_graph,
                                 sources, top_graph, upward)


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
    assert upward(real, LAYERS) == []


def test_no_project_import_inside_a_function(real):
    assert function_level(real, LAZY) == []


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
    assert [b.split(":")[0] + ":" + b.split(":")[1].split(" ")[0] for b in function_level(found, LAZY)] == [
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
