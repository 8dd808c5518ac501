"""Failures in numbers: Young's and Daly's intervals (Daly's published cases), the expected
goodput against the Monte Carlo, the simulated run's timeline, Llama 3's rate."""

import math

import numpy as np
import pytest

from emulator import ConfigError
from emulator.accounting import failures as F

M3 = F.llama3_job_mtbf()


def test_llama3_rate():
    assert M3 / 3600 == pytest.approx(54 * 24 / 419)  # 3.09 hours between unexpected interruptions
    L = F.LLAMA3_INTERRUPTIONS
    assert L["planned"] + L["unexpected"] == L["total"] == 466 and L["faulty_gpu"] == 148
    assert F.job_mtbf(16384 * M3, 16384) == pytest.approx(M3)


def test_llama3_table5_adds_up_to_the_papers_counts():
    """Table 5's rows: 419 unexpected interruptions, 148 of them faulty GPUs, the named rows of
    LLAMA3_INTERRUPTIONS, GPU, host and network faults 77% ("about 78%" in the paper's text);
    its printed percentages are the counts over 419 except the first row's."""
    L, rows = F.LLAMA3_INTERRUPTIONS, F.LLAMA3_TABLE5
    by_category, by_component = F.llama3_interruptions_by("category"), F.llama3_interruptions_by("component")
    assert sum(by_category.values()) == sum(by_component.values()) == L["unexpected"] == 419 and len(rows) == 18
    assert by_component["Faulty GPU"] == L["faulty_gpu"] == 148 and by_component["GPU HBM3 Memory"] == 72
    assert by_component["NCCL Watchdog Timeouts"] == L["nccl_watchdog_timeouts"] == 7
    assert list(by_category)[0] == "GPU" and by_category["GPU"] == 268 and by_category["Network"] == L["network"]
    assert sum(by_category[c] for c in F.HARDWARE) / 419 == pytest.approx(0.773, abs=1e-3)
    off = [name for name, _, n, pct in rows if abs(100 * n / 419 - pct) > 0.06]
    assert off == ["Faulty GPU"] and sum(pct for *_, pct in rows) == pytest.approx(94.9)
    with pytest.raises(ConfigError, match="category"):
        F.llama3_interruptions_by("cause")


@pytest.mark.parametrize("mtbf_min, want_min", [(24 * 60, 117), (6 * 60, 57), (15, 9.1)])
def test_daly_reproduces_his_figures(mtbf_min, want_min):
    """Daly 2006, figures 3 to 5: dump time 5 minutes."""
    assert F.daly_interval(5.0, mtbf_min) == pytest.approx(want_min, abs=0.5 if want_min > 10 else 0.05)


def test_young_and_daly_agree_when_saving_is_cheap_and_daly_caps_at_m():
    assert F.young_interval(60, 36000) == pytest.approx(math.sqrt(2 * 60 * 36000))
    assert F.daly_interval(1, 1e6) == pytest.approx(F.young_interval(1, 1e6), rel=1e-3)
    assert F.daly_interval(300, 100) == 100  # a save longer than 2 M: checkpoint once per M


@pytest.mark.parametrize("save, restart, lag", [(60, 900, 0), (60, 900, 120), (300, 0, 0), (10, 60, 30)])
def test_expected_goodput_matches_the_monte_carlo(save, restart, lag):
    for interval in (F.young_interval(save, M3) / 3, F.daly_interval(save, M3), 3 * F.young_interval(save, M3)):
        sim = F.simulate_goodput(interval, save, M3, restart, lag, work=400 * M3, runs=100, seed=1)
        want = F.expected_goodput(interval, save, M3, restart, lag)
        assert abs(sim.mean() - want) < 4 * sim.std() / np.sqrt(len(sim)) + 5e-4


def test_goodput_peaks_at_daly_interval():
    for save in (10, 60, 600):
        grid = np.geomspace(F.young_interval(save, M3) / 4, 4 * F.young_interval(save, M3), 400)
        best = grid[np.argmax([F.expected_goodput(t, save, M3, 600) for t in grid])]
        assert best == pytest.approx(F.daly_interval(save, M3), rel=0.03)


def test_asynchronous_saving_costs_a_factor_e_to_the_minus_lag_over_m():
    g0 = F.expected_goodput(1000, 2, M3, 600)
    assert F.expected_goodput(1000, 2, M3, 600, lag=300) == pytest.approx(g0 * math.exp(-300 / M3))
    assert F.expected_goodput(1000, 2, M3, 600) > F.expected_goodput(1000, 60, M3, 600)  # cheaper than a sync save


def test_simulated_run_is_a_timeline_of_work_saves_failures_and_restarts():
    interval, save, restart = 1800.0, 120.0, 900.0
    spans, failures = F.simulate_run(interval, save, M3, restart, lag=200, work=30 * M3, seed=3)
    assert len(failures) > 10
    assert spans[0].start == 0 and all(a.end == pytest.approx(b.start) for a, b in zip(spans, spans[1:]))
    kinds = {s.kind for s in spans}
    assert kinds == {"work", "save", "lost", "restart"}
    assert sum(s.end - s.start for s in spans if s.kind == "work") == pytest.approx(math.ceil(30 * M3 / interval)
                                                                                     * interval)
    ends_of_lost = [s.end for s in spans if s.kind == "lost"]
    assert all(any(abs(f - e) < 1e-6 for f in failures) for e in ends_of_lost)  # each loss ends at a failure
    assert all(s.end - s.start <= restart + 1e-9 for s in spans if s.kind == "restart")


@pytest.mark.parametrize("call", [lambda: F.young_interval(0, 1), lambda: F.daly_interval(1, -1),
                                  lambda: F.expected_goodput(1, 1, 1, restart=-1), lambda: F.job_mtbf(1, 0),
                                  lambda: F.simulate_goodput(1, 1, math.inf)])
def test_bad_numbers_are_refused(call):
    with pytest.raises(ConfigError):
        call()
