"""The published runs the planner stands beside: their shapes and FLOP counts as their
sources give them, and the benchmark's account of every row it misses."""

import pytest

from benchmarks import planner as bench
from emulator.planner import model_preset
from emulator.planner.published import (RUNS, exposed_seconds, predict, step_flops, uncharged_seconds,
                                        unfused_scores_seconds)

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


def test_every_row_missed_by_more_than_the_target_has_a_reason():
    for run in RUNS:
        est, tf = predict(run)
        err = tf / run.tflops_per_gpu - 1
        reason, shares = bench.why(run, est, err)
        assert bool(reason) == (abs(err) > bench.TARGET), (run.model, err, reason)
        if reason:
            assert reason in bench.WHY and shares["gap"] == err


def test_the_unfused_scores_weigh_less_as_the_model_widens():
    """The reason given for the 2021 rows: scores in HBM cost heads x s^2 per layer against
    the GEMMs' s x h^2, so their share of the step falls with h (per GPU, with TP 8 from 18B
    on); for the smallest model it is about as large as the gap itself."""
    rows = [(run, *predict(run)) for run in RUNS if run.flops == "narayanan"]
    shares = [unfused_scores_seconds(run, est) / est.step_time for run, est, _ in rows]
    assert shares[0] > shares[1] > shares[2] and shares[3] > shares[-1], shares
    run, est, tf = rows[0]
    gap = tf / run.tflops_per_gpu - 1
    assert 0.6 * gap < shares[0] + uncharged_seconds(run, est) / est.step_time < 1.4 * gap


def test_the_slow_tensor_parallel_rows_expose_more_communication_than_their_gap():
    """The reason given for the H100 rows with TP 8 and one or two stages: the emulator
    leaves collectives exposed that Megatron overlaps; they must weigh more than the gap."""
    slow = [(run, *predict(run)) for run in RUNS if run.flops == "megatron" and run.tp == 8 and run.pp <= 2]
    assert slow
    for run, est, tf in slow:
        gap = tf / run.tflops_per_gpu - 1
        assert bench.why(run, est, gap)[0] == "tp"
        exposed = (exposed_seconds(est, "tp") + exposed_seconds(est, "dp")) / est.step_time
        assert exposed > -gap > bench.TARGET, (run.model, exposed, gap)
