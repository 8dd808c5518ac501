"""Lesson 07's checks reject plausible wrong answers and accept other correct ones."""

import math
import re
from pathlib import Path

import numpy as np
import pytest

from emulator.accounting import failures as F
from emulator.engine import faults
from emulator.grading import CheckFailed
from emulator.grading import lesson07 as g
from emulator.parallel import reshard


# ----------------------------------------------------------------- Exercise 7.1
def last_per_step(timeline):
    ends = np.array([[e.end for e in timeline.of(r, "compute", "compute")] for r in range(timeline.size)])
    return int(np.bincount(np.argmax(ends, 0), minlength=timeline.size).argmax())


def median_step_time(timeline):  # right, differently: the slowest typical step, immune to one hiccup
    return int(np.argmax([np.median([e.duration for e in timeline.of(r, "compute", "compute")])
                          for r in range(timeline.size)]))


def most_compute(timeline):
    return int(np.argmax([timeline.total("compute", r) for r in range(timeline.size)]))


def least_idle(timeline):
    return int(np.argmin([timeline.total("idle", r) for r in range(timeline.size)]))


def most_idle(timeline):
    return int(np.argmax([timeline.total("idle", r) for r in range(timeline.size)]))


def finishes_last(timeline):
    return int(np.argmax([max(e.end for e in timeline.of(r, "compute", "compute")) for r in range(timeline.size)]))


def highest_mean_place(timeline):  # right, differently: each step's finishing order, averaged
    ends = np.array([[e.end for e in timeline.of(r, "compute", "compute")] for r in range(timeline.size)])
    return int(np.argmax(np.argsort(np.argsort(ends, 0), 0).mean(1)))


def last_in_the_last_step(timeline):  # wrong: one step decides
    return int(np.argmax([timeline.of(r, "compute", "compute")[-1].end for r in range(timeline.size)]))


def test_find_straggler_check(capsys):
    for right in (last_per_step, median_step_time, highest_mean_place):
        g.check_find_straggler(right)
        assert "PASSED Exercise 7.1" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="hiccup"):
        g.check_find_straggler(most_compute)
    with pytest.raises(CheckFailed, match=r"ends last in 1 of 12 steps \(step 3\), one very slow step that also "
                                          r"gives it the most compute in total"):
        g.check_find_straggler(most_compute)
    with pytest.raises(CheckFailed, match=r"rank 0\. Rank 0 ends last only in the final step \(step 19\)") as err:
        g.check_find_straggler(last_in_the_last_step)
    assert "The last step alone" in str(err.value)  # its mistake, named
    assert "in total" not in str(err.value)  # not totals it never took
    with pytest.raises(CheckFailed, match="never ends last"):
        g.check_find_straggler(lambda tl: (last_per_step(tl) + 1) % tl.size)
    with pytest.raises(CheckFailed, match="not rank"):
        g.check_find_straggler(least_idle)
    with pytest.raises(CheckFailed, match="waits more than most"):
        g.check_find_straggler(most_idle)
    with pytest.raises(CheckFailed, match="not rank"):
        g.check_find_straggler(finishes_last)
    with pytest.raises(CheckFailed, match="rank number"):
        g.check_find_straggler(lambda tl: float(last_per_step(tl)))
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_find_straggler(faults.find_straggler)


def test_the_library_finds_the_straggler_and_refuses_empty_timelines():
    for n, steps, slow, slowdown, seed, hiccup in g.STRAGGLER_CASES:
        assert faults.find_straggler(g.straggler_world(n, steps, slow, slowdown, seed, hiccup).timeline()) == slow
    with pytest.raises(Exception, match="no compute event"):
        faults.find_straggler(g.World(2).timeline())


# ----------------------------------------------------------------- Exercise 7.2
def by_whole_tensor(saved, offsets, sizes):
    """Right, differently: rebuild the whole tensor from every chunk, then slice it."""
    ndim = len(offsets)
    shape = tuple(max(off[d] + a.shape[d] for off, a in saved) for d in range(ndim))
    full = np.empty(shape, saved[0][1].dtype)
    for off, a in saved:
        full[tuple(slice(o, o + n) for o, n in zip(off, a.shape))] = a
    return full[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))].copy()


def by_index_sets(saved, offsets, sizes):
    """Right, differently: element by element through global flat indices."""
    out = np.empty(sizes, saved[0][1].dtype)
    want = np.stack(np.meshgrid(*[np.arange(o, o + s) for o, s in zip(offsets, sizes)], indexing="ij"), -1)
    for off, a in saved:
        inside = np.all((want >= off) & (want < np.add(off, a.shape)), axis=-1)
        local = want[inside] - np.array(off)
        out[inside] = a[tuple(local.T)]
    return out


