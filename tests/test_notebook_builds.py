"""The notebooks fresh from their sources and safe for a student's work: generated
notebooks are not stale, and a hand-edited one is; opening a lesson changes nothing; a
filled-in lesson trips no test and is never overwritten by a rebuild, which copies a lesson
that may hold work before replacing it; a stub replaces only the answer; the course map is
a page, lessons before instructors, whose grading example names lesson 03's exercises."""

import re

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import start_new_kernel

from tests._notebooks import PIPELINE, ROOT, ids, with_answers
from tools import build_notebooks as B


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
