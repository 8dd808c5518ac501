"""Lesson 03's checks reject plausible wrong answers and accept other correct ones."""

import numpy as np
import pytest

from emulator import P2POp
from emulator.grading import CheckFailed
from emulator.grading import lesson03 as g
from emulator.parallel import pipeline as pp
from emulator.parallel.pipeline import Action
from emulator.parallel.pipeline import blocking_loop


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


# ----------------------------------------------------------------- Exercise 3.2
def unbatched_loop(comm, stage, actions, micro_x, micro_y):
    """Correct without batch_isend_irecv: isend and irecv posted one by one."""
    shape, dtype = stage.boundary(micro_x[0])
    sends = []
    for a in actions:
        src = stage.source(a)
        inbound = comm.irecv(np.empty(shape, dtype), src[0]).wait() if src else None
        if a.kind == "F":
            out = stage.forward(a, micro_x[a.microbatch] if stage.is_first(a.chunk) else inbound,
                                micro_y[a.microbatch])
        elif a.kind == "B":
            out = stage.backward(a, inbound, scale=1 / len(micro_x))
        else:
            out = stage.backward_weight(a)
        if stage.finishes_backward(a):
            stage.free(a)
        dst = stage.destination(a)
        if dst:
            sends.append(comm.isend(out, dst[0]))
    for h in sends:
        h.wait()
    return stage.losses


def loop_variant(free=True, wait_sends=True, scale=True, frees_at_end=False):
    def loop(comm, stage, actions, micro_x, micro_y):
        shape, dtype = stage.boundary(micro_x[0])
        pending, sends, done = [], [], []
        for a in actions:
            src = stage.source(a)
            ops = pending + ([P2POp(comm.irecv, np.empty(shape, dtype), src[0])] if src else [])
            handles = comm.batch_isend_irecv(ops) if ops else []
            sends += handles[:len(pending)]
            inbound = handles[-1].wait() if src else None
            if a.kind == "F":
                out = stage.forward(a, micro_x[a.microbatch] if stage.is_first(a.chunk) else inbound,
                                    micro_y[a.microbatch])
            elif a.kind == "B":
                out = stage.backward(a, inbound, scale=1 / len(micro_x) if scale else 1.0)
            else:
                out = stage.backward_weight(a)
            if stage.finishes_backward(a):
                done.append(a)
                if free and not frees_at_end:
                    stage.free(a)
            dst = stage.destination(a)
            pending = [P2POp(comm.isend, out, dst[0])] if dst else []
        if pending:
            sends += comm.batch_isend_irecv(pending)
        if wait_sends:
            for h in sends:
                h.wait()
        if frees_at_end:
            for a in done:
                stage.free(a)
        return stage.losses

    return loop


def test_stage_loop_check(capsys):
    g.check_stage_loop(unbatched_loop)
    assert "PASSED Exercise 3.2" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="still holds"):
        g.check_stage_loop(loop_variant(free=False))
    with pytest.raises(CheckFailed, match="at its peak"):
        g.check_stage_loop(loop_variant(frees_at_end=True))
    with pytest.raises(CheckFailed, match="gradient of"):
        g.check_stage_loop(loop_variant(scale=False))  # the sum over micro-batches, not the mean


def test_stage_loop_check_reports_a_deadlock_and_refuses_the_library():
    with pytest.raises(CheckFailed, match=r"1f1b p=4 m=8: the loop failed(.|\n)*deadlock(.|\n)*its next action"):
        g.check_stage_loop(blocking_loop)  # right for GPipe, deadlocks under 1F1B
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_stage_loop(pp.run_actions)


# ----------------------------------------------------------------- Exercise 3.3
def per_key_average(dp, grads):
    return {k: dp.all_reduce(v) / dp.size for k, v in grads.items()}


def test_dp_sync_check(capsys):
    g.check_dp_sync(per_key_average)  # a collective per tensor: slower, also right
    assert "PASSED Exercise 3.3" in capsys.readouterr().out
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
