"""The checks' registry (emulator/grading/progress.py) and what a failing check shows.

An exercise not attempted says so and lets a lesson go on, only in a lesson; a failing
check's message begins with its exercise and is all a notebook shows of the grading code;
the summary lists every exercise and fails unless all passed; every check of every lesson
module is wrapped, and grades the exercise whose stub sits above its check cell.
"""

import re

import jupytext
import numpy as np
import pytest

from emulator.grading import CheckFailed, NotAllPassed, check_close, progress, summary
from emulator.grading import lesson00 as g0
from emulator.grading import lesson03 as g3
from emulator.grading.common import passed
from tools import build_notebooks as B
from tests._notebooks import LESSONS


@pytest.fixture(autouse=True)
def fresh_registry():
    progress.forget()
    yield
    progress.in_lesson(False)
    progress.forget()


def stub_1f1b(p, m):
    raise NotImplementedError("Exercise 3.1: 1F1B as data")


def test_outside_a_lesson_an_exercise_not_attempted_raises():
    with pytest.raises(NotImplementedError, match="Exercise 3.1"):
        g3.check_one_f_one_b(stub_1f1b)
    assert progress.outcomes()["Exercise 3.1"][0] == progress.NOT_ATTEMPTED


def test_in_a_lesson_an_exercise_not_attempted_says_so_and_goes_on(capsys):
    progress.in_lesson()
    assert g3.check_one_f_one_b(stub_1f1b) is None
    out = capsys.readouterr().out
    assert out.startswith("NOT ATTEMPTED Exercise 3.1: 1F1B as data. Replace `raise NotImplementedError`")
    assert progress.outcomes() == {"Exercise 3.1": (progress.NOT_ATTEMPTED, out.strip()[len("NOT ATTEMPTED "):])}


def test_a_check_that_needs_an_earlier_exercise_names_it(capsys):
    progress.in_lesson()

    def loop_on_a_stub(comm, stage, actions, micro_x, micro_y):
        stub_1f1b(2, 2)

    g3.check_stage_loop(loop_on_a_stub)
    assert capsys.readouterr().out.startswith("NOT ATTEMPTED Exercise 3.2 builds on Exercise 3.1: 1F1B as data")
    assert progress.outcomes()["Exercise 3.2"][0] == progress.NOT_ATTEMPTED


def test_a_library_not_implemented_error_is_a_failure_not_a_stub():
    progress.in_lesson()

    def unsupported(p, m):
        raise NotImplementedError("complex schedules")

    with pytest.raises(CheckFailed, match=r"^Exercise 3\.1: the check stopped on NotImplementedError"):
        g3.check_one_f_one_b(unsupported)


def test_a_failure_begins_with_its_exercise_and_shows_nothing_of_the_grading_code():
    """lesson00's SPMD check says ``n=1: used ['all_reduce']`` without naming its exercise;
    the registry puts the name first. In a notebook, IPython shows ``_render_traceback_``."""
    def with_all_reduce(comm, x):
        return comm.all_reduce(x)

    with pytest.raises(CheckFailed) as info:
        g0.check_spmd_ring_all_reduce(with_all_reduce)
    assert re.match(r"Exercise 0\.4: (n=\d+: used|.*library's own)", str(info.value)), str(info.value)
    assert info.value._render_traceback_() == [f"CheckFailed: {info.value}"]
    assert progress.outcomes()["Exercise 0.4"] == (progress.FAILED, str(info.value).splitlines()[0])


def test_a_students_exception_inside_a_check_keeps_the_students_frames_only():
    def typo(p, m):
        return [[] for _ in range(p)][m + p]  # IndexError in the student's code

    with pytest.raises(CheckFailed) as info:
        g3.check_one_f_one_b(typo)
    shown = info.value._render_traceback_()
    assert shown[0] == "CheckFailed: Exercise 3.1: the check stopped on IndexError: list index out of range"
    assert shown[2] == "IndexError was raised here:"
    assert any("in typo" in line for line in shown) and not any("emulator/grading" in line for line in shown)

    def returns_a_number(p, m):
        return 3

    with pytest.raises(CheckFailed) as info:
        g3.check_one_f_one_b(returns_a_number)
    shown = info.value._render_traceback_()
    assert shown[0].startswith("CheckFailed: Exercise 3.1") and "got int" in shown[0]  # the message first


