"""The notebooks: fresh from their sources, graded both ways, and safe for a student's work.

Each answer key in solutions/ runs once, under strict ``pytest --nbval`` on another CPU's
kernels, and must reproduce its stored outputs. Here we prove the rest too: generated notebooks are not stale; a
student's notebook shows the lesson first, and opening it changes nothing; Run All on an
untouched lesson runs every cell, each check saying its exercise is not attempted, and
the summary at the end fails; a wrong answer is reported at its check, its message first;
the same notebook with the answers put back passes ``pytest --nbval-lax``; and a
filled-in lesson trips no test and is never overwritten by a rebuild.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import start_new_kernel
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

from emulator.grading import progress
from tools import build_notebooks as B

ROOT = Path(__file__).resolve().parent.parent
LESSONS = [p for p in B.sources() if B.exercises(p)]
PIPELINE = ROOT / "solutions" / "03_pipeline.py"


def ids(paths):
    return [p.stem for p in paths]


def generated(src):
    return ([ROOT / "solutions" / (src.stem + ".ipynb")] if B.exercises(src) else []) + [B.lesson_path(src)]


@pytest.mark.parametrize("src", B.sources(), ids=ids(B.sources()))
def test_generated_notebooks_are_fresh(src):
    edited = []
    for path in generated(src):
        status, why = B.freshness(path, src)
        if status == "edited":  # a student's lesson: theirs, not compared
            edited.append(why)
            continue
        assert status == "fresh", why
    if edited:
        pytest.skip("; ".join(edited))
    if B.exercises(src):
        lesson = nbformat.read(B.lesson_path(src), 4)
        assert all(not c.get("outputs") for c in lesson.cells if c.cell_type == "code"), "lesson has outputs"


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


def test_opening_a_notebook_changes_nothing_in_its_metadata():
    """JupyterLab writes the kernel's ``language_info`` and its spec (name, display name,
    language) into a notebook when the kernel starts; a notebook already holding exactly
    those is not marked modified. Ask a real kernel what it says."""
    nb = B.render(PIPELINE, "lessons")
    km, kc = start_new_kernel(kernel_name=nb.metadata["kernelspec"]["name"])
    try:
        info = kc.kernel_info(reply=True)["content"]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert nb.metadata["language_info"] == info["language_info"]
    spec = KernelSpecManager().get_kernel_spec(nb.metadata["kernelspec"]["name"])
    assert nb.metadata["kernelspec"] == {"name": "python3", "display_name": spec.display_name,
                                         "language": spec.language}


def with_answers(src, wrong=None):
    """The student notebook with every answer put back, as a student who solved it would;
    ``wrong`` = (a line of the answer, its replacement) puts one mistake in."""
    nb = B.render(src, "lessons")
    answers = B.render(src, "solutions")
    for cell, answer in zip(nb.cells, answers.cells):
        if "raise NotImplementedError(" in cell.source:
            cell.source = answer.source
            if wrong and wrong[0] in cell.source:
                cell.source = cell.source.replace(*wrong)
    return nb


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


def filled_in(src):
    """What a student's saved lesson looks like: answers in, and outputs of a run."""
    nb = with_answers(src)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.execution_count = 1
            cell.outputs = [nbformat.v4.new_output("stream", text="ran\n")]
    return nb


