"""Instructor tooling: the batch grader on good, wrong, crashing and looping submissions;
problem sets with per-student numbers, graded."""

import csv
import json
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


def filled(wrong=None, extra=None):
    """Lesson 00 with every answer put back; ``wrong`` replaces a stub's answer with a
    wrong one, ``extra`` inserts a cell before the first exercise."""
    nb = nbformat.read(ROOT / "lessons" / "00_collectives.ipynb", 4)
    answers = B.render(LESSON, "solutions")
    first = None
    for i, (cell, answer) in enumerate(zip(nb.cells, answers.cells)):
        if "raise NotImplementedError(" in cell.source:
            first = i if first is None else first
            cell.source = answer.source
            if wrong and wrong[0] in cell.source:
                cell.source = wrong[1]
    if extra:
        nb.cells.insert(first, nbformat.v4.new_code_cell(extra))
    return nb


@pytest.mark.slow
def test_batch_grader_on_good_wrong_crashing_and_looping_submissions(tmp_path):
    subs = tmp_path / "subs"
    subs.mkdir()
    nbformat.write(filled(), subs / "alice.ipynb")
    wrong = ("def napkin_bus_bandwidth", "def napkin_bus_bandwidth(n=8, nbytes=1e9, seconds=4.73e-3):\n"
                                        "    return nbytes / seconds / 1e9  # algbw, not busbw")
    nbformat.write(filled(wrong=wrong), subs / "bob.ipynb")
    nbformat.write(filled(extra="import os\nos._exit(3)  # the kernel dies"), subs / "carol.ipynb")
    nbformat.write(filled(extra="while True:\n    pass"), subs / "dave.ipynb")
    report = tmp_path / "grades.csv"
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "tools.grade", str(subs), "--report", str(report), "--timeout", "60"],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert time.perf_counter() - t < 600
    rows = {r["submission"]: r for r in csv.DictReader(report.open())}
    assert set(rows) == {"alice.ipynb", "bob.ipynb", "carol.ipynb", "dave.ipynb"}
    total = int(rows["alice.ipynb"]["of"])
    assert total == 7 and rows["alice.ipynb"]["passed"] == str(total) and rows["alice.ipynb"]["first failure"] == ""
    assert rows["bob.ipynb"]["passed"] == str(total - 1)
    assert rows["bob.ipynb"]["first failure"].startswith("Napkin 0.2: CheckFailed") and "off by more" in \
        rows["bob.ipynb"]["first failure"]
    for who in ("carol.ipynb", "dave.ipynb"):  # nothing after the broken cell ran; the grader went on
        assert rows[who]["passed"] == "0" and rows[who]["first failure"]
    assert "Exercise 0.1: NOT RUN" in rows["dave.ipynb"]["check 1"] or "TIMEOUT" in rows["dave.ipynb"]["check 1"]


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
