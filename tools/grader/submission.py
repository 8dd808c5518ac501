"""A submitted notebook, read and checked, and the notebook the grader runs instead of it.

The grader runs the course's own lesson, built from its source, with only the exercise
cells taken from the submission. An exercise's cell is found, in order, by:

1. its id, made from the exercise's label (``exercise-0-4``);
2. the label in its metadata (``{"course": {"exercise": "Exercise 0.4"}}``);
3. its position, for a notebook built before ids came from labels (``l021``), when the
   submission was built from the very source the course has now;
4. its content: the one code cell that defines what the course's cell defines
   (``def ring_reduce_scatter``) or still holds its stub.

Every other cell, check cells included, is the course's; the student's other cells are
counted and not run. An exercise found nowhere is ``NOT FOUND`` (its stub runs); a
notebook with none of its lesson's exercises is an error, not an empty grade.
"""

import copy
import re
from pathlib import Path

import nbformat

from tools import build_notebooks as B
from tools.grader.students import BadFile, read_json
from tools.lesson_sources import exercise_id, exercise_names, exercises, sha256

DEFINES = re.compile(r"^(?:async\s+)?(?:def|class)\s+(\w+)", re.M)


BadSubmission = BadFile


def read_notebook(path):
    raw, text = read_json(path, "a notebook")
    if not isinstance(raw, dict) or not isinstance(raw.get("cells", raw.get("worksheets")), list):
        raise BadSubmission("JSON, but not a notebook: it has no list of cells")
    try:
        return nbformat.reads(text, 4)
    except Exception as exc:  # noqa: BLE001 -- nbformat's own reasons, in one line
        raise BadSubmission(f"not a notebook nbformat can read: {type(exc).__name__}: {str(exc)[:200]}") from None


class Course:
    """The lessons that can be graded: ``solutions/NN_name.py`` sources with exercises."""

    def __init__(self, root):
        self.root = Path(root).resolve()
        self.lessons = {src.stem: src for src in B.sources(folder=self.root / "solutions") if exercises(src)}
        self._built = {}

    def named(self, path):
        """The lesson a file's name names (``00_collectives.ipynb``, ``alice_00_collectives``), or None."""
        stem = Path(path).stem
        for lesson in self.lessons:
            if lesson in stem or re.fullmatch(rf"{lesson[:2]}(_.*)?", stem):
                return lesson
        return None

    def lesson_of(self, nb, path):
        course = nb.metadata.get("course")
        named = self.named(path)
        if course is None:
            if named:
                return named
            raise BadSubmission("no lesson of the course matches it: it has no course metadata and its name names no "
                                "lesson (hand in the lesson notebook itself, e.g. 00_collectives.ipynb)")
        source = course.get("source") if isinstance(course, dict) else None
        if not isinstance(source, str):
            raise BadSubmission(f"its course metadata is not what the course writes ({str(course)[:80]!r}): hand in "
                                f"the lesson notebook as the course built it")
        lesson = Path(source).stem
        if Path(source).parent.name != "solutions" or lesson not in self.lessons:
            raise BadSubmission(f"its metadata names {source!r} as its source, which is not a lesson of this course")
        if named and named != lesson:
            raise BadSubmission(f"its name says lesson {named}, but it holds lesson {lesson} (its metadata): rename it "
                                f"or hand in the right notebook")
        return lesson

    def notebook(self, lesson):
        """The lesson as the course builds it for a student (stubs, no outputs)."""
        if lesson not in self._built:
            self._built[lesson] = B.render(self.lessons[lesson], "lessons", root=self.root)
        return self._built[lesson]

    def names(self, lesson):
        """Its exercises' names, in order (``Exercise 0.1: ring reduce-scatter``, ...)."""
        return exercise_names(self.lessons[lesson])

    def labels(self, lesson):
        return [self.label(name) for name in self.names(lesson)]

    @staticmethod
    def label(name):
        return B.LABEL.match(name)[0]

    def lesson_named(self, prefix):
        """The lesson ``--lesson 00`` (or ``00_collectives``) means."""
        hits = [lesson for lesson in self.lessons if lesson.startswith(prefix)]
        if len(hits) != 1:
            raise SystemExit(f"--lesson {prefix}: {'no lesson' if not hits else 'several lessons'} of this course "
                             f"start with it ({', '.join(self.lessons)})")
        return hits[0]


