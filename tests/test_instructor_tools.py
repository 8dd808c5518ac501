"""Grading tools: the batch grader on good, wrong, partial, crashing and endless submissions;
the student's one-line-per-exercise command; problem sets with per-student numbers, graded."""

import csv
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from emulator.grading import problem_sets as P
from tools import build_notebooks as B
from tools import grade, problem_set

ROOT = Path(__file__).resolve().parent.parent
LESSON = ROOT / "solutions" / "00_collectives.py"


def filled(wrong=None, extra=None, before="Exercise 0.1", skip=()):
    """Lesson 00 as a student hands it in: every answer put back, except those of the
    exercises in ``skip`` (left as stubs); ``wrong`` = (a line of an answer, its
    replacement) puts a mistake in; ``extra`` is a cell the student added above the
    exercise ``before``."""
    nb = B.render(LESSON, "lessons")
    answers = B.render(LESSON, "solutions")
    at = None
    for i, (cell, answer) in enumerate(zip(nb.cells, answers.cells)):
        if "raise NotImplementedError(" in cell.source:
            if at is None and f'"{before}' in cell.source:
                at = i
            if any(f'"{label}' in cell.source for label in skip):
                continue
            cell.source = answer.source
            if wrong and wrong[0] in cell.source:
                cell.source = cell.source.replace(*wrong)
    if extra:
        nb.cells.insert(at, nbformat.v4.new_code_cell(extra))
    return nb


ALGBW = ("return nbytes / seconds * 2 * (n - 1) / n / 1e9", "return nbytes / seconds / 1e9  # algbw, not busbw")
LABELS = ["Exercise 0.1", "Exercise 0.2", "Exercise 0.3", "Exercise 0.4", "Napkin 0.1", "Napkin 0.2", "Napkin 0.3"]


