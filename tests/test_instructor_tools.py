"""Grading tools on lesson 00 itself: a class in per-student folders (good, wrong, partial,
crashing and endless submissions, a second file, every kind of bad file, a forged one),
graded two at a time; the student's one-line-per-exercise command; problem sets with
per-student numbers, graded. The forgeries one by one: tests/test_grader_sandbox.py."""

import csv
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from emulator.grading import problem_sets as P
from tools import build_notebooks as B
from tools import problem_set

ROOT = Path(__file__).resolve().parent.parent
LESSON = ROOT / "solutions" / "00_collectives.py"


def filled(wrong=None, skip=(), after=None):
    """Lesson 00 as a student hands it in: every answer put back, except those of the
    exercises in ``skip`` (left as stubs); ``wrong`` = (a line of an answer, its
    replacement) puts a mistake in; ``after`` = {label: code} adds code at the end of that
    exercise's cell (which the grader runs, as it runs every exercise cell)."""
    nb = B.render(LESSON, "lessons")
    answers = {c.id: c.source for c in B.render(LESSON, "solutions").cells}
    for cell in nb.cells:
        label = cell.metadata.get("course", {}).get("exercise")
        if label and label not in skip:
            cell.source = answers[cell.id]
            if wrong and wrong[0] in cell.source:
                cell.source = cell.source.replace(*wrong)
        if label in (after or {}):
            cell.source += "\n" + after[label]
    return nb


ALGBW = ("return nbytes / seconds * 2 * (n - 1) / n / 1e9", "return nbytes / seconds / 1e9  # algbw, not busbw")
LABELS = ["Exercise 0.1", "Exercise 0.2", "Exercise 0.3", "Exercise 0.4", "Napkin 0.1", "Napkin 0.2", "Napkin 0.3"]


def class_folder(subs):
    """Who handed in what; returns the submissions expected to be graded as bad files."""
    def put(rel, nb=None, data=None):
        path = subs / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path) if nb is not None else path.write_bytes(data)
        return path

    os.utime(put("alice/first try/00_collectives.ipynb", B.render(LESSON, "lessons")), (time.time() - 3600,) * 2)
    put("alice/00_collectives.ipynb", filled())
    put("bob/00_collectives.ipynb", filled(wrong=ALGBW))
    put("carol/00_collectives.ipynb", filled(after={"Exercise 0.3": "import os\nos._exit(3)  # the kernel dies"}))
    # a wait that ignores interrupts (it sleeps, leaving the CPU to the tests beside it); the
    # grader hands files out in sorted order, so aaron, first, waits out the limit while the
    # other worker grades the rest
    wait = "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n    time.sleep(0.05)"
    put("aaron/00_collectives.ipynb", filled(after={"Exercise 0.2": wait}))
    put("erin/00_collectives.ipynb", filled(skip=("Exercise 0.4", "Napkin 0.3"),
                                            after={"Napkin 0.1": "while True:  # forgot to stop\n    pass"}))
    put(".backup/00_collectives.2025-01-01T00-00-00.ipynb", filled())  # hidden: not a submission
    bad = {"frank/00_collectives.ipynb": (b"", "the file is empty"),
           "gina/00_collectives.ipynb": (b"{\"cells\": [\xff]}", "not UTF-8 text"),
           "hal/00_collectives.ipynb": (b"{\"cells\": [", "not valid JSON")}
    for rel, (data, _) in bad.items():
        put(rel, data=data)
    wrong_meta = filled()
    wrong_meta.metadata["course"]["source"] = "tools/grade.py"
    put("ivan/00_collectives.ipynb", wrong_meta)
    other = B.render(ROOT / "solutions" / "01_data_parallel.py", "lessons")
    put("judy/00_collectives.ipynb", other)
    printer = nbformat.v4.new_notebook(metadata={"course": {"source": "solutions/00_collectives.py"}}, cells=[
        nbformat.v4.new_code_cell("".join(f"print('PASSED {label}: done')\n" for label in LABELS),
                                  metadata={"tags": ["check"]})])
    put("kim/00_collectives.ipynb", printer)
    return dict({rel: why for rel, (_, why) in bad.items()},
                **{"ivan/00_collectives.ipynb": "'tools/grade.py' as its source, which is not a lesson",
                   "judy/00_collectives.ipynb": "its name says lesson 00_collectives, but it holds lesson 01",
                   "kim/00_collectives.ipynb": "none of the exercise cells of 00_collectives could be found"})


