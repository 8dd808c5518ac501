"""Lesson 03's checks reject plausible wrong answers and accept other correct ones (Exercise
3.2's stage loop: tests/test_grading_lesson03_stage_loop.py)."""

import pytest

from emulator.grading import CheckFailed
from emulator.grading import lesson03 as g
from emulator.parallel import pipeline as pp
from emulator.parallel.pipeline import Action


# ----------------------------------------------------------------- Exercise 3.1
def one_f_one_b_by_clock(p, m):
    """1F1B built differently: rank r may run a forward when fewer than p - r micro-batches
    are in flight, else it runs its oldest backward."""
    out = []
    for r in range(p):
        acts, nf, nb = [], 0, 0
        while nb < m:
            if nf < m and nf - nb < p - r:
                acts.append(Action("F", nf))
                nf += 1
            else:
                acts.append(Action("B", nb))
                nb += 1
        out.append(acts)
    return out


def test_one_f_one_b_check(capsys):
    g.check_one_f_one_b(one_f_one_b_by_clock)
    assert "PASSED Exercise 3.1" in capsys.readouterr().out
    gpipe = lambda p, m: [[Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)]  # noqa: E731
                          for _ in range(p)]
    with pytest.raises(CheckFailed, match="micro-batches of activations"):
        g.check_one_f_one_b(gpipe)  # valid, same bubble, GPipe's memory
    one_at_a_time = lambda p, m: [[a for i in range(m) for a in (Action("F", i), Action("B", i))]  # noqa: E731
                                  for _ in range(p)]
    with pytest.raises(CheckFailed, match="measured bubble"):
        g.check_one_f_one_b(one_at_a_time)  # valid, but waits for each micro-batch's round trip
    with pytest.raises(CheckFailed, match="cannot run"):
        g.check_one_f_one_b(lambda p, m: [[Action("F", i) for i in range(m)] for _ in range(p)])  # no backward
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_one_f_one_b(lambda p, m: pp.schedule("1f1b", p, m))


def uncapped_warmup(p, m, clamp=False):
    """1F1B warming up p - 1 - r forwards even when fewer micro-batches exist."""
    out = []
    for r in range(p):
        w = p - 1 - r
        acts = [Action("F", i) for i in range(w)]
        for i in range(max(0, m - w) if clamp else m - w):
            acts += [Action("F", w + i), Action("B", i)]
        out.append(acts + [Action("B", i) for i in range(max(0, m - w) if clamp else m - w, m)])
    return out


def test_one_f_one_b_check_rejects_a_warmup_that_is_not_capped_at_m():
    assert uncapped_warmup(4, 8) == pp.schedule("1f1b", 4, 8)  # right whenever m >= p - 1
    with pytest.raises(CheckFailed, match=r"p=4, m=2: rank 0 has F2 B-1, but the micro-batches are 0..1(.|\n)*"
                                          r"min\(p - 1 - rank, m\)"):
        g.check_one_f_one_b(uncapped_warmup)
    with pytest.raises(CheckFailed, match=r"p=4, m=2: rank 0 has F2, but the micro-batches are 0..1"):  # F2 alone
        g.check_one_f_one_b(lambda p, m: uncapped_warmup(p, m, clamp=True))  # phantom forwards, no negative index


def test_one_f_one_b_check_names_a_shape_mistake():
    with pytest.raises(CheckFailed, match="one list of actions per rank"):
        g.check_one_f_one_b(lambda p, m: pp.parse("F0 B0"))
    with pytest.raises(CheckFailed, match="kind in F/B"):
        g.check_one_f_one_b(lambda p, m: [[("F", i) for i in range(m)] + [("B", i) for i in range(m)]
                                          for _ in range(p)])


def test_one_f_one_b_check_catches_an_off_by_one_warmup():
    def late(p, m):  # one warm-up forward too many: still valid, holds one micro-batch too much
        out = []
        for r in range(p):
            w = min(p - r, m)
            acts = [Action("F", i) for i in range(w)]
            for i in range(m - w):
                acts += [Action("F", w + i), Action("B", i)]
            out.append(acts + [Action("B", i) for i in range(m - w, m)])
        return out

    with pytest.raises(CheckFailed, match="holds"):
        g.check_one_f_one_b(late)


