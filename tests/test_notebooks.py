"""The notebooks graded both ways.

Each answer key in solutions/ runs once, under strict ``pytest --nbval`` on another CPU's
kernels, and must reproduce its stored outputs. Here we prove the rest too: a student's
notebook shows the lesson first; a wrong answer is reported at its check, its message
first; the same notebook with the answers put back holds the answer key's code and passes
``pytest --nbval-lax``. Run All on each untouched lesson, to its summary, runs once, in
JupyterLab (tests/browser/test_jupyterlab.py). (Fresh from their sources and safe for a
student's work: tests/test_notebook_builds.py.)
"""

import os
import re
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from emulator.grading import progress
from tests._notebooks import LESSONS, PIPELINE, ROOT, assert_untouched_run, code_cells_of, errors, ids, text, with_answers
from tests._torch_block import blocked_ipython_dir, imports_torch
from tools import build_notebooks as B


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


def execute_every_cell(nb):
    """Every cell, top to bottom, going on past errors (as the grader does); Run All in
    JupyterLab would stop at the first cell with an error."""
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(ROOT / "lessons")}}).execute()


def nbval_lax(path):
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                           "-o", "addopts=", "--rootdir", str(path.parent), str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=900)


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
    time was asked: its check is the first cell with an error, so Run All (which stops at
    the first error) stops there; the error is the check's message alone (no frame of the
    grading code), saying what was expected and what came. With the run going on, as the
    grader runs it, the summary lists it as failed and the rest passed. (Run All in
    JupyterLab stopping at that check: tests/browser/test_jupyterlab.py.)"""
    swap = ("return m_ideal, m_ideal * seqs_per_micro, m_total", "return m_total, m_total * seqs_per_micro, m_total")
    nb = with_answers(PIPELINE, wrong=swap)
    execute_every_cell(nb)
    check = next(c for c in code_cells_of(nb, "check") if "problem_8_2" in c.source)
    first = next((c for c in nb.cells if c.cell_type == "code" and errors(c)), None)
    assert first is check, "the wrong answer's check is not where Run All stops: " + (first or {}).get("source", "")[:80]
    err, = errors(check)
    assert err.ename == "CheckFailed"
    assert err.traceback == [f"CheckFailed: {err.evalue}"]
    assert err.evalue.startswith("Problem 8.2 (micro-batches, bubble over the ideal time, p=12, target=0.05")
    assert err.evalue.endswith("): expected 220, got 209: that is the count for the bubble as a share of the whole "
                               "step; this number asks for it over the ideal time"), err.evalue
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


def a_clean_untouched_run(src):
    """What Run All on the untouched lesson ``src`` leaves when all is well, written by hand:
    every cell numbered, each check saying not attempted, the summary's message alone."""
    nb = B.render(src, "lessons")
    names = B.exercise_names(src)
    for n, cell in enumerate(c for c in nb.cells if c.cell_type == "code"):
        cell.execution_count = n + 1
    for cell, name in zip(code_cells_of(nb, "check"), names):
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"NOT ATTEMPTED {name}. Replace ...\n")]
    summary, = code_cells_of(nb, "summary")
    evalue = f"0 of {len(names)} exercises passed"
    summary.outputs = [nbformat.v4.new_output("stream", name="stdout", text="\n".join(
        [evalue] + [progress.status_line(progress.NOT_ATTEMPTED, name) for name in names]) + "\n"),
        nbformat.v4.new_output("error", ename="NotAllPassed", evalue=evalue, traceback=[f"NotAllPassed: {evalue}"])]
    return nb


def test_the_untouched_run_check_fails_on_each_thing_a_run_can_get_wrong():
    """The check the browser's Run All of each untouched lesson ends with passes a clean run
    and fails one that stopped early, has a second error, shows a frame of the grading
    code, or lost a check's line or a summary's line."""
    assert_untouched_run(a_clean_untouched_run(PIPELINE), PIPELINE)

    def broken(edit):
        nb = a_clean_untouched_run(PIPELINE)
        edit(nb, [c for c in nb.cells if c.cell_type == "code"])
        with pytest.raises(AssertionError):
            assert_untouched_run(nb, PIPELINE)

    broken(lambda nb, code: setattr(code[-1], "execution_count", None))  # Run All stopped before the summary
    broken(lambda nb, code: code[0].outputs.append(nbformat.v4.new_output(
        "error", ename="NameError", evalue="x", traceback=["NameError: x"])))  # a demo failed
    broken(lambda nb, code: code_cells_of(nb, "summary")[0].outputs[1].traceback.insert(0, "Traceback (most recent"))
    broken(lambda nb, code: code_cells_of(nb, "check")[2].outputs.clear())  # a check said nothing
    broken(lambda nb, code: setattr(code_cells_of(nb, "summary")[0].outputs[0], "text", "0 of 6 exercises passed\n"))
    broken(lambda nb, code: setattr(code_cells_of(nb, "summary")[0].outputs[1], "evalue", "5 of 6 exercises passed"))