def test_a_students_lesson_is_not_stale_and_no_rebuild_erases_it(tmp_path):
    """``make test`` must not fail on a filled-in lesson, and nothing it says may lead to
    erasing the answers: the lesson counts as the student's, and the build keeps it
    unless forced."""
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    path = lessons / "03_pipeline.ipynb"
    assert B.write_lesson(PIPELINE, path)  # as built
    assert B.freshness(path, PIPELINE) == ("fresh", "")
    nbformat.write(filled_in(PIPELINE), path)
    status, why = B.freshness(path, PIPELINE)
    assert status == "edited" and "make notebooks" not in why
    before = path.read_bytes()
    assert not B.write_lesson(PIPELINE, path), "a rebuild overwrote a student's answers"
    assert path.read_bytes() == before
    assert "rename it" in B.kept_message(ROOT / "lessons" / path.name)

    # built from an older source: stale, and the advice keeps the answers
    nb = nbformat.read(path, 4)
    nb.metadata["course"]["source_sha256"] = "0" * 64
    nbformat.write(nb, path)
    status, why = B.freshness(path, PIPELINE)
    assert status == "stale" and "rename your copy" in why and why.index("rename") < why.rindex("make notebooks")
    assert not B.write_lesson(PIPELINE, path)

    # forced, it is replaced by the stubs
    assert B.write_lesson(PIPELINE, path, force=True)
    assert B.freshness(path, PIPELINE) == ("fresh", "")

    # a notebook built before fingerprints: kept when an answer replaced a stub
    old = B.render(PIPELINE, "lessons")
    del old.metadata["course"]["cells_sha256"]
    assert not B.edits(old)
    old.cells[[i for i, c in enumerate(old.cells) if "NotImplementedError" in c.source][0]].source = "x = 1"
    assert B.edits(old)


def test_a_rebuild_copies_a_lesson_that_may_hold_work_before_it_replaces_it(tmp_path, monkeypatch, capsys):
    """``make notebooks FORCE=1``, a lesson without course metadata, one of an older format,
    one that cannot be read: each is copied to ``lessons/.backup/`` (dated, named in the
    output) before it is replaced; a lesson as built is replaced with no copy."""
    lessons = tmp_path / "lessons"
    lessons.mkdir()
    path = lessons / "03_pipeline.ipynb"

    def replaced(nb=None, text=None, force=False):
        nbformat.write(nb, path) if nb is not None else path.write_text(text)
        before = path.read_bytes()
        written = B.write_lesson(PIPELINE, path, force=force)
        assert written and B.freshness(path, PIPELINE) == ("fresh", "")
        return written.backup, before

    backup, before = replaced(filled_in(PIPELINE), force=True)
    assert backup.parent == lessons / ".backup" and backup.read_bytes() == before
    assert re.fullmatch(r"03_pipeline\.\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d(-\d+)?\.ipynb", backup.name), backup.name
    assert B.write_lesson(PIPELINE, path, force=True).backup is None  # as built: nothing to keep
    bare = filled_in(PIPELINE)
    bare.metadata = {}
    for nb in (bare, B.render(PIPELINE, "lessons")):  # no course metadata; an older format (no fingerprint)
        nb.metadata.get("course", {}).pop("cells_sha256", None)
        backup, before = replaced(nb)
        assert backup.read_bytes() == before
    backup, before = replaced(text="{not a notebook")
    assert backup.read_bytes() == before
    assert len(set((lessons / ".backup").iterdir())) == 4  # one copy each, none overwritten
    old = B.render(PIPELINE, "lessons")  # older format and edited: kept, as before, unless forced
    del old.metadata["course"]["cells_sha256"]
    old.cells[[i for i, c in enumerate(old.cells) if "NotImplementedError" in c.source][0]].source = "x = 1"
    nbformat.write(old, path)
    assert not B.write_lesson(PIPELINE, path)
    monkeypatch.setattr(B, "build", lambda src, force=False: ([], None, B.ROOT / "lessons" / ".backup" / "x.ipynb"))
    B.main(["03"])
    assert "backed up the lesson it replaced, as it was, to lessons/.backup/x.ipynb" in capsys.readouterr().out


def test_a_hand_edited_generated_notebook_is_stale(tmp_path):
    """The freshness check still bites: a solution cell changed by hand, a lesson built
    from an older source, a course map out of date."""
    sol = tmp_path / "solutions" / "03_pipeline.ipynb"
    sol.parent.mkdir()
    nb = nbformat.read(ROOT / "solutions" / "03_pipeline.ipynb", 4)
    nb.cells[1].source += "\nprint('edited by hand')"
    nbformat.write(nb, sol)
    assert B.freshness(sol, PIPELINE)[0] == "stale"
    lesson = tmp_path / "lessons" / "03_pipeline.ipynb"
    lesson.parent.mkdir()
    old = B.render(PIPELINE, "lessons")
    old.metadata["course"]["source_sha256"] = "0" * 64
    nbformat.write(old, lesson)
    status, why = B.freshness(lesson, PIPELINE)
    assert status == "stale" and why.endswith("then run `make notebooks`")
    index = tmp_path / "lessons" / "index.md"
    index.write_text(B.render_index(ROOT / "solutions" / "index.py").replace("Start here", "Begin"))
    assert B.freshness(index, ROOT / "solutions" / "index.py")[0] == "stale"


