"""gpu_labs as a package: every module imports as ``gpu_labs.<name>``, none edits
``sys.path`` or is named after a standard-library module (``sys.stdlib_module_names``),
siblings are imported relatively, every file is under 300 lines, each lab's docstring
gives first the ``torchrun ... -m gpu_labs.<lab>`` command that runs it, and no torchrun
line in the course's sources runs a lab by its file path (a lab started so says how to
start it). Each rule is shown to catch a file that breaks it."""

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "gpu_labs"
FILES = sorted(PACKAGE.rglob("*.py"))
LABS = sorted(PACKAGE.glob("[0-9][0-9]_*.py"))
MAX_LINES = 300
# where a command that runs a lab is written (the notebooks are built from solutions/)
DOCS = [ROOT / "README.md", PACKAGE / "README.md", PACKAGE / "slurm.sbatch", *sorted((ROOT / "solutions").glob("*.py")),
        *FILES]


def module_of(path):
    """gpu_labs/torch_parallel/ddp.py -> gpu_labs.torch_parallel.ddp (a package by its folder)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def path_edits(source):
    """Line numbers where ``source`` reaches ``sys.path`` (under any alias) or
    ``site.addsitedir``: a module of a package has no business changing where imports look."""
    tree = ast.parse(source)
    sys_names = {a.asname or a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
                 if a.name == "sys"}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and (
                (node.value.id in sys_names and node.attr == "path") or node.attr == "addsitedir"):
            found.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module in ("sys", "site") and \
                any(a.name in ("path", "addsitedir") for a in node.names):
            found.append(node.lineno)
    return sorted(found)


def stdlib_shadows(paths):
    """The modules and packages among ``paths`` named after a standard-library module."""
    names = {p.parent.name if p.name == "__init__.py" else p.stem for p in paths}
    return sorted(n for n in names if n in sys.stdlib_module_names)


def absolute_sibling_imports(path, source):
    """Imports in ``source`` (the file at ``path``) of a sibling module by its bare name
    (``from common import ...``): they work only when the file's own folder is on
    ``sys.path``, that is, when the file runs as a script."""
    siblings = {p.stem for p in path.parent.glob("*.py")} | {p.parent.name for p in path.parent.glob("*/__init__.py")}
    bad = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module.split(".")[0] in siblings:
            bad.append(f"line {node.lineno}: from {node.module} import ...")
        elif isinstance(node, ast.Import):
            bad += [f"line {node.lineno}: import {a.name}" for a in node.names if a.name.split(".")[0] in siblings]
    return bad


def command_in_docstring(source):
    """The first torchrun command in the module's docstring (continuation lines joined), or None."""
    doc = ast.get_docstring(ast.parse(source)) or ""
    return next((line.strip() for line in re.sub(r"\\\n\s*", " ", doc).splitlines() if "torchrun " in line), None)


def lab_run_by_path(text):
    """Lines of ``text`` that run a lab by its file (``torchrun ... gpu_labs/NN_name.py``),
    continuation lines joined (also behind a comment's ``#``), which no longer runs."""
    joined = re.sub(r"\\\n[#\s]*", " ", text)
    return [line.strip() for line in joined.splitlines()
            if re.search(r"\b(torchrun|sbatch)\b", line) and re.search(r"gpu_labs/\d\d_\w+\.py", line)]


def test_there_are_labs_and_pieces_to_check():
    assert len(LABS) == 8 and (PACKAGE / "__init__.py").exists() and (PACKAGE / "torch_parallel" / "__init__.py").exists()


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_module_edits_sys_path(path):
    assert path_edits(path.read_text()) == [], f"{path.relative_to(ROOT)} reaches sys.path"


def test_no_module_is_named_after_a_standard_library_module():
    assert stdlib_shadows(FILES) == [], "rename them: a script run from gpu_labs/ would import them instead"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_siblings_are_imported_relatively(path):
    assert absolute_sibling_imports(path, path.read_text()) == []


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_file_is_under_300_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines < MAX_LINES, f"{path.relative_to(ROOT)} has {lines} lines: move a coherent piece into a module"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_every_module_imports_as_part_of_the_package(path):
    module = importlib.import_module(module_of(path))
    assert Path(module.__file__).resolve() == path.resolve()