@pytest.mark.slow
def test_batch_grader_grades_each_exercise_of_good_wrong_partial_crashing_and_endless_submissions(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    nbformat.write(filled(), subs / "alice.ipynb")
    nbformat.write(filled(wrong=ALGBW), subs / "bob.ipynb")
    nbformat.write(filled(extra="import os\nos._exit(3)  # the kernel dies", before="Exercise 0.3"),
                   subs / "carol.ipynb")
    nbformat.write(filled(extra="import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    pass",
                          before="Exercise 0.2"), subs / "dave.ipynb")
    nbformat.write(filled(skip=("Exercise 0.4", "Napkin 0.3"),
                          extra="while True:  # forgot to stop\n    pass", before="Napkin 0.1"), subs / "erin.ipynb")
    report = tmp_path / "grades.csv"
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "tools.grade", str(subs), "--report", str(report), "--timeout", "90",
                          "--cell-timeout", "20"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert time.perf_counter() - t < 700
    with report.open() as f:
        header = next(csv.reader(f))
    assert header == ["submission", "lesson", "passed", "of"] + LABELS + ["first failure"]
    rows = {r["submission"]: r for r in csv.DictReader(report.open())}
    assert set(rows) == {"alice.ipynb", "bob.ipynb", "carol.ipynb", "dave.ipynb", "erin.ipynb"}

    def statuses(who):
        return [rows[who][label] for label in LABELS]

    assert rows["alice.ipynb"]["passed"] == rows["alice.ipynb"]["of"] == "7"
    assert statuses("alice.ipynb") == ["PASS"] * 7 and rows["alice.ipynb"]["first failure"] == ""
    assert statuses("bob.ipynb") == ["PASS"] * 5 + ["FAIL", "PASS"]
    assert rows["bob.ipynb"]["first failure"].startswith("Napkin 0.2 FAIL: expected 370 GB/s, got 211.4 GB/s")
    # the kernel died after 0.1 and 0.2 passed: those count, the rest never ran
    assert statuses("carol.ipynb") == ["PASS", "PASS"] + ["NOT RUN"] * 5
    assert "the kernel died in the cell that begins `import os`" in rows["carol.ipynb"]["first failure"]
    # a loop that ignores interrupts: the notebook's time ran out, every exercise NOT RUN
    assert statuses("dave.ipynb") == ["NOT RUN"] * 7 and "TIMEOUT" in rows["dave.ipynb"]["first failure"]
    # partly done, and a stray endless cell, interrupted: the rest is still graded
    assert statuses("erin.ipynb") == ["PASS"] * 3 + ["NOT ATTEMPTED", "PASS", "PASS", "NOT ATTEMPTED"]
    assert rows["erin.ipynb"]["first failure"] == "Exercise 0.4 NOT ATTEMPTED"


@pytest.mark.slow
def test_a_student_grades_a_lesson_and_reads_one_line_per_exercise(tmp_path):
    """The student's command: exercises by name, PASS / FAIL with the check's message /
    NOT ATTEMPTED; a check that stops on the student's own error is a FAIL with that error;
    exit status 1 until all pass."""
    path = tmp_path / "00_collectives.ipynb"
    nb = filled(wrong=ALGBW, skip=("Exercise 0.4",))
    nb.cells = [c for c in nb.cells if "grade.napkin_crossover" not in c.source]  # a check cell deleted
    nbformat.write(nb, path)
    out = subprocess.run([sys.executable, "-m", "tools.grade", str(path), "--timeout", "300"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert re.fullmatch(rf"{re.escape(str(path))}: 4 of 7 exercises passed \(ran in \d+ s\)", lines[0]), lines[0]
    names = B.exercise_names(LESSON)
    assert lines[1:] == [
        f"  PASS           {names[0]}", f"  PASS           {names[1]}", f"  PASS           {names[2]}",
        f"  NOT ATTEMPTED  {names[3]}", f"  PASS           {names[4]}",
        f"  FAIL           {names[5]}: expected 370 GB/s, got 211.4 GB/s (the check allows 2%); recheck the formula "
        f"and the units",
        f"  NOT RUN        {names[6]}: no check reported it: is its check cell (tagged `check`) still there?"]
    assert "Cell" not in out.stdout and "Traceback" not in out.stdout


def test_the_grader_reads_what_checks_print_and_raise():
    """Without running anything: outputs as the checks write them, a check cell whose
    function is not defined (the answer cell was deleted), an interrupted check."""
    check = lambda source, *outputs: nbformat.v4.new_code_cell(source, metadata={"tags": ["check"]},  # noqa: E731
                                                                outputs=list(outputs))
    stream = lambda text: nbformat.v4.new_output("stream", text=text)  # noqa: E731
    error = lambda ename, evalue: nbformat.v4.new_output("error", ename=ename, evalue=evalue, traceback=[])  # noqa: E731
    cells = [
        check("grade.check_ring_reduce_scatter(ring_reduce_scatter)", stream("PASSED Exercise 0.1: fine\n")),
        check("grade.check_ring_all_gather(ring_all_gather)",
              stream("NOT ATTEMPTED Exercise 0.2: ring all-gather. Replace ...\n")),
        check("grade.check_ring_all_reduce(ring_all_reduce)",
              stream("NOT ATTEMPTED Exercise 0.3 builds on Exercise 0.2: ring all-gather, not attempted yet\n")),
        check("grade.check_spmd_ring_all_reduce(spmd_ring_all_reduce)",
              error("NameError", "name 'spmd_ring_all_reduce' is not defined")),
        check("grade.napkin_gradient_all_reduce(napkin_gradient_all_reduce)", error("KeyboardInterrupt", "")),
        check("grade.napkin_bus_bandwidth(napkin_bus_bandwidth)",
              error("CheckFailed", "Napkin 0.2: expected 370 GB/s, got 211.4 GB/s")),
        nbformat.v4.new_code_cell("print('PASSED Napkin 0.3: not a check cell')",
                                  outputs=[stream("PASSED Napkin 0.3: not a check cell\n")]),
    ]
    found = grade.outcomes(cells, "00_collectives")
    assert found == {
        "Exercise 0.1": ("PASS", ""), "Exercise 0.2": ("NOT ATTEMPTED", ""),
        "Exercise 0.3": ("NOT ATTEMPTED", "builds on Exercise 0.2: ring all-gather, not attempted yet"),
        "Exercise 0.4": ("FAIL", "its check cell raised NameError: name 'spmd_ring_all_reduce' is not defined"),
        "Napkin 0.1": ("FAIL", "its check ran past the time limit of a cell and was interrupted"),
        "Napkin 0.2": ("FAIL", "expected 370 GB/s, got 211.4 GB/s")}
    rows = grade.judge("00_collectives", found, "")
    assert rows[-1][1:] == ["NOT RUN", "no check reported it: is its check cell (tagged `check`) still there?"]


def test_problem_sets_are_per_student_reproducible_and_graded(tmp_path):
    sheets = problem_set.make(["alice", "bob"], tmp_path / "sheets")
    assert [p.name for p in sheets] == ["alice.md", "bob.md"]
    assert sheets[0].read_text() != sheets[1].read_text()
    template = sheets[0].read_text().split("```json\n")[1].split("```")[0]
    assert json.loads(template) == {prob: None for prob in P.PROBLEMS}  # the keys grade() looks for
    assert P.variant("alice", "Problem 8.1") == P.variant("alice", "Problem 8.1")
    answers = tmp_path / "answers"
    answers.mkdir()
    right = {prob: P.model_answer(prob, P.variant("alice", prob)) for prob in P.PROBLEMS}
    (answers / "alice.json").write_text(json.dumps(right))
    bob = {prob: P.model_answer(prob, P.variant("alice", prob)) for prob in P.PROBLEMS}  # copied from alice
    (answers / "bob.json").write_text(json.dumps(bob))
    (answers / "carol.json").write_text("{not json")
    rows = {r[0]: r for r in problem_set.grade(answers, tmp_path / "grades.csv")}
    assert rows["alice"][1] == len(P.PROBLEMS)
    assert rows["bob"][1] < len(P.PROBLEMS)  # alice's numbers are not bob's
    assert rows["carol"][1] == 0 and "not JSON" in rows["carol"][-1]
    half = dict(right, **{"Problem 8.1": dict(right["Problem 8.1"], fits=[0, 1, 2, 3])})
    ok, why = P.grade_answer("Problem 8.1", P.variant("alice", "Problem 8.1"), half["Problem 8.1"])
    assert ok == (right["Problem 8.1"]["fits"] == [0, 1, 2, 3]) and (ok or "fit" in why)


def test_problem_set_answers_from_later_lessons_are_checked_not_waved_through():
    p = P.variant("alice", "Problem 8.3")
    tp, pp = P.model_answer("Problem 8.3", p)
    assert P.grade_answer("Problem 8.3", p, [tp, pp])[0]
    no_fraction = 16 * p["b"] * p["s"] * p["h"]  # forgot (t-1)/t
    ok, why = P.grade_answer("Problem 8.3", p, [no_fraction, pp])
    assert not ok and "answer 1" in why
    d = P.variant("bob", "Napkin 5.2")
    want = P.model_answer("Napkin 5.2", d)
    assert P.grade_answer("Napkin 5.2", d, want + 1)[0] and not P.grade_answer("Napkin 5.2", d, want + max(2.5, 0.05 * want))[0]
    assert not P.grade_answer("Napkin 5.2", d, "many")[0]
    for prob in ("Problem 8.4", "Napkin 2.1", "Napkin 4.1", "Napkin 4.2", "Napkin 5.1"):
        v = P.variant("carol", prob)
        right = P.model_answer(prob, v)
        wrong = [x * 1.1 for x in right] if isinstance(right, list) else right * 1.1
        assert P.grade_answer(prob, v, right)[0] and not P.grade_answer(prob, v, wrong)[0], prob
