"""Per-student variants of lesson 03's napkins separate the plausible wrong answers from
the right one for every student, not only for some."""

import math

from emulator.grading import problem_sets as P

STUDENTS = [f"student{i:03d}" for i in range(150)]


def test_problem_8_2_variants_make_rounding_down_wrong():
    for student in STUDENTS:
        v = P.variant(student, "Problem 8.2")
        right = P.model_answer("Problem 8.2", v)
        assert P.grade_answer("Problem 8.2", v, right)[0]
        bound = (v["p"] - 1) / v["target"]
        assert not bound.is_integer()
        down = math.floor(bound)
        ok, why = P.grade_answer("Problem 8.2", v, [down, down * v["seqs_per_micro"], right[2]])
        assert not ok and "answer 1" in why, (student, v)


def always_fits(p, per_micro_batch, budget, max_m):
    """Never checks that 1F1B's p in-flight micro-batches fit the budget."""
    m_g = min(int(budget // per_micro_batch), max_m)
    return [m_g, (p - 1) / (m_g + p - 1), max_m, (p - 1) / (max_m + p - 1)]


def uncapped(p, per_micro_batch, budget, max_m):
    """Never caps GPipe at the micro-batches the batch has."""
    m_g = int(budget // per_micro_batch)
    m_1 = max_m if p * per_micro_batch <= budget else m_g
    return [m_g, (p - 1) / (m_g + p - 1), m_1, (p - 1) / (m_1 + p - 1)]


def test_napkin_3_1_variants_catch_an_unchecked_1f1b_budget_and_an_uncapped_gpipe():
    for student in STUDENTS:
        v = P.variant(student, "Napkin 3.1")
        right = P.model_answer("Napkin 3.1", v)
        assert P.grade_answer("Napkin 3.1", v, right)[0]
        args = {k: v[k] for k in ("p", "per_micro_batch", "max_m")}
        for wrong in (always_fits, uncapped):
            answer = wrong(budget=v["budget"], **args) + wrong(budget=v["budget_2"], **args)
            assert not P.grade_answer("Napkin 3.1", v, answer)[0], (student, wrong.__name__, v)
