"""Lesson 06's napkins in the problem sets: each student's numbers differ, the model
answers are the lesson's, and plausible wrong answers are refused."""

import pytest

from emulator.grading import problem_sets as P

STUDENTS = [f"student{i}" for i in range(12)]


def test_each_student_gets_other_numbers_and_a_readable_statement():
    for problem in ("Napkin 6.1", "Napkin 6.2", "Napkin 6.3"):
        variants = [P.variant(s, problem) for s in STUDENTS]
        assert len({tuple(sorted(v.items())) for v in variants}) >= 6, problem
        assert P.variant("alice", problem) == P.variant("alice", problem)  # reproducible from the id
        text = P.statement("alice", problem)
        assert "{" not in text and ("Answer" in text or problem == "Napkin 6.2")


def test_model_answers_and_wrong_ones():
    for s in STUDENTS:
        p = P.variant(s, "Napkin 6.1")
        want = P.model_answer("Napkin 6.1", p)
        assert want == pytest.approx([4 * p["n_params"] / (p["tp"] * p["pp"]) / 1e9,
                                      12 * p["n_params"] / (p["tp"] * p["pp"] * p["dp"]) / 1e9])
        assert P.grade_answer("Napkin 6.1", p, want)[0]
        assert not P.grade_answer("Napkin 6.1", p, [want[0], want[0] * 3])[0]  # the optimizer not sharded
        if (p["n_params"], p["dp"], p["tp"], p["pp"]) != (70e9, 4, 8, 2):
            assert not P.grade_answer("Napkin 6.1", p, [17.5, 13.125])[0]  # the lesson's numbers, hard-coded
        q = P.variant(s, "Napkin 6.2")
        tokens = P.model_answer("Napkin 6.2", q)
        assert P.grade_answer("Napkin 6.2", q, tokens * 1.01)[0]
        assert not P.grade_answer("Napkin 6.2", q, tokens * q["dp"] / (q["dp"] - 1) * 2)[0]  # counted once, no (n-1)/n
        r = P.variant(s, "Napkin 6.3")
        cp, dp, seqs = P.model_answer("Napkin 6.3", r)
        assert cp * dp * r["tp"] * r["pp"] == r["gpus"] and cp * r["positions_per_gpu"] == r["seq"]
        assert seqs * dp * r["seq"] == r["tokens"]
        assert P.grade_answer("Napkin 6.3", r, [cp, dp, seqs])[0]
        assert not P.grade_answer("Napkin 6.3", r, [cp, dp * cp, seqs])[0]  # DP left as before the switch
        assert not P.grade_answer("Napkin 6.3", r, [cp, dp, seqs + 0.01])[0]  # counts are compared exactly