def test_a_passing_check_is_recorded_and_the_summary_passes(capsys):
    g3.problem_8_2(lambda p=12, target=0.05, seqs_per_micro=4: (
        int(np.ceil((p - 1) / target - 1e-9)), int(np.ceil((p - 1) / target - 1e-9)) * seqs_per_micro,
        int(np.ceil((p - 1) * (1 - target) / target - 1e-9))))
    assert progress.outcomes()["Problem 8.2"][0] == progress.PASSED
    summary("Problem 8.2: micro-batches for a small bubble")
    assert capsys.readouterr().out.splitlines()[-2:] == [
        "1 of 1 exercises passed", "passed         Problem 8.2: micro-batches for a small bubble"]


def test_the_summary_lists_every_exercise_and_fails_unless_all_passed(capsys):
    passed("Exercise 9.1", "fine")
    progress.record("Exercise 9.2", progress.FAILED, "Exercise 9.2, n=3: expected 4 steps, got 3")
    progress.record("Exercise 9.3", progress.NOT_ATTEMPTED, "Exercise 9.3: c")
    capsys.readouterr()
    with pytest.raises(NotAllPassed, match=r"^1 of 4 exercises passed; still to do: Exercise 9\.2, Exercise 9\.3, "
                                           r"Napkin 9\.4$"):
        summary("Exercise 9.1: a", "Exercise 9.2: b", "Exercise 9.3: c", "Napkin 9.4: d")
    assert capsys.readouterr().out.splitlines() == [
        "1 of 4 exercises passed",
        "passed         Exercise 9.1: a",
        "failed         Exercise 9.2: b: n=3: expected 4 steps, got 3",
        "not attempted  Exercise 9.3: c",
        "not checked    Napkin 9.4: d: run its check cell"]
    with pytest.raises(ValueError, match="exercise label"):
        summary("Warm-up: nothing")


def test_the_latest_outcome_of_an_exercise_wins():
    progress.record("Exercise 9.1", progress.FAILED, "x")
    passed("Exercise 9.1", "fixed")
    summary("Exercise 9.1: a")


def test_exact_answers_are_phrased_plainly():
    with pytest.raises(CheckFailed, match=r"^m: expected 220, got 219 \(a whole number, compared exactly\)$"):
        check_close("m", 219, 220, quiet=True)
    with pytest.raises(CheckFailed, match=r"expected 220, got 220\.5 "):
        check_close("m", 220.5, 220, quiet=True)
    check_close("m", 220.0, 220, quiet=True)  # the same whole number
    with pytest.raises(CheckFailed, match=r"^x: expected 0\.05, got 0\.0501 \(compared exactly\)$"):
        check_close("x", 0.0501, 0.05, rel=0, quiet=True)
    with pytest.raises(CheckFailed, match=r"^t: expected 1\.5 s, got 1\.6 s \(the check allows 2%\)"):
        check_close("t", 1.6, 1.5, unit=" s", quiet=True)
    with pytest.raises(CheckFailed) as info:
        check_close("b", 0.1002, 0.1, rel=1e-6, quiet=True)
    assert "0%" not in str(info.value) and "1e-06 (relative)" in str(info.value)
    with pytest.raises(CheckFailed, match="expected a number"):
        check_close("b", "many", 0.1, quiet=True)
    check_close("t", 1.52, 1.5, quiet=True)