def wrong_end(saved, offsets, sizes):  # the overlap ends at the smaller start: nothing but edges
    out = np.zeros(sizes, saved[0][1].dtype)
    for off, a in saved:
        lo = [max(o, w) for o, w in zip(off, offsets)]
        hi = [min(o + n, w + s) - 1 for o, n, w, s in zip(off, a.shape, offsets, sizes)]
        if all(h > l for l, h in zip(lo, hi)):
            out[tuple(slice(l - w, h - w) for l, h, w in zip(lo, hi, offsets))] = \
                a[tuple(slice(l - o, h - o) for l, h, o in zip(lo, hi, off))]
    return out


def global_offsets_in_chunk(saved, offsets, sizes):  # forgets to subtract the chunk's offset
    out = np.zeros(sizes, saved[0][1].dtype)
    for off, a in saved:
        lo = [max(o, w) for o, w in zip(off, offsets)]
        hi = [min(o + n, w + s) for o, n, w, s in zip(off, a.shape, offsets, sizes)]
        if all(h > l for l, h in zip(lo, hi)):
            src = a[tuple(slice(l, h) for l, h in zip(lo, hi))]
            dst = tuple(slice(l - w, l - w + src.shape[d]) for d, (l, w) in enumerate(zip(lo, offsets)))
            out[dst] = src
    return out


def first_chunk_only(saved, offsets, sizes):
    for off, a in saved:
        lo = [max(o, w) for o, w in zip(off, offsets)]
        hi = [min(o + n, w + s) for o, n, w, s in zip(off, a.shape, offsets, sizes)]
        if all(h > l for l, h in zip(lo, hi)):
            out = np.zeros(sizes, a.dtype)
            out[tuple(slice(l - w, h - w) for l, h, w in zip(lo, hi, offsets))] = \
                a[tuple(slice(l - o, h - o) for l, h, o in zip(lo, hi, off))]
            return out
    return np.zeros(sizes)


def dim0_only(saved, offsets, sizes):  # treats chunks as row blocks: wrong when a chunk is cut along dim 1
    out = np.zeros(sizes, saved[0][1].dtype)
    for off, a in saved:
        lo, hi = max(off[0], offsets[0]), min(off[0] + a.shape[0], offsets[0] + sizes[0])
        if hi > lo:
            rows = a[lo - off[0]:hi - off[0]]
            cols = tuple(slice(0, min(s, n)) for s, n in zip(sizes[1:], rows.shape[1:]))
            out[(slice(lo - offsets[0], hi - offsets[0]),) + cols] = rows[(slice(None),) + cols]
    return out


def test_read_block_check_accepts_other_correct_answers(capsys):
    for right in (by_whole_tensor, by_index_sets):
        g.check_read_block(right)
        assert "PASSED Exercise 7.2" in capsys.readouterr().out