def test_stub_replaces_only_the_answer():
    code = "def f(x):\n    y = 1\n    ### BEGIN SOLUTION: Exercise 9.1: f\n    return x + y\n    ### END SOLUTION\n"
    stub, names = B.split_solutions(code, keep=False)
    assert stub == 'def f(x):\n    y = 1\n    raise NotImplementedError("Exercise 9.1: f")'
    assert names == ["Exercise 9.1: f"]
    kept, _ = B.split_solutions(code, keep=True)
    assert kept == "def f(x):\n    y = 1\n    return x + y"
    with pytest.raises(ValueError, match="without END"):
        B.split_solutions("### BEGIN SOLUTION\nx = 1", keep=True)


def test_the_course_map_is_a_page_with_the_lessons_before_the_instructors():
    """No code, so no kernel: Markdown. A student reads where to start and the lessons
    before anything meant for instructors."""
    page = B.lesson_path(ROOT / "solutions" / "index.py")
    assert page.suffix == ".md" and not (ROOT / "lessons" / "index.ipynb").exists()
    text = page.read_text()
    start, table, how, grade, instructors = (text.index(s) for s in (
        "## Start here", "## Lessons", "## How to work through a lesson", "make grade LESSON=", "## For instructors"))
    assert start < table < how < grade < instructors
    assert "lesson 00" in text[start:table]
    assert text.index("tools.grade SUBMISSIONS_DIR") > instructors
    assert "fails at the first check" not in text


# Another CPU, as far as one machine can pretend: OpenBLAS's Sandybridge kernels on one
# thread, and NumPy without its AVX2/AVX-512 loops, change the order of every float sum.
OTHER_CPU = {"OPENBLAS_CORETYPE": "Sandybridge", "OPENBLAS_NUM_THREADS": "1",
             "NPY_DISABLE_CPU_FEATURES": "AVX2 FMA3 F16C AVX512F AVX512CD AVX512_SKX"}


KEYS = sorted((ROOT / "solutions").glob("[0-9]*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("key", KEYS, ids=[k.stem for k in KEYS])
def test_the_answer_key_reproduces_its_outputs_on_another_cpu(key):
    """The answer key, run by strict nbval, reproduces every stored output, and does so on
    another CPU: nbval compares printed text exactly, so a digit of float32 round-off
    printed by a cell would fail on a grader's machine with other BLAS kernels (print a
    checked bound instead, or a float64 round-off, which tools/nbval_sanitize.cfg masks).
    This is the one run of each answer key in the suite; the notebooks were built, and their
    outputs stored, on this machine's own kernels."""
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(key.relative_to(ROOT))],
                         capture_output=True, text=True, cwd=ROOT, timeout=900, env={**os.environ, **OTHER_CPU})
    assert run.returncode == 0, f"{key.name} on another CPU's kernels:\n" + run.stdout[-6000:]
    assert re.search(r"\d+ passed", run.stdout) and " failed" not in run.stdout, run.stdout[-2000:]


def test_the_course_maps_grading_example_names_lesson_03s_exercises():
    """The course map shows what `make grade` prints for lesson 03; its lines must name the
    lesson's exercises as the grader does, in order, and count all of them."""
    _, names = B.split_solutions(PIPELINE.read_text(), keep=False)
    page = (ROOT / "solutions" / "index.py").read_text()
    head = next(line for line in page.splitlines() if line.startswith("# lessons/03_pipeline.ipynb: "))
    assert f" of {len(names)} exercises passed" in head, head
    shown = [line[2:].strip() for line in page.splitlines()
             if line[2:].lstrip().startswith(("PASS ", "FAIL ", "NOT ATTEMPTED "))]
    assert len(shown) == len(names), shown
    for line, name in zip(shown, names):
        assert line.split("  ", 1)[1].strip().startswith(name), (line, name)
