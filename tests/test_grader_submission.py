"""What the grader runs instead of a submission, without a kernel: its exercise cells found
by their label ids (in a notebook of an older layout too), by position or content in one
built before those ids, put into the course's own notebook; bad files refused, each with
its reason."""

from pathlib import Path

import nbformat
import pytest

from tools import build_notebooks as B
from tools.grader.submission import BadSubmission, Course, assemble, locate, read_notebook

ROOT = Path(__file__).resolve().parent.parent
LESSON = ROOT / "solutions" / "00_collectives.py"
COURSE = Course(ROOT)


def answered(src=LESSON):
    """The lesson with every answer in, as a student hands it in."""
    nb, answers = B.render(src, "lessons"), B.render(src, "solutions")
    for cell, answer in zip(nb.cells, answers.cells):
        if "raise NotImplementedError(" in cell.source:
            cell.source = answer.source
    return nb


def write(nb, path):
    nbformat.write(nb, path)
    return path


def test_exercise_ids_come_from_labels_not_titles_or_positions(tmp_path):
    """Exercise 0.4's cell is ``exercise-0-4`` whatever its title and wherever it sits."""
    src = tmp_path / "solutions" / LESSON.name
    src.parent.mkdir()
    text = LESSON.read_text().replace("Exercise 0.4: SPMD ring all-reduce", "Exercise 0.4: a title renamed")
    text = text.replace("# %% [markdown]", "# %% [markdown]\n# A new paragraph.\n\n# %% [markdown]", 1)
    src.write_text(text)
    now, before = B.render(src, "lessons", root=tmp_path), B.render(LESSON, "lessons")
    def ids(nb):
        return {c.metadata["course"]["exercise"]: c.id for c in nb.cells if "exercise" in c.metadata.get("course", {})}

    assert ids(now) == ids(before) == {label: B.exercise_id(label) for label in COURSE.labels("00_collectives")}
    assert ids(now)["Exercise 0.4"] == "exercise-0-4"
    assert [c.id for c in now.cells].index("exercise-0-4") == [c.id for c in before.cells].index("exercise-0-4") + 1
    checks = {c.metadata["course"]["checks"]: c.id for c in now.cells if "checks" in c.metadata.get("course", {})}
    assert checks["Napkin 0.2"] == "check-napkin-0-2"


def test_last_terms_submission_grades_after_the_lesson_gained_cells():
    """A submission built from an older layout (two cells fewer, one an exercise's
    neighbour) is found by its ids; the one the course built from it holds its answers."""
    old = answered()
    del old.cells[20]  # a markdown cell the lesson has gained since
    del old.cells[3]
    found, missing = locate(old, COURSE.notebook("00_collectives"), same_source=False)
    assert missing == {} and sorted(found) == sorted(COURSE.labels("00_collectives"))
    assert {how for _, how in found.values()} == {"id"}


def test_notebooks_built_before_label_ids_are_found_by_position_or_content():
    """This term's notebooks number every cell by position (``l021``): found by position when
    built from the same source, by what the cell defines otherwise, and never guessed."""
    legacy = answered()
    for i, cell in enumerate(legacy.cells):
        cell.id = f"l{i:03d}"
        cell.metadata.pop("course", None)
    found, missing = locate(legacy, COURSE.notebook("00_collectives"), same_source=True)
    assert not missing and {how for _, how in found.values()} == {"position"}
    found, missing = locate(legacy, COURSE.notebook("00_collectives"), same_source=False)
    assert not missing and {how for _, how in found.values()} == {"content"}
    copy = nbformat.v4.new_code_cell(found["Exercise 0.2"][0].source)  # the answer pasted twice
    legacy.cells.insert(5, copy)
    found, missing = locate(legacy, COURSE.notebook("00_collectives"), same_source=False)
    assert "Exercise 0.2" not in found and "2 cells define ring_all_gather" in missing["Exercise 0.2"]


def test_only_exercise_cells_come_from_the_submission(tmp_path):
    """Check cells edited, deleted or added, PASSED printed anywhere: the course's cells run."""
    nb = answered()
    check = next(c for c in nb.cells if c.id == "check-exercise-0-2")
    check.source = "print('PASSED Exercise 0.2: mine')"
    nb.cells = [c for c in nb.cells if c.id != "check-napkin-0-3"]
    nb.cells.append(nbformat.v4.new_code_cell("print('PASSED Napkin 0.3: x')", metadata={"tags": ["check"]}))
    nb.cells.insert(3, nbformat.v4.new_code_cell("helper = 1"))
    run, plan, notes = assemble(write(nb, tmp_path / "s.ipynb"), COURSE)
    built = COURSE.notebook("00_collectives")
    assert [c.id for c in run.cells] == [c.id for c in built.cells]
    solved = {c.id: c.source for c in answered().cells}
    for cell, course_cell, role in zip(run.cells, built.cells, plan["roles"]):
        assert cell.source == (solved[cell.id] if role["role"] == "exercise" else course_cell.source)
    assert "print('PASSED" not in "".join(c.source for c in run.cells)
    assert [r["label"] for r in plan["roles"] if r["role"] == "check"] == COURSE.labels("00_collectives")
    assert any("3 cell(s) outside the exercises differ" in n for n in notes), notes


@pytest.mark.parametrize("content, why", [
    (b"", "the file is empty"),
    (b"\xff\xfe{}", "not UTF-8 text"),
    (b'{"cells": [', "not valid JSON (line 1"),
    (b"[1, 2]", "JSON, but not a notebook"),
])
def test_a_bad_file_is_refused_with_its_reason(tmp_path, content, why):
    path = tmp_path / "00_collectives.ipynb"
    path.write_bytes(content)
    with pytest.raises(BadSubmission, match=why.replace("(", r"\(")):
        read_notebook(path)


def test_a_notebook_of_the_wrong_lesson_or_with_wrong_metadata_is_refused(tmp_path):
    nb = answered()
    nb.metadata["course"]["source"] = "tools/grade.py"
    with pytest.raises(BadSubmission, match="'tools/grade.py' as its source, which is not a lesson"):
        assemble(write(nb, tmp_path / "a.ipynb"), COURSE)
    nb.metadata["course"] = "lesson 00"
    with pytest.raises(BadSubmission, match="its course metadata is not what the course writes"):
        assemble(write(nb, tmp_path / "b.ipynb"), COURSE)
    other = answered(ROOT / "solutions" / "01_data_parallel.py")
    with pytest.raises(BadSubmission, match="its name says lesson 00_collectives, but it holds lesson 01"):
        assemble(write(other, tmp_path / "00_collectives.ipynb"), COURSE)
    with pytest.raises(BadSubmission, match="a notebook of lesson 01_data_parallel, and this batch grades lesson 00"):
        assemble(write(other, tmp_path / "bob.ipynb"), COURSE, expect="00_collectives")
    del other.metadata["course"]
    other.metadata["course"] = {"source": "solutions/00_collectives.py"}
    with pytest.raises(BadSubmission, match=r"the exercises of another lesson \(Exercise 1.1"):
        assemble(write(other, tmp_path / "c.ipynb"), COURSE)
    printer = nbformat.v4.new_notebook(metadata={"course": {"source": "solutions/00_collectives.py"}}, cells=[
        nbformat.v4.new_code_cell("print('PASSED Exercise 0.1: x')", metadata={"tags": ["check"]})])
    with pytest.raises(BadSubmission, match="none of the exercise cells of 00_collectives could be found"):
        assemble(write(printer, tmp_path / "d.ipynb"), COURSE)