def test_a_napkin_with_an_integer_answer_compares_it_exactly():
    """Napkin 3.1 counts micro-batches: one too many is wrong, and said plainly."""
    def one_more(p=8, per_micro_batch=2e9, budget=40e9, max_m=256):
        m = min(int(budget // per_micro_batch), max_m) + 1
        return m, (p - 1) / (m + p - 1), max_m, (p - 1) / (max_m + p - 1)

    with pytest.raises(CheckFailed, match=r"GPipe's micro-batches.*expected 20, got 21"):
        g3.napkin_memory_vs_bubble(one_more)


def check_cells(src):
    """(check cell source, labels of the stubs above it since the previous check)."""
    out, above = [], []
    for cell in jupytext.read(src, fmt="py:percent").cells:
        if cell.cell_type != "code":
            continue
        if "check" in cell.metadata.get("tags", []):
            out.append((cell.source, sorted({progress.label_in(n) for n in above})))
            above = []
        else:
            above += B.split_solutions(cell.source, keep=True)[1]
    return out


@pytest.mark.parametrize("src", LESSONS, ids=[p.stem for p in LESSONS])
def test_every_check_cell_calls_a_wrapped_check_of_the_exercise_above_it(src):
    """A check grades the exercise its code names; that must be the exercise whose stub
    the student has just filled in, or the summary and the grader would file it wrongly."""
    import importlib

    module = importlib.import_module(f"emulator.grading.lesson{src.stem[:2]}")
    cells = check_cells(src)
    assert cells
    for source, labels in cells:
        called = [getattr(module, name) for name in re.findall(r"grade\.(\w+)\(", source)]
        assert called, f"{src.name}: a check cell that calls no check of lesson{src.stem[:2]}: {source!r}"
        for fn in called:
            assert getattr(fn, "exercise", None), f"{fn.__name__} names no exercise, so it is not wrapped"
            assert [fn.exercise] == labels, f"{src.name}: {source!r} grades {fn.exercise}, the stubs above are {labels}"
    graded = {getattr(module, n).exercise for s, _ in cells for n in re.findall(r"grade\.(\w+)\(", s)}
    assert graded == {progress.label_in(n) for n in B.exercise_names(src)}, "an exercise without a check cell"


def test_a_check_called_by_a_check_reports_once():
    calls = []

    def inner(fn):
        """Exercise 9.2: inner"""
        calls.append("inner")
        fn()

    wrapped_inner = progress.check(inner, "Exercise 9.2")

    def outer(fn):
        """Exercise 9.1: outer"""
        wrapped_inner(fn)

    progress.in_lesson()
    progress.check(outer, "Exercise 9.1")(lambda: stub_1f1b(1, 1))
    assert calls == ["inner"]
    assert set(progress.outcomes()) == {"Exercise 9.1"}


def test_a_witness_hears_each_check_start_and_how_it_ended():
    """What a grader is told (progress.report_to): the outer check only, with its outcome
    as the wrapper saw it end, whatever the check's code recorded on the way."""
    heard = []
    progress.report_to(lambda event, label, status="", detail="": heard.append((event, label, status)))
    try:
        progress.in_lesson()
        g3.check_one_f_one_b(stub_1f1b)
        with pytest.raises(CheckFailed):
            check = progress.check(lambda: passed("Exercise 9.1", "said by the answer") or 1 / 0, "Exercise 9.1")
            check()
        nested = progress.check(lambda: progress.check(lambda: None, "Exercise 9.3")(), "Exercise 9.2")
        nested()
        with pytest.raises(KeyboardInterrupt):
            progress.check(lambda: (_ for _ in ()).throw(KeyboardInterrupt), "Exercise 9.4")()
    finally:
        progress.report_to(None)
    assert heard == [("start", "Exercise 3.1", ""), ("end", "Exercise 3.1", progress.NOT_ATTEMPTED),
                     ("start", "Exercise 9.1", ""), ("end", "Exercise 9.1", progress.FAILED),
                     ("start", "Exercise 9.2", ""), ("end", "Exercise 9.2", progress.PASSED),
                     ("start", "Exercise 9.4", ""), ("end", "Exercise 9.4", progress.STOPPED)]
