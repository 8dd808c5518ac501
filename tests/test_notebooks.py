"""The notebooks: fresh from their sources, and graded both ways.

``pytest --nbval`` on solutions/ (collected by this same run) proves the answer key runs
and reproduces its outputs. Here we prove the rest: generated notebooks are not stale, an
untouched student notebook fails at its check cells, and the same notebook with the
answers put back passes ``pytest --nbval-lax``.
"""

import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from tools import build_notebooks as B

ROOT = Path(__file__).resolve().parent.parent
LESSONS = [p for p in B.sources() if B.exercises(p)]


def ids(paths):
    return [p.stem for p in paths]


@pytest.mark.parametrize("src", B.sources(), ids=ids(B.sources()))
def test_generated_notebooks_are_fresh(src):
    kinds = ["lessons", "solutions"] if B.exercises(src) else ["lessons"]
    for kind in kinds:
        path = ROOT / kind / (src.stem + ".ipynb")
        assert path.exists(), f"{path} is missing: run `make notebooks`"
        nb = nbformat.read(path, 4)
        fresh = B.render(src, kind)
        stale = f"{path.relative_to(ROOT)} is stale: edit {src.relative_to(ROOT)}, then run `make notebooks`"
        assert nb.metadata["course"]["source_sha256"] == B.sha256(src), stale
        assert [(c.cell_type, c.source) for c in nb.cells] == [(c.cell_type, c.source) for c in fresh.cells], stale
        assert "Generated from" in nb.cells[0].source
    lesson = nbformat.read(ROOT / "lessons" / (src.stem + ".ipynb"), 4)
    assert all(not c.get("outputs") for c in lesson.cells if c.cell_type == "code"), "lesson has outputs"


@pytest.mark.parametrize("src", LESSONS, ids=ids(LESSONS))
def test_solutions_are_executed(src):
    nb = nbformat.read(ROOT / "solutions" / (src.stem + ".ipynb"), 4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), "solutions must be executed: run `make notebooks`"
    checks = [c for c in code if "check" in c.metadata.get("tags", [])]
    assert checks and all("PASSED" in "".join(o.get("text", "") for o in c.outputs) for c in checks)


def filled_in(src):
    """The student notebook with every answer put back, as a student who solved it would."""
    stub = nbformat.read(ROOT / "lessons" / (src.stem + ".ipynb"), 4)
    answers = B.render(src, "solutions")
    for cell, answer in zip(stub.cells, answers.cells):
        if "raise NotImplementedError(" in cell.source:
            cell.source = answer.source
    return stub


def nbval_lax(path):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                           "-o", "addopts=", "--rootdir", str(path.parent), str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("src", LESSONS, ids=ids(LESSONS))
def test_grading_bites_both_ways(src, tmp_path):
    untouched = tmp_path / "untouched.ipynb"
    nbformat.write(nbformat.read(ROOT / "lessons" / (src.stem + ".ipynb"), 4), untouched)
    bad = nbval_lax(untouched)
    assert bad.returncode != 0, "an untouched lesson passed its checks"
    # it fails where it should: executing it, every check cell raises "Exercise ..." / "Napkin ..."
    nb = nbformat.read(untouched, 4)
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(ROOT / "lessons")}}).execute()
    checks = [c for c in nb.cells if "check" in c.metadata.get("tags", [])]
    errors = [c for c in nb.cells if any(o.output_type == "error" for o in c.get("outputs", []))]
    assert checks and all(c in errors for c in checks), "some check cell did not fail"
    assert all("check" in c.metadata.get("tags", []) for c in errors), \
        "an error outside the check cells: the stubs must only fail when checked"
    for c in checks:
        err = [o for o in c.outputs if o.output_type == "error"][0]
        assert err.ename == "NotImplementedError" and err.evalue.split(":")[0].split()[0] in ("Exercise", "Napkin", "Problem")
    solved = tmp_path / "solved.ipynb"
    nbformat.write(filled_in(src), solved)
    good = nbval_lax(solved)
    assert good.returncode == 0, good.stdout[-3000:]


def test_stub_replaces_only_the_answer():
    code = "def f(x):\n    y = 1\n    ### BEGIN SOLUTION: Exercise 9.1: f\n    return x + y\n    ### END SOLUTION\n"
    stub, names = B.split_solutions(code, keep=False)
    assert stub == 'def f(x):\n    y = 1\n    raise NotImplementedError("Exercise 9.1: f")'
    assert names == ["Exercise 9.1: f"]
    kept, _ = B.split_solutions(code, keep=True)
    assert kept == "def f(x):\n    y = 1\n    return x + y"
    with pytest.raises(ValueError, match="without END"):
        B.split_solutions("### BEGIN SOLUTION\nx = 1", keep=True)


# Another CPU, as far as one machine can pretend: OpenBLAS's Sandybridge kernels on one
# thread, and NumPy without its AVX2/AVX-512 loops, change the order of every float sum.
OTHER_CPU = {"OPENBLAS_CORETYPE": "Sandybridge", "OPENBLAS_NUM_THREADS": "1",
             "NPY_DISABLE_CPU_FEATURES": "AVX2 FMA3 F16C AVX512F AVX512CD AVX512_SKX"}


@pytest.mark.slow
def test_stored_outputs_do_not_depend_on_the_cpu():
    """nbval compares printed text exactly, so a digit of float32 round-off printed by a
    cell fails on a grader's machine with other BLAS kernels. Print a checked bound instead
    (or a float64 round-off, which tools/nbval_sanitize.cfg masks)."""
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "solutions"],
                         capture_output=True, text=True, cwd=ROOT, timeout=900,
                         env={**os.environ, **OTHER_CPU})
    assert run.returncode == 0, "outputs change with the CPU's kernels:\n" + run.stdout[-4000:]