# ----------------------------------------------------------------- Exercise 3.3
def zb_from_1f1b(p, m, place="cooldown"):
    """W split from B, deferred from one_f_one_b_by_clock's order. ``place``:
    "cooldown": rank r holds back r W's, and once its forwards are done runs one after
    each B (not the key's order, also ZB-H1's bubble); "after_b": each W right after its
    B (no deferral); "end": every W at the end (GPipe's memory);
    "before_f": held-back W's run just before the next forward, which then waits."""
    out = []
    for r, acts in enumerate(one_f_one_b_by_clock(p, m)):
        new, pending, forwards_left = [], [], m
        for a in acts:
            if place == "before_f" and a.kind == "F" and len(pending) > r:
                new.append(Action("W", pending.pop(0)))
            new.append(a)
            forwards_left -= a.kind == "F"
            if a.kind == "B":
                pending.append(a.microbatch)
                if place == "after_b" or (place == "cooldown" and (len(pending) > r or forwards_left == 0)):
                    new.append(Action("W", pending.pop(0)))
        out.append(new + [Action("W", j) for j in pending])
    return out


def test_zb_h1_check(capsys):
    assert zb_from_1f1b(4, 2) != pp.schedule("zb_h1", 4, 2)  # unlike the key (when m < p)
    g.check_zb_h1(zb_from_1f1b)
    assert "PASSED Exercise 3.3" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match=r"ZB-H1's is .*defer W's into the slots"):
        g.check_zb_h1(lambda p, m: zb_from_1f1b(p, m, "before_f"))
    with pytest.raises(CheckFailed, match=r"p=2, m=3, F:B:W = 1:1:1: the bubble is 18.18%; ZB-H1's is 10.00%"):
        g.check_zb_h1(lambda p, m: zb_from_1f1b(p, m, "after_b"))
    with pytest.raises(CheckFailed, match=r"p=1, m=2: rank 0 holds 2 micro-batches' activations until their W; "
                                          r"ZB-H1 holds at most 1"):
        g.check_zb_h1(lambda p, m: zb_from_1f1b(p, m, "end"))
    with pytest.raises(CheckFailed, match="no W actions"):
        g.check_zb_h1(one_f_one_b_by_clock)
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_zb_h1(lambda p, m: pp.schedule("zb_h1", p, m))


# ----------------------------------------------------------------- Exercise 3.4
def per_key_average(dp, grads):
    return {k: dp.all_reduce(v) / dp.size for k, v in grads.items()}


def test_dp_sync_check(capsys):
    g.check_dp_sync(per_key_average)  # a collective per tensor: slower, also right
    assert "PASSED Exercise 3.4" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="mean over its dp group"):
        g.check_dp_sync(lambda dp, grads: {k: dp.all_reduce(v) for k, v in grads.items()})  # sum
    with pytest.raises(CheckFailed, match="mean over its dp group"):
        g.check_dp_sync(lambda dp, grads: grads)  # no sync: replicas drift
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_dp_sync(pp.sync_dp_grads)


