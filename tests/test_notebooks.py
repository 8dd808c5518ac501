"""The notebooks graded both ways.

Each answer key in solutions/ runs once, under strict ``pytest --nbval`` on another CPU's
kernels, and must reproduce its stored outputs. Here we prove the rest too: a student's
notebook shows the lesson first; Run All on an untouched lesson runs every cell, each check
saying its exercise is not attempted, and the summary at the end fails; a wrong answer is
reported at its check, its message first; the same notebook with the answers put back
holds the answer key's code and passes ``pytest --nbval-lax``. (Fresh from their sources
and safe for a student's work: tests/test_notebook_builds.py.)
"""

import os
import re
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from emulator.grading import progress
from tests._notebooks import PIPELINE, ROOT, ids, with_answers
from tests._torch_block import blocked_ipython_dir, imports_torch
from tools import build_notebooks as B

LESSONS = [p for p in B.sources() if B.exercises(p)]


def code_cells_of(nb, tag):
    return [c for c in nb.cells if c.cell_type == "code" and tag in c.metadata.get("tags", [])]


@pytest.mark.parametrize("src", LESSONS, ids=ids(LESSONS))
def test_a_student_sees_the_lesson_and_its_summary(src):
    """The lesson opens on its title, not on a note for maintainers; it closes with the
    summary of every exercise and a small line naming its source."""
    nb = B.render(src, "lessons")
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# Lesson"), nb.cells[0].source
    assert not any("make notebooks" in c.source or "Generated from" in c.source for c in nb.cells)
    assert nb.cells[-1].cell_type == "markdown" and f"`{src.relative_to(ROOT).as_posix()}`" in nb.cells[-1].source
    assert nb.metadata["course"]["source"] == src.relative_to(ROOT).as_posix()
    summary, = code_cells_of(nb, "summary")
    assert nb.cells.index(summary) == len(nb.cells) - 2
    labels = [progress.label_in(name) for name in B.exercise_names(src)]
    assert [progress.label_in(line.strip().strip('",')) for line in summary.source.splitlines()[3:-1]] == labels
    assert len(set(labels)) == len(labels) >= 1


def execute(nb, allow_errors):
    """Run All, as JupyterLab does: top to bottom, stopping at the first error unless
    ``allow_errors``. Returns the error that stopped it, or None."""
    try:
        NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=allow_errors,
                       resources={"metadata": {"path": str(ROOT / "lessons")}}).execute()
    except CellExecutionError as exc:
        return exc
    return None


def errors(cell):
    return [o for o in cell.get("outputs", []) if o.output_type == "error"]


def text(cell):
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")


def nbval_lax(path):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                           "-o", "addopts=", "--rootdir", str(path.parent), str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("src", LESSONS, ids=ids(LESSONS))
def test_run_all_runs_an_untouched_lesson_to_its_summary(src):
    """Every cell runs; each check says its exercise is not attempted and lets the lesson
    go on (demos use the library, never a stub); the summary, last, lists every exercise
    as not attempted and is the only cell that fails."""
    nb = B.render(src, "lessons")
    stopped = execute(nb, allow_errors=False)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), f"Run All stopped early: {stopped}"
    failing = [c for c in code if errors(c)]
    assert failing == code_cells_of(nb, "summary"), [(c.source[:60], errors(c)[0].evalue) for c in failing]
    err, = errors(failing[0])
    assert err.ename == "NotAllPassed" and err.evalue.startswith("0 of ")
    assert err.traceback == [f"NotAllPassed: {err.evalue}"]  # the message, and nothing else
    said = "".join(text(c) for c in code_cells_of(nb, "check"))
    for name in B.exercise_names(src):
        assert f"NOT ATTEMPTED {name}" in said or f"NOT ATTEMPTED {progress.label_in(name)} builds on" in said, name
        assert progress.status_line(progress.NOT_ATTEMPTED, name) in text(failing[0])


def code_of(nb):
    return [(c.source, sorted(c.metadata.get("tags", []))) for c in nb.cells if c.cell_type == "code"]


@pytest.mark.parametrize("src", LESSONS, ids=ids(LESSONS))
def test_a_solved_lesson_runs_the_answer_keys_code(src):
    """A student's lesson with its answers put back holds the answer key's code, cell for
    cell and tag for tag, so the strict nbval run of solutions/ (on another CPU, below)
    proves it passes: the lesson need not run again to show it."""
    key = nbformat.read(ROOT / "solutions" / (src.stem + ".ipynb"), 4)
    assert code_of(with_answers(src)) == code_of(key)


def test_the_answer_key_comparison_sees_one_changed_answer():
    solved, key = with_answers(PIPELINE), nbformat.read(ROOT / "solutions" / (PIPELINE.stem + ".ipynb"), 4)
    stubbed = B.render(PIPELINE, "lessons")
    i = next(i for i, c in enumerate(stubbed.cells) if "raise NotImplementedError(" in c.source)
    solved.cells[i].source = solved.cells[i].source.replace("return", "return 0 *", 1)
    assert code_of(solved) != code_of(key)