@pytest.mark.slow
def test_a_class_is_graded_one_row_per_file_with_its_student(tmp_path):
    subs = tmp_path / "subs"
    bad = class_folder(subs)
    report = tmp_path / "grades.csv"
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "tools.grade", str(subs), "--report", str(report), "--timeout", "90",
                          "--cell-timeout", "20", "-j", "2"], cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert time.perf_counter() - t < 700
    with report.open() as f:
        header = next(csv.reader(f))
    assert header == (["submission", "student", "lesson", "status", "counts", "total", "of"]
                      + [col for label in LABELS for col in (label, f"{label} points")] + ["first failure", "feedback"])
    rows = {r["submission"]: r for r in csv.DictReader(report.open())}
    assert sorted(rows) == sorted([f"{who}/00_collectives.ipynb" for who in "aaron alice bob carol erin".split()]
                                  + ["alice/first try/00_collectives.ipynb"] + list(bad))

    def statuses(who, rel="00_collectives.ipynb"):
        return [rows[f"{who}/{rel}"][label] for label in LABELS]

    alice = rows["alice/00_collectives.ipynb"]
    assert (alice["student"], alice["status"], alice["counts"], alice["total"], alice["of"]) == \
        ("alice", "graded", "yes", "7", "7")
    assert statuses("alice") == ["PASS"] * 7 and alice["first failure"] == ""
    assert all(alice[f"{label} points"] == "1" for label in LABELS)
    first = rows["alice/first try/00_collectives.ipynb"]  # her older file: reported, and does not count
    assert (first["student"], first["counts"]) == ("alice", "no: alice/00_collectives.ipynb is newer")
    assert statuses("alice", "first try/00_collectives.ipynb") == ["NOT ATTEMPTED"] * 7
    assert statuses("bob") == ["PASS"] * 5 + ["FAIL", "PASS"] and rows["bob/00_collectives.ipynb"]["total"] == "6"
    assert rows["bob/00_collectives.ipynb"]["first failure"].startswith("Napkin 0.2 FAIL: expected 370 GB/s, got 211.4")
    # the kernel died in Exercise 0.3's cell, after 0.1 and 0.2 passed: those count, the rest never ran
    assert statuses("carol") == ["PASS", "PASS"] + ["NOT RUN"] * 5
    assert "the kernel died in the cell that begins `def ring_all_reduce" in rows["carol/00_collectives.ipynb"][
        "first failure"]
    # a loop that ignores interrupts: the notebook's time ran out there; what ran before counts
    assert statuses("aaron") == ["PASS"] + ["NOT RUN"] * 6
    assert rows["aaron/00_collectives.ipynb"]["status"] == "TIMEOUT"
    assert "TIMEOUT: the notebook ran past its limit of 90 s" in rows["aaron/00_collectives.ipynb"]["first failure"]
    # partly done, and an endless loop in an exercise's cell, interrupted: the rest is still graded
    assert statuses("erin") == ["PASS"] * 3 + ["NOT ATTEMPTED", "PASS", "PASS", "NOT ATTEMPTED"]
    assert rows["erin/00_collectives.ipynb"]["first failure"] == "Exercise 0.4 NOT ATTEMPTED"
    for rel, why in bad.items():  # each bad file is its own row, and the batch went on
        assert rows[rel]["status"] == "ERROR" and why in rows[rel]["first failure"], (rel, rows[rel])
        assert rows[rel]["student"] == rel.split("/")[0] and rows[rel]["total"] == "0"
    feedback = (tmp_path / "grades_feedback" / "bob.md").read_text()
    assert "**FAIL** Napkin 0.2: bus bandwidth from a measured time: expected 370 GB/s" in feedback
    assert "**PASS** Exercise 0.1: ring reduce-scatter:" in feedback


