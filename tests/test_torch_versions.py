"""The GPU labs use only names that torch 2.4 has, so they run on the torch a course
cluster's CUDA image ships (2.4 and later).

Every torch name the labs reach (``torch.x.y``, ``dist.x``, ``from torch.x import y``)
must be in ``tests/torch_2_4_names.txt``, a list of names each found by importing and
resolving it in torch 2.4.1 (``python tests/test_torch_versions.py --resolve`` there
prints which of the labs' names resolve, to extend the list after checking a new name).
Names newer than 2.4 are allowed only where the lab falls back or says it skipped: in a
``try`` whose ``except ImportError`` imports the older place, or on a line that says
"not in torch 2.4". Tensor methods are checked too: any attribute the labs call that is
a ``torch.Tensor`` attribute today must be one in 2.4.
"""

import ast
import importlib
import sys
from pathlib import Path

try:
    import pytest
except ImportError:  # run as a script under another torch, to resolve names
    pytest = None
import torch

ROOT = Path(__file__).resolve().parent.parent
LABS = sorted((ROOT / "gpu_labs").rglob("*.py"))
LISTED = ROOT / "tests" / "torch_2_4_names.txt"
GUARD = "not in torch 2.4"


def _guarded_lines(tree):
    """Lines inside a ``try`` body that has an ``except ImportError`` fallback."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(
                isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                for h in node.handlers if h.type is not None):
            for stmt in node.body:
                lines.update(range(stmt.lineno, stmt.end_lineno + 1))
    return lines


def _chain(node):
    """``a.b.c`` -> ["a", "b", "c"]; None if the chain does not start at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id] + parts[::-1]
    return None


def torch_names(path):
    """(torch dotted names, attribute names used on other objects) in one file."""
    source = path.read_text()
    tree = ast.parse(source)
    src_lines = source.splitlines()
    guarded = _guarded_lines(tree)
    aliases, names, attrs = {}, set(), set()

    def skip(node):
        return node.lineno in guarded or GUARD in src_lines[node.lineno - 1]

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "torch":
                    aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else "torch"
                    if not skip(node):
                        names.add(a.name)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            for a in node.names:
                aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                if not skip(node):
                    names.add(f"{node.module}.{a.name}")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):  # inner chains too: "torch.a" of "torch.a.b" must exist as well
            chain = _chain(node)
            if chain is None:
                attrs.add(node.attr)
                continue
            if chain[0] in aliases and not skip(node):
                names.add(".".join([aliases[chain[0]]] + chain[1:]))
            elif chain[0] not in aliases:
                attrs.add(node.attr)
    return names, attrs


def all_names():
    names, attrs = set(), set()
    for path in LABS:
        n, a = torch_names(path)
        names |= n
        attrs |= a
    return names, attrs


def resolve(name):
    """Import the longest module prefix of ``name``, then getattr the rest; True if found."""
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for p in parts[cut:]:
                obj = getattr(obj, p)
            return True
        except AttributeError:
            return False
    return False


def listed():
    lines = [l.split("#")[0].strip() for l in LISTED.read_text().splitlines()]
    return {l for l in lines if l}


def test_every_torch_name_the_labs_use_is_in_torch_2_4():
    names, _ = all_names()
    ok = listed()
    missing = sorted(n for n in names if n not in ok and not n.startswith("torch.Tensor."))
    assert not missing, ("names not checked against torch 2.4 (resolve them there and add them to "
                         f"{LISTED.name}, or guard them): {missing}")


# attribute names the labs use only on other objects, which today's torch.Tensor happens to have too
NOT_ON_TENSORS = {"index": "list.index and torch.device.index"}


def test_tensor_methods_the_labs_call_exist_in_torch_2_4():
    _, attrs = all_names()
    ok = listed()
    used = sorted(a for a in attrs if hasattr(torch.Tensor, a) and not a.startswith("__") and a not in NOT_ON_TENSORS)
    missing = [a for a in used if f"torch.Tensor.{a}" not in ok]
    assert not missing, f"tensor methods not checked against torch 2.4: {missing}"


def test_the_check_would_catch_a_name_newer_than_2_4(tmp_path):
    """A lab calling torch 2.13's new names fails the check (the scan sees them, the list lacks them)."""
    for name in ("torch.distributed.reduce_scatter_single", "torch.distributed.all_gather_single"):
        lab = tmp_path / "lab.py"
        lab.write_text(f"import torch.distributed as dist\n\ndef f(o, t):\n    return dist.{name.rsplit('.', 1)[1]}(o, t)\n")
        names, _ = torch_names(lab)
        assert name in names and name not in listed()


def test_a_guarded_import_is_allowed_and_its_fallback_checked(tmp_path):
    lab = tmp_path / "lab.py"
    lab.write_text("try:\n    from torch.distributed.tensor import DTensor\nexcept ImportError:\n"
                   "    from torch.distributed._tensor import DTensor\n")
    names, _ = torch_names(lab)
    assert names == {"torch.distributed._tensor.DTensor"}


if __name__ == "__main__":  # run with torch 2.4 to see which of the labs' names it has
    names, attrs = all_names()
    if "--resolve" in sys.argv:
        for n in sorted(names):
            print(n if resolve(n) else f"# MISSING in {torch.__version__}: {n}")
        for a in sorted(attrs):
            if hasattr(torch.Tensor, a) and not a.startswith("__"):
                print(f"torch.Tensor.{a}")