def _label(cell, key):
    course = cell.metadata.get("course")
    return course.get(key) if isinstance(course, dict) else None


def locate(nb, course_nb, same_source):
    """``{label: (submission cell, how)}`` for every exercise found, and ``{label: why}``
    for the others."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    by_id = {c.get("id"): c for c in code}
    found, missing, used = {}, {}, set()
    for index, cell in enumerate(course_nb.cells):
        label = _label(cell, "exercise")
        if not label:
            continue
        tries = [(by_id.get(exercise_id(label)), "id"),
                 (next((c for c in code if _label(c, "exercise") == label), None), "metadata"),
                 (by_id.get(f"l{index:03d}") if same_source else None, "position")]
        hit = next(((c, how) for c, how in tries if c is not None and id(c) not in used), None)
        if hit is None:
            names = set(DEFINES.findall(cell.source))
            stubs = [line.strip() for line in cell.source.splitlines() if "raise NotImplementedError(" in line]
            alike = [c for c in code if id(c) not in used and (names and names <= set(DEFINES.findall(c.source))
                                                               or any(s in c.source for s in stubs))]
            if len(alike) == 1:
                hit = (alike[0], "content")
            else:
                what = ", ".join(sorted(names)) or "its stub"
                missing[label] = (f"no cell has the id {exercise_id(label)} or defines {what}" if not alike else
                                  f"{len(alike)} cells define {what}: keep your answer in the exercise's own cell")
                continue
        used.add(id(hit[0]))
        found[label] = hit
    return found, missing


def assemble(path, course, expect=None):
    """``(notebook to run, plan, notes)`` for the submission at ``path``; BadSubmission
    says why it cannot be graded. ``expect``: the lesson a batch grades, if one."""
    nb = read_notebook(path)
    lesson = course.lesson_of(nb, path)
    if expect and lesson != expect:
        raise BadSubmission(f"a notebook of lesson {lesson}, and this batch grades lesson {expect}")
    built = course.notebook(lesson)
    meta = nb.metadata.get("course") or {}
    found, missing = locate(nb, built, meta.get("source_sha256") == sha256(course.lessons[lesson]))
    if not found:
        others = sorted({_label(c, "exercise") for c in nb.cells if _label(c, "exercise")} - set(course.labels(lesson)))
        raise BadSubmission(f"it holds the exercises of another lesson ({', '.join(others)}), not those of {lesson}"
                            if others else f"none of the exercise cells of {lesson} could be found in it (by id, "
                                           f"metadata or content): hand in the lesson notebook you worked in")
    run = copy.deepcopy(built)
    roles, answers = [], {id(cell) for cell, _ in found.values()}
    for cell in run.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        label = _label(cell, "exercise")
        if label in found:
            cell.source = found[label][0].source
        roles.append({"role": "exercise", "label": label} if label else
                     {"role": "check", "label": _label(cell, "checks")} if _label(cell, "checks") else
                     {"role": "course"})
    course_sources = {c.source for c in built.cells if c.cell_type == "code"}
    own = [c for c in nb.cells if c.cell_type == "code" and id(c) not in answers and c.source.strip()
           and c.source not in course_sources]
    notes = [f"{label} was found by its {how}, not by its id" for label, (_, how) in found.items() if how != "id"]
    if own:
        notes.append(f"{len(own)} cell(s) outside the exercises differ from the course's (added or edited, e.g. the "
                     f"one that begins `{own[0].source.strip().splitlines()[0][:50]}`): the grader runs the course's "
                     f"cells and only your exercise cells; keep what an answer needs in its exercise's cell")
    return run, {"lesson": lesson, "labels": course.labels(lesson), "roles": roles, "missing": missing}, notes
