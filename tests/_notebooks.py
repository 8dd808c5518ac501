"""What the notebook tests share: the repository, lesson 03's source, test ids, and a
lesson with its answers put back."""

from pathlib import Path

from tools import build_notebooks as B

ROOT = Path(__file__).resolve().parent.parent
PIPELINE = ROOT / "solutions" / "03_pipeline.py"


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
