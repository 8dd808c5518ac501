"""What the notebook tests share: the repository, the lessons' sources (lesson 03's by
name), test ids, a lesson with its answers put back, and what Run All on an untouched
lesson must leave."""

from pathlib import Path

from emulator.grading import progress
from tools import build_notebooks as B

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "solutions" / "03_pipeline.py"
LESSONS = [p for p in B.sources() if B.exercises(p)]  # the sources of the lessons with exercises


def ids(paths):
    return [p.stem for p in paths]


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


def code_cells_of(nb, tag):
    return [c for c in nb.cells if c.cell_type == "code" and tag in c.metadata.get("tags", [])]


def errors(cell):
    return [o for o in cell.get("outputs", []) if o.output_type == "error"]


def text(cell):
    return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.output_type == "stream")


def assert_untouched_run(nb, src):
    """Run All on the untouched lesson ``src`` left ``nb`` (as saved): every cell ran; each
    check said its exercise is not attempted and let the lesson go on (demos use the
    library, never a stub); the summary, last, lists every exercise as not attempted and is
    the only cell that failed, with its message and nothing else."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count for c in code), "Run All stopped early: " + next(
        c.source[:80] for c in code if not c.execution_count)
    failing = [c for c in code if errors(c)]
    assert failing == code_cells_of(nb, "summary"), [(c.source[:60], errors(c)[0]["evalue"]) for c in failing]
    err, = errors(failing[0])
    assert err["ename"] == "NotAllPassed" and err["evalue"].startswith("0 of "), err["evalue"]
    assert err["traceback"] == [f"NotAllPassed: {err['evalue']}"]  # the message, and nothing else
    said = "".join(text(c) for c in code_cells_of(nb, "check"))
    for name in B.exercise_names(src):
        assert f"NOT ATTEMPTED {name}" in said or f"NOT ATTEMPTED {progress.label_in(name)} builds on" in said, name
        assert progress.status_line(progress.NOT_ATTEMPTED, name) in text(failing[0]), name
