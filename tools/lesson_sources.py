"""A lesson's source, read: its exercises, their answers and the cells that hold them.

Sources are jupytext percent files, ``solutions/NN_name.py``; each answer sits between
``### BEGIN SOLUTION: Exercise N.k: title`` and ``### END SOLUTION``. The build
(``tools/build_notebooks.py``) and the grader (``tools/grade.py``) read them the same way.

An exercise's cell is named by the exercise's label alone (``Exercise 6.4`` ->
``exercise-6-4``, its check cell ``check-exercise-6-4``), never by its position or title,
so a notebook built from an older version of a lesson still says which cell is which.
"""

import hashlib
import re
from pathlib import Path

import jupytext

SOURCES = Path(__file__).resolve().parent.parent / "solutions"
BEGIN = re.compile(r"^(?P<indent>\s*)### BEGIN SOLUTION(?::\s*(?P<name>.*))?\s*$")
END = re.compile(r"^\s*### END SOLUTION\s*$")
LABEL = re.compile(r"(?:Exercise|Napkin|Problem) \d+\.\d+")


def sources(prefix="", folder=SOURCES):
    return sorted(p for p in Path(folder).glob("*.py") if p.name.startswith(prefix))


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def split_solutions(code, keep):
    """Drop the markers (``keep=True``) or replace each block by a stub (``keep=False``)."""
    out, inside, names = [], False, []
    for line in code.splitlines():
        m = BEGIN.match(line)
        if m:
            if inside:
                raise ValueError(f"nested ### BEGIN SOLUTION: {line!r}")
            inside = True
            name = m.group("name") or "exercise"
            names.append(name)
            if not keep:
                out.append(f'{m.group("indent")}raise NotImplementedError("{name}")')
            continue
        if END.match(line):
            if not inside:
                raise ValueError("### END SOLUTION without BEGIN")
            inside = False
            continue
        if keep or not inside:
            out.append(line)
    if inside:
        raise ValueError("### BEGIN SOLUTION without END")
    return "\n".join(out), names


def exercises(src):
    """Names of the exercises' answers in a source, in order (one exercise may have several)."""
    names = []
    for cell in jupytext.read(src, fmt="py:percent").cells:
        if cell.cell_type == "code":
            names += split_solutions(cell.source, keep=True)[1]
    return names


def exercise_names(src):
    """One name per exercise, in order: the first answer's name for each label."""
    seen = {}
    for name in exercises(src):
        m = LABEL.match(name)
        if not m:
            raise ValueError(f"{src.name}: the answer {name!r} does not begin with its exercise's label "
                             f"(Exercise N.k, Napkin N.k or Problem N.k)")
        seen.setdefault(m.group(0), name)
    return list(seen.values())


def exercise_id(label):
    """The id of an exercise's cell, from its label alone: ``Exercise 6.4`` -> ``exercise-6-4``."""
    return re.sub(r"[^a-z0-9]+", "-", label.lower())


def check_id(label):
    return f"check-{exercise_id(label)}"


def label_cells(nb):
    """Mark an exercise's cell and the check cell after it with the exercise's label (in
    their metadata), from the answers' markers: call before the markers are dropped."""
    label = None
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        labels = {LABEL.match(name)[0] for name in split_solutions(cell.source, keep=True)[1] if LABEL.match(name)}
        if len(labels) > 1:
            raise ValueError(f"one cell holds the answers of {sorted(labels)}: give each exercise a cell of its own")
        if labels:
            label, = labels
            cell.metadata["course"] = {"exercise": label}
        elif "check" in cell.metadata.get("tags", []):
            if label is None:
                raise ValueError(f"a check cell comes before any exercise: {cell.source[:60]!r}")
            cell.metadata["course"] = {"checks": label}
            label = None


def cell_id(cell, kind, i):
    """An exercise's cell and its check by the exercise's label, any other by position."""
    course = cell.metadata.get("course", {})
    if "exercise" in course:
        return exercise_id(course["exercise"])
    if "checks" in course:
        return check_id(course["checks"])
    return f"{kind[0]}{i:03d}"