@pytest.mark.parametrize("path", LABS, ids=lambda p: p.stem)
def test_each_lab_docstring_gives_the_command_that_runs_it(path):
    command = command_in_docstring(path.read_text())
    assert command and f" -m gpu_labs.{path.stem}" in command, command


def test_no_source_runs_a_lab_by_its_file_path():
    found = {str(p.relative_to(ROOT)): lab_run_by_path(p.read_text()) for p in DOCS}
    assert not any(found.values()), {k: v for k, v in found.items() if v}


def test_the_installed_package_finds_the_labs_from_any_folder(tmp_path):
    """What ``torchrun -m gpu_labs.06_mesh`` looks up, from a folder that is not the course's:
    the editable install maps gpu_labs (pyproject's package list), as it maps emulator."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", "import importlib.util; "
                          "print(importlib.util.find_spec('gpu_labs.06_mesh').origin)"],
                         capture_output=True, text=True, cwd=tmp_path, env=env, timeout=60)
    assert out.returncode == 0 and Path(out.stdout.strip()) == PACKAGE / "06_mesh.py", (
        f"{out.stdout}{out.stderr[-2000:]}\n(an install from before gpu_labs was in pyproject's package list? "
        f"make .venv/.installed-test reinstalls)")


@pytest.mark.parametrize("path", LABS[:1] + LABS[-1:], ids=lambda p: p.stem)
def test_a_lab_started_by_its_path_says_how_to_start_it(path, tmp_path):
    """``torchrun gpu_labs/00_collectives.py`` (a file, no package) stops before its
    relative imports with the ``-m`` command, not Python's "no known parent package"."""
    out = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, cwd=tmp_path, timeout=60)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert f"-m gpu_labs.{path.stem}" in out.stderr, out.stderr


# ---------------------------------------------------------------- each rule catches a breach
def test_the_checks_catch_a_module_that_breaks_them(tmp_path):
    assert path_edits("import sys\nsys.path.insert(0, '..')\n") == [2]
    assert path_edits("import sys as s\ns.path[:0] = ['..']\n") == [2]
    assert path_edits("from sys import path\npath.append('..')\n") == [1]
    assert path_edits("import site\nsite.addsitedir('..')\n") == [2]
    assert path_edits("import os\nimport sys\nprint(sys.argv, os.path.join('a', 'b'))\n") == []
    assert stdlib_shadows([tmp_path / "trace.py", tmp_path / "common.py", tmp_path / "logging" / "__init__.py"]) == \
        ["logging", "trace"]
    (tmp_path / "common.py").write_text("")
    (tmp_path / "lab.py").write_text("from common import init\nimport common.x\nfrom .common import init\n")
    assert absolute_sibling_imports(tmp_path / "lab.py", (tmp_path / "lab.py").read_text()) == \
        ["line 1: from common import ...", "line 2: import common.x"]
    assert command_in_docstring('"""Lab.\n\n    torchrun --nproc-per-node 2 gpu_labs/00_x.py\n"""') == \
        "torchrun --nproc-per-node 2 gpu_labs/00_x.py"
    assert lab_run_by_path("# torchrun --standalone --max-restarts 1 \\\n#     gpu_labs/07_checkpoint.py --fresh\n")
    assert lab_run_by_path("sbatch gpu_labs/slurm.sbatch gpu_labs/00_collectives.py\n")
    assert not lab_run_by_path("torchrun --standalone -m gpu_labs.07_checkpoint\nsee gpu_labs/07_checkpoint.py\n")
    assert module_of(PACKAGE / "torch_parallel" / "__init__.py") == "gpu_labs.torch_parallel"
    assert module_of(PACKAGE / "06_mesh.py") == "gpu_labs.06_mesh"