@pytest.mark.slow
@pytest.mark.parametrize("src", [p for p in LESSONS if p.stem.startswith("04")], ids=lambda p: p.stem)
def test_nbval_lax_fails_an_untouched_lesson_and_passes_a_solved_one(src, tmp_path):
    """The plumbing an instructor's ``pytest --nbval-lax`` relies on, on one lesson (every
    lesson's untouched run and solved code are checked above)."""
    untouched = tmp_path / "untouched.ipynb"
    nbformat.write(B.render(src, "lessons"), untouched)
    bad = nbval_lax(untouched)
    assert bad.returncode != 0, "an untouched lesson passed its checks"
    assert "1 failed" in bad.stdout and "NotAllPassed" in bad.stdout, bad.stdout[-3000:]  # its summary, only
    solved = tmp_path / "solved.ipynb"
    nbformat.write(with_answers(src), solved)
    good = nbval_lax(solved)
    assert good.returncode == 0, good.stdout[-3000:]


@pytest.mark.slow
def test_a_wrong_answer_is_reported_at_its_check_message_first():
    """Problem 8.2 answered with the idle share of the step where the bubble over the ideal
    time was asked: Run All stops at its check, whose error is the check's message alone
    (no frame of the grading code), saying what was expected and what came; with the run
    going on (as the grader runs it), the summary lists it as failed and the rest passed."""
    swap = ("return m_ideal, m_ideal * seqs_per_micro, m_total", "return m_total, m_total * seqs_per_micro, m_total")
    nb = with_answers(PIPELINE, wrong=swap)
    stopped = execute(nb, allow_errors=False)
    check = next(c for c in code_cells_of(nb, "check") if "problem_8_2" in c.source)
    assert stopped is not None and errors(check), "the wrong answer did not stop Run All at its check"
    err, = errors(check)
    assert err.ename == "CheckFailed"
    assert err.traceback == [f"CheckFailed: {err.evalue}"]
    assert err.evalue.startswith("Problem 8.2 (micro-batches, bubble over the ideal time, p=12, target=0.05")
    assert err.evalue.endswith("): expected 220, got 209: that is the count for the bubble as a share of the whole "
                               "step; this number asks for it over the ideal time"), err.evalue

    nb = with_answers(PIPELINE, wrong=swap)
    execute(nb, allow_errors=True)
    summary, = code_cells_of(nb, "summary")
    lines = text(summary).splitlines()
    assert lines[0] == "5 of 6 exercises passed"
    assert lines[1].startswith("failed         Problem 8.2: micro-batches for a small bubble: (micro-batches")
    assert all(line.startswith("passed ") for line in lines[2:])


# Another CPU, as far as one machine can pretend: OpenBLAS's Sandybridge kernels on one
# thread, and NumPy without its AVX2/AVX-512 loops, change the order of every float sum.
OTHER_CPU = {"OPENBLAS_CORETYPE": "Sandybridge", "OPENBLAS_NUM_THREADS": "1",
             "NPY_DISABLE_CPU_FEATURES": "AVX2 FMA3 F16C AVX512F AVX512CD AVX512_SKX"}


KEYS = sorted((ROOT / "solutions").glob("[0-9]*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("key", KEYS, ids=[k.stem for k in KEYS])
def test_the_answer_key_reproduces_its_outputs_on_another_cpu(key, tmp_path):
    """The answer key, run by strict nbval, reproduces every stored output, and does so on
    another CPU: nbval compares printed text exactly, so a digit of float32 round-off
    printed by a cell would fail on a grader's machine with other BLAS kernels (print a
    checked bound instead, or a float64 round-off, which tools/nbval_sanitize.cfg masks).
    This is the one run of each answer key in the suite; the notebooks were built, and their
    outputs stored, on this machine's own kernels. A lesson that never imports torch runs in
    a kernel where torch cannot be imported (tests/_torch_block.py), which proves it needs
    none; one that compares with torch runs with it (and again without it, in
    tests/test_missing_dependencies.py)."""
    env = {**os.environ, **OTHER_CPU}
    mark = None
    if not imports_torch(key.stem):
        env["IPYTHONDIR"], mark = (str(x) for x in blocked_ipython_dir(tmp_path))
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(key.relative_to(ROOT))],
                         capture_output=True, text=True, cwd=ROOT, timeout=900, env=env)
    assert run.returncode == 0, f"{key.name} on another CPU's kernels:\n" + run.stdout[-6000:]
    assert re.search(r"\d+ passed", run.stdout) and " failed" not in run.stdout, run.stdout[-2000:]
    if mark:  # the kernel ran without torch
        assert open(mark).read() == "None", f"{key.name}: torch in the kernel's sys.modules: {open(mark).read()}"
