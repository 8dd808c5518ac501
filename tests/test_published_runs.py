"""The published runs the planner stands beside: their shapes and FLOP counts as their
sources give them, and the benchmark's account of every row it misses."""

import contextlib
import io

import pytest

from benchmarks import planner as bench
from emulator.planner import evaluate, model_preset
from emulator.planner.breakdown import ORDER
from emulator.planner.published import RUNS, predict, step_flops, why_off

# Narayanan et al. 2021, Table 1: (attention heads, hidden size, layers) of each model.
TABLE_1 = {"1.7b": (24, 2304, 24), "3.6b": (32, 3072, 30), "7.5b": (32, 4096, 36), "18b": (48, 6144, 40),
           "39b": (64, 8192, 48), "76b": (80, 10240, 60), "145b": (96, 12288, 80), "310b": (128, 16384, 96),
           "530b": (128, 20480, 105), "1t": (160, 25600, 128)}


@pytest.mark.parametrize("name", TABLE_1)
def test_narayanan_models_have_table_1s_shapes_and_its_flop_count(name):
    heads, h, layers = TABLE_1[name]
    m = model_preset(f"megatron-{name}")
    assert (m.n_heads, m.d_model, m.n_layers, m.vocab, m.d_ff) == (heads, h, layers, 51200, 4 * h)
    run = next(r for r in RUNS if r.model == f"megatron-{name}")
    # section 5.1: F = 96 B s l h^2 (1 + s / 6h + V / 16 l h), recomputation included
    B, s = run.batch, 2048
    want = 96 * B * s * layers * h ** 2 * (1 + s / (6 * h) + 51200 / (16 * layers * h))
    assert step_flops(run, m) == pytest.approx(want, rel=1e-12)


def test_every_row_missed_by_more_than_the_target_has_a_reason_and_its_split():
    for run in RUNS:
        est, tf = predict(run)
        err = tf / run.tflops_per_gpu - 1
        reason, shares = why_off(est, run.tflops_per_gpu, tf)
        assert bool(reason) == (abs(err) > bench.TARGET), (run.model, err, reason)
        if reason:
            assert reason == ("fast" if err > 0 else "slow") and reason in bench.WHY
            assert shares.pop("gap") == err
            # the split printed is the whole predicted step, every part a named category
            assert set(shares) <= set(ORDER) and sum(shares.values()) == pytest.approx(1, rel=1e-9)


def test_the_2021_rows_pay_for_scores_in_hbm_less_as_the_model_widens():
    """Narayanan et al.'s runs predate FlashAttention: the megatron-2021 stack writes the
    scores to HBM (heads x s^2 per layer against the GEMMs' s x h^2), so attention's share
    of the step falls with h (per GPU; TP 8 from 18B on), and it is gone under a flash stack."""
    rows = [(run, *predict(run)) for run in RUNS if run.flops == "narayanan"]
    assert all(run.stack == "megatron-2021" for run, _, _ in rows)
    shares = [est.breakdown["memory-bound kernels"] / est.step_time for _, est, _ in rows]
    assert shares[0] > shares[1] > shares[2] and shares[3] > shares[-1], shares
    run, est, _ = rows[0]
    flash = evaluate(est.model, est.cluster, est.dims, run.seq_len, run.batch * run.seq_len, stack="megatron-core")
    assert flash.step_time < est.step_time


def test_the_benchmark_table_prints_every_row_its_stack_and_the_median():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        within = bench.published_table()
    text = out.getvalue()
    for run in RUNS:
        assert any(run.model in line and run.stack in line for line in text.splitlines()), run.model
    assert f"{within} of {len(RUNS)} rows within" in text and "median error" in text


def test_the_breakdown_bars_scale_each_step_to_one_and_tick_the_published_step():
    import matplotlib
    matplotlib.use("Agg")
    from emulator.planner.pictures import breakdown_bars

    rows = [("a", {"GEMMs": 2.0, "tp": 1.0, "bubble": 1.0}, 4.0, 5.0), ("b", {"GEMMs": 3.0, "dp": 0.0}, 3.0, None)]
    ax = breakdown_bars(rows)
    widths = [(round(p.get_y() + p.get_height() / 2), p.get_x(), p.get_width()) for p in ax.patches]
    assert widths == [(0, 0.0, 0.5), (0, 0.5, 0.25), (0, 0.75, 0.25), (1, 0.0, 1.0)]  # an empty part draws nothing
    ticks = [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "-"]
    assert ticks == [1.25]  # published 5 s over predicted 4 s; row b has none
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["GEMMs", "tp", "bubble", "published step"]