# ----------------------------------------------------------------- napkins
def test_problem_8_2_check(capsys):
    def right(p=12, target=0.05, seqs_per_micro=4):
        m = 1
        while (p - 1) / m > target:
            m += 1
        mt = 1
        while (p - 1) / (mt + p - 1) > target:
            mt += 1
        return m, m * seqs_per_micro, mt

    g.problem_8_2(right)
    assert "PASSED Problem 8.2" in capsys.readouterr().out
    with pytest.raises(CheckFailed):
        g.problem_8_2(lambda p=12, target=0.05, seqs_per_micro=4: (220, 880, 209))  # the problem's numbers only
    with pytest.raises(CheckFailed):
        g.problem_8_2(lambda p=12, target=0.05, seqs_per_micro=4: (int((p - 1) / target), 4 * int((p - 1) / target),
                                                                   int((p - 1) / target)))  # one definition for both

    def rounds_down(p=12, target=0.05, seqs_per_micro=4):  # right wherever (p-1)/target is whole
        m, mt = int((p - 1) / target + 1e-9), int((p - 1) * (1 - target) / target + 1e-9)
        return m, m * seqs_per_micro, mt

    assert rounds_down() == right()
    with pytest.raises(CheckFailed, match=r"bubble over the ideal time, p=8, target=0.03, seqs_per_micro=2\): "
                                          r"expected 234, got 233: m must reach 233.3.*round up"):
        g.problem_8_2(rounds_down)

    def unrounded(p=12, target=0.05, seqs_per_micro=4):
        return (p - 1) / target, seqs_per_micro * (p - 1) / target, (p - 1) * (1 - target) / target

    with pytest.raises(CheckFailed, match="a number of micro-batches is whole"):
        g.problem_8_2(unrounded)

    def swapped(p=12, target=0.05, seqs_per_micro=4):  # the two definitions of the bubble the other way round
        m, _, mt = right(p, target, seqs_per_micro)
        return mt, mt * seqs_per_micro, m

    with pytest.raises(CheckFailed, match=r"expected 220, got 209: that is the count for the bubble as a share of "
                                          r"the whole step; this number asks for it over the ideal time"):
        g.problem_8_2(swapped)

    def total_first(p=12, target=0.05, seqs_per_micro=4):  # right first count, the third one over ideal time
        m = right(p, target, seqs_per_micro)[0]
        return m, m * seqs_per_micro, m

    with pytest.raises(CheckFailed, match=r"idle share of the step.*expected 209, got 220: that is the count for the "
                                          r"bubble over the ideal time"):
        g.problem_8_2(total_first)


def test_memory_vs_bubble_check(capsys):
    def right(p=8, per_micro_batch=2e9, budget=40e9, max_m=256):
        m_g = min(int(budget / per_micro_batch), max_m)
        m_1 = max_m if p * per_micro_batch <= budget else m_g
        return m_g, (p - 1) / (m_g + p - 1), m_1, (p - 1) / (m_1 + p - 1)

    g.napkin_memory_vs_bubble(right)
    assert "PASSED Napkin 3.1" in capsys.readouterr().out

    def same_memory(p=8, per_micro_batch=2e9, budget=40e9, max_m=256):  # 1F1B as if it held all m too
        m = min(int(budget / per_micro_batch), max_m)
        return m, (p - 1) / (m + p - 1), m, (p - 1) / (m + p - 1)

    with pytest.raises(CheckFailed, match="1F1B"):
        g.napkin_memory_vs_bubble(same_memory)

    def always_fits(p=8, per_micro_batch=2e9, budget=40e9, max_m=256):  # never checks that p fit in 1F1B
        m_g = min(int(budget / per_micro_batch), max_m)
        return m_g, (p - 1) / (m_g + p - 1), max_m, (p - 1) / (max_m + p - 1)

    assert always_fits() == right()
    with pytest.raises(CheckFailed, match=r"1F1B's micro-batches, p=16.*expected 12, got 256: 1F1B's first stage "
                                          r"holds min\(p, m\)"):
        g.napkin_memory_vs_bubble(always_fits)

    def uncapped(p=8, per_micro_batch=2e9, budget=40e9, max_m=256):  # GPipe beyond the batch
        m_g = int(budget / per_micro_batch)
        m_1 = max_m if p * per_micro_batch <= budget else m_g
        return m_g, (p - 1) / (m_g + p - 1), m_1, (p - 1) / (m_1 + p - 1)

    assert uncapped() == right()
    with pytest.raises(CheckFailed, match=r"GPipe's micro-batches, p=4.*expected 32, got 80: the memory holds 80, but "
                                          r"the batch has only 32"):
        g.napkin_memory_vs_bubble(uncapped)

    def min_of_p_and_m(p=8, per_micro_batch=2e9, budget=40e9, max_m=256):  # 1F1B: the largest m whose
        fits = int(budget // per_micro_batch)  # first stage, holding min(p, m), fits: also right
        m_g = min(fits, max_m)
        m_1 = max(m for m in range(1, max_m + 1) if min(p, m) <= fits)
        return m_g, (p - 1) / (m_g + p - 1), m_1, (p - 1) / (m_1 + p - 1)

    g.napkin_memory_vs_bubble(min_of_p_and_m)
