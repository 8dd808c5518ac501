"""The registry of problems: each problem a :class:`Problem` record, registered once under
its label, in the order the lessons pose them (:data:`PROBLEMS`)."""

from dataclasses import dataclass
from typing import Callable

from .problem_grades import grade_close


@dataclass(frozen=True)
class Problem:
    """One problem of the problem sets.

    ``variant(rng) -> {name: value}``: a student's numbers; ``answer(**numbers)``: the
    model answer; ``statement``: the text, a template of those numbers;
    ``grade(numbers, answer, want) -> (right?, what is wrong)``."""

    label: str
    variant: Callable
    answer: Callable
    statement: str
    grade: Callable = grade_close


PROBLEMS = {}  # label -> Problem, in the order registered


def register(label, variant, answer, statement, grade=grade_close):
    """Add a problem; a label is registered once."""
    if label in PROBLEMS:
        raise ValueError(f"{label!r} is registered already")
    PROBLEMS[label] = Problem(label, variant, answer, statement, grade)
    return PROBLEMS[label]


def lookup(label):
    """The :class:`Problem` registered as ``label``."""
    try:
        return PROBLEMS[label]
    except KeyError:
        raise KeyError(f"no problem {label!r}; the problems are {', '.join(PROBLEMS)}") from None