@pytest.mark.parametrize("wrong, match", [
    (wrong_end, "is wrong at"), (global_offsets_in_chunk, "is wrong at|could not broadcast|shape"),
    (first_chunk_only, "is wrong at"), (dim0_only, "is wrong at"),
    (lambda saved, offsets, sizes: np.zeros(sizes), "is wrong at"),
    (lambda saved, offsets, sizes: saved[0][1], "shape"),
    (reshard.read_block, "library's own solution"),
])
def test_read_block_check_rejects_wrong_answers(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        g.check_read_block(wrong)


def test_a_loader_right_on_blocks_but_wrong_on_runs_is_caught(monkeypatch):
    """Right on the unit cases, wrong inside the checkpoint loader (it zeroes the last value
    of one-dim blocks of 16 or more, which only a model's biases and norms have): the
    resharded runs catch it."""
    def sly(saved, offsets, sizes):
        out = by_whole_tensor(saved, offsets, sizes)
        if out.ndim == 1 and out.size >= 16:
            out[-1] = 0.0
        return out

    with pytest.raises(CheckFailed, match="differs from the run that never stopped"):
        g.check_read_block(sly)


# ----------------------------------------------------------------- Exercise 7.3
def young(save_cost, mtbf):
    return math.sqrt(2 * save_cost * mtbf)


def daly(save_cost, mtbf):
    x = save_cost / (2 * mtbf)
    return math.sqrt(2 * save_cost * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - save_cost


def by_search(save_cost, mtbf):  # right, differently: maximise the first-order goodput on a grid
    grid = np.geomspace(save_cost, 10 * mtbf, 20000)
    return float(grid[np.argmax(1 - save_cost / grid - grid / (2 * mtbf))])


@pytest.mark.parametrize("right", [young, daly, by_search])
def test_interval_check_accepts_young_daly_and_a_search(right, capsys):
    g.check_optimal_interval(right)
    out = capsys.readouterr().out
    assert "PASSED Exercise 7.3" in out and "a 15-minute restart (section 7's)" in out  # the lesson's restart, said


def test_interval_check_simulates_the_restart_the_lesson_uses():
    """The check's Monte Carlo and the lesson's goodput cell assume one restart (15 minutes)."""
    source = (Path(__file__).resolve().parent.parent / "solutions" / "07_failures.py").read_text(encoding="utf-8")
    cell = re.search(r"^save, restart = 60\.0, (\d+) \* 60\.0$", source, re.M)
    assert cell, "lesson 07's goodput cell no longer sets save, restart"
    assert int(cell.group(1)) * 60.0 == g.RESTART == 15 * 60.0
    assert "with the 15-minute restart the\n# cell after it uses" in source  # Exercise 7.3's text says which


@pytest.mark.parametrize("wrong, match", [
    (lambda d, m: math.sqrt(d * m), "goodput"),  # the 2 forgotten
    (lambda d, m: 2 * math.sqrt(d * m), "goodput"),
    (lambda d, m: 2 * d * m, "goodput"),  # no square root
    (lambda d, m: math.sqrt(2 * d / m), "goodput"),
    (lambda d, m: m / 2, "goodput"),
    (lambda d, m: 1158.0, "goodput"),  # Llama 3's answer, hard-coded
    (lambda d, m: -young(d, m), "positive"),
    (lambda d, m: "20 minutes", "number of seconds"),
    (F.young_interval, "library's own solution"),
])
def test_interval_check_rejects_wrong_answers(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        g.check_optimal_interval(wrong)


# ----------------------------------------------------------------- napkins
def test_watchdog_napkin(capsys):
    g.napkin_watchdog(lambda gpus=16384, timeout_minutes=10: gpus * timeout_minutes * 60 / 3600)
    assert "PASSED Napkin 7.1" in capsys.readouterr().out
    for wrong in (lambda gpus=16384, timeout_minutes=10: 2730.67,  # hard-coded
                  lambda gpus=16384, timeout_minutes=10: gpus * timeout_minutes,  # GPU-minutes
                  lambda gpus=16384, timeout_minutes=10: timeout_minutes / 60):  # one GPU
        with pytest.raises(CheckFailed, match="Napkin 7.1"):
            g.napkin_watchdog(wrong)


def goodput_first_order(gpus=16384, gpu_mtbf_hours=50000, interval_minutes=20, save_seconds=60, restart_minutes=15):
    m = gpu_mtbf_hours * 3600 / gpus
    t = interval_minutes * 60
    return 1 - save_seconds / t - (t / 2 + restart_minutes * 60) / m


def goodput_daly(gpus=16384, gpu_mtbf_hours=50000, interval_minutes=20, save_seconds=60, restart_minutes=15):
    m, t, r = gpu_mtbf_hours * 3600 / gpus, interval_minutes * 60, restart_minutes * 60
    return t / (m * math.exp(r / m) * math.expm1((t + save_seconds) / m))


def test_goodput_napkin(capsys):
    for right in (goodput_first_order, goodput_daly):
        g.napkin_goodput(right)
        assert "PASSED Napkin 7.2" in capsys.readouterr().out

    def no_restart(gpus=16384, gpu_mtbf_hours=50000, interval_minutes=20, save_seconds=60, restart_minutes=15):
        return goodput_first_order(gpus, gpu_mtbf_hours, interval_minutes, save_seconds, 0)

    def whole_interval_lost(gpus=16384, gpu_mtbf_hours=50000, interval_minutes=20, save_seconds=60,
                            restart_minutes=15):
        m, t = gpu_mtbf_hours * 3600 / gpus, interval_minutes * 60
        return 1 - save_seconds / t - (t + restart_minutes * 60) / m

    def per_gpu_mtbf(gpus=16384, gpu_mtbf_hours=50000, interval_minutes=20, save_seconds=60, restart_minutes=15):
        return goodput_first_order(1, gpu_mtbf_hours, interval_minutes, save_seconds, restart_minutes)

    for wrong in (no_restart, whole_interval_lost, per_gpu_mtbf, lambda **kw: 0.813):
        with pytest.raises(CheckFailed, match="Napkin 7.2"):
            g.napkin_goodput(wrong)


def test_problem_set_variants_of_the_napkins():
    from emulator.grading import problem_sets as P

    for student in ("alice", "bob", "carol", "dan"):
        p = P.variant(student, "Napkin 7.1")
        want = P.model_answer("Napkin 7.1", p)
        assert want == pytest.approx(p["gpus"] * p["timeout_minutes"] / 60)
        assert P.grade_answer("Napkin 7.1", p, want)[0] and not P.grade_answer("Napkin 7.1", p, want * 60)[0]
        assert "GPU-hours" in P.statement(student, "Napkin 7.1")
        q = P.variant(student, "Napkin 7.2")
        first = P.model_answer("Napkin 7.2", q)
        assert first == pytest.approx(goodput_first_order(**q)) and 0 < first < 1
        assert P.grade_answer("Napkin 7.2", q, goodput_daly(**q))[0]  # the exact expectation is right too
        assert not P.grade_answer("Napkin 7.2", q, first * 1.1)[0]
        assert not P.grade_answer("Napkin 7.2", q, "most of it")[0]
    assert P.variant("alice", "Napkin 7.2") == P.variant("alice", "Napkin 7.2")
    assert list(P.PROBLEMS)[-2:] == ["Napkin 7.1", "Napkin 7.2"]