@pytest.mark.slow
def test_a_student_grades_a_lesson_and_reads_one_line_per_exercise(tmp_path):
    """The student's command: exercises by name, PASS / FAIL with the check's message /
    NOT ATTEMPTED; a check cell the student deleted runs all the same (the course's);
    exit status 1 until all pass."""
    path = tmp_path / "00_collectives.ipynb"
    nb = filled(wrong=ALGBW, skip=("Exercise 0.4",))
    nb.cells = [c for c in nb.cells if "grade.napkin_crossover" not in c.source]  # a check cell deleted
    nbformat.write(nb, path)
    out = subprocess.run([sys.executable, "-m", "tools.grade", str(path), "--timeout", "300"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 1, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert re.fullmatch(rf"{re.escape(str(path))}: 5 of 7 exercises passed \(ran in \d+ s\)", lines[0]), lines[0]
    names = B.exercise_names(LESSON)
    assert lines[1:] == [
        f"  PASS           {names[0]}", f"  PASS           {names[1]}", f"  PASS           {names[2]}",
        f"  NOT ATTEMPTED  {names[3]}", f"  PASS           {names[4]}",
        f"  FAIL           {names[5]}: expected 370 GB/s, got 211.4 GB/s (the check allows 2%); recheck the formula "
        f"and the units", f"  PASS           {names[6]}"]
    assert "Cell" not in out.stdout and "Traceback" not in out.stdout


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
    (answers / "dan.json").write_text(json.dumps([right]))  # a list around the answers
    (answers / "eve.json").write_bytes(b'{"Napkin 0.2": "\xff"}')
    (answers / "fay.json").write_text("")
    (answers / "gus").mkdir()
    gus = {prob: P.model_answer(prob, P.variant("gus", prob)) for prob in P.PROBLEMS}
    (answers / "gus" / "answers.json").write_text(json.dumps(dict(gus, **{"Napkin 0.2": {"busbw": 1}})))
    table = problem_set.grade(answers, tmp_path / "grades.csv")
    rows = {r[1]: r for r in table}  # by student
    header = next(csv.reader((tmp_path / "grades.csv").open()))
    assert header[:5] == ["submission", "student", "status", "counts", "passed"] and header[-1] == "first failure"
    assert rows["alice"][2] == "graded" and rows["alice"][4] == len(P.PROBLEMS)
    assert rows["bob"][4] < len(P.PROBLEMS)  # alice's numbers are not bob's
    for student, why in [("carol", "not valid JSON"), ("dan", "a JSON list, not an object"),
                         ("eve", "not UTF-8 text"), ("fay", "the file is empty")]:
        assert rows[student][2] == "ERROR" and why in rows[student][-1], rows[student]
    gus = rows["gus"]  # in a folder of his own; an answer of the wrong shape fails, the rest is graded
    assert gus[0] == "gus/answers.json" and gus[4] == len(P.PROBLEMS) - 1 and "Napkin 0.2" in gus[-1]
    (answers / "bob").mkdir()
    (answers / "bob" / "second.json").write_text(json.dumps(right))
    os.utime(answers / "bob.json", (time.time() - 60,) * 2)
    rows = {r[0]: r for r in problem_set.grade(answers, tmp_path / "grades.csv") if r[1] == "bob"}
    assert rows["bob.json"][3] == "no: bob/second.json is newer" and rows["bob/second.json"][3] == "yes"
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
    assert P.grade_answer("Napkin 5.2", d, want + 1)[0]
    assert not P.grade_answer("Napkin 5.2", d, want + max(2.5, 0.05 * want))[0]
    assert not P.grade_answer("Napkin 5.2", d, "many")[0]
    for prob in ("Problem 8.4", "Napkin 2.1", "Napkin 4.1", "Napkin 4.2", "Napkin 5.1"):
        v = P.variant("carol", prob)
        right = P.model_answer(prob, v)
        wrong = [x * 1.1 for x in right] if isinstance(right, list) else right * 1.1
        assert P.grade_answer(prob, v, right)[0] and not P.grade_answer(prob, v, wrong)[0], prob


def test_napkin_4_2_variants_carry_grouped_query_attention():
    """Each student's Napkin 4.2 names the K/V width; an answer that sends K and V as wide as h
    fails wherever the model groups its queries (most variants), and the right one passes."""
    gqa = 0
    for student in [f"s{i}" for i in range(40)]:
        v = P.variant(student, "Napkin 4.2")
        assert f"{v['kv_heads']} K/V heads of {v['head_dim']}" in P.statement(student, "Napkin 4.2")
        right = P.model_answer("Napkin 4.2", v)
        assert P.grade_answer("Napkin 4.2", v, right)[0]
        as_if_mha = v["flops"] * v["dtype_bytes"] / (2 * v["beta"])
        if v["kv_heads"] * v["head_dim"] < v["h"]:
            gqa += 1
            assert not P.grade_answer("Napkin 4.2", v, as_if_mha)[0]
    assert gqa >= 20
