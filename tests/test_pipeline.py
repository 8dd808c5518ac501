"""Pipeline parallelism: schedules as data, their checks, every schedule's bubble on the
emulator, and gradients and training against one device (the executor's messages and
errors: tests/test_pipeline_executor.py)."""

from collections import Counter

import numpy as np
import pytest

from emulator import World, nn
from emulator.accounting.pipeline import micro_batches_for_bubble, peak_in_flight, pipeline_bubble
from emulator.parallel import pipeline as pp
from emulator.training import synthetic_batches, train_single
from tests._pipeline import FREE, tiny

COSTS = (1e-3, 1e-3, 1e-3)


def interleavable(p, m):
    """torch's rule: max(1, m // p) rounds of equal size."""
    return m % max(1, m // p) == 0


def grid(name):
    """p in 1..8, m in 1..3p (interleaved: v = 2 and 3, every m that makes rounds of equal
    size, m < p and m not a multiple of p included)."""
    for p in range(1, 9):
        for m in range(1, 3 * p + 1):
            for v in ((2, 3) if name == "interleaved_1f1b" else (1,)):
                if name != "interleaved_1f1b" or interleavable(p, m):
                    yield name, p, m, v


# ----------------------------------------------------------------- the contract
def test_schedule_returns_actions_per_rank():
    s = pp.schedule("1f1b", 4, 6)
    assert len(s) == 4 and all(isinstance(a, pp.Action) for acts in s for a in acts)
    assert pp.format_schedule(s).splitlines()[3] == "rank 3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5"
    assert pp.format_schedule(s).splitlines()[0] == "rank 0: F0 F1 F2 F3 B0 F4 B1 F5 B2 B3 B4 B5"
    assert pp.Action("F", 3, 1) == pp.Action(kind="F", microbatch=3, chunk=1)
    assert str(pp.Action("B", 2)) == "B2" and str(pp.Action("W", 2, 1)) == "W2.1"
    for name, p, m, v in [("gpipe", 3, 5, 1), ("interleaved_1f1b", 2, 4, 3), ("zb_h1", 4, 2, 1)]:
        s = pp.schedule(name, p, m, v)
        assert pp.parse(pp.format_schedule(s).replace("rank ", "").replace(":", "").split("\n")[0][2:]) == s[0]


def test_schedule_as_a_grid_of_time_slots():
    grid = pp.format_grid(pp.schedule("zb_h1", 3, 3)).splitlines()
    assert grid == ["rank 0: F0 F1 F2 .. .. B0 W0 B1 W1 B2 W2",
                    "rank 1: .. F0 F1 .. B0 F2 B1 W0 B2 W1 W2",
                    "rank 2: .. .. F0 B0 F1 B1 F2 B2 W0 W1 W2"]
    assert pp.format_grid(pp.schedule("1f1b", 2, 2), costs=(1, 2, 0)).splitlines()[0] == \
        "rank 0: F0 F1 .. .. B0 B0 .. B1 B1"


@pytest.mark.parametrize("args, words", [
    (("pipedream", 4, 4), "unknown schedule"),
    (("1f1b", 0, 4), "p must be"),
    (("1f1b", 4, 0), "m must be"),
    (("1f1b", 4, 2.5), "m must be"),
    (("interleaved_1f1b", 4, 8, 1), "v >= 2"),
    (("interleaved_1f1b", 4, 9, 2), "rounds of equal size(.|\n)*try m = 8 or 10"),
    (("interleaved_1f1b", 2, 5, 3), "makes 2 rounds, which do not divide 5"),
    (("gpipe", 4, 8, 2), "one chunk per rank"),
])
def test_bad_arguments_raise_value_error(args, words):
    with pytest.raises(ValueError, match=words):
        pp.schedule(*args)


def test_pipeline_bubble_values_and_definitions():
    assert [round(pipeline_bubble(4, m), 4) for m in (4, 32, 64)] == [round(3 / 7, 4), round(3 / 35, 4),
                                                                       round(3 / 67, 4)]
    assert pipeline_bubble(4, 4, of="ideal") == 3 / 4
    assert pipeline_bubble(4, 8, v=2) == 3 / 19
    assert pipeline_bubble(4, 8, v=2, of="ideal") == 3 / 16
    assert pipeline_bubble(4, 6, v=2) == 3 / 15  # m not a multiple of p: one round of 6
    # m < p: each of the v - 1 returns to rank 0 waits p - m more chunk-times
    assert pipeline_bubble(4, 2, v=2) == pytest.approx(5 / 9)
    assert pipeline_bubble(4, 1, v=3) == pytest.approx(9 / 12) == pytest.approx(pipeline_bubble(4, 1))  # one lap
    with pytest.raises(ValueError, match="rounds of equal size"):
        pipeline_bubble(4, 9, v=2)  # no schedule: refused, not a number no schedule reaches
    # Problem 8.2: 12 stages, bubble at most 5%: 220 micro-batches over ideal time, 209 over total
    assert micro_batches_for_bubble(12, 0.05, of="ideal") == 220
    assert micro_batches_for_bubble(12, 0.05, of="total") == 209
    assert pipeline_bubble(4, 8, schedule="zb_h1") == pytest.approx(3 / 27)
    # a third of 1F1B's idle time (idle / work = bubble over ideal time)
    assert pipeline_bubble(4, 8, of="ideal", schedule="zb_h1") == pytest.approx(
        pipeline_bubble(4, 8, of="ideal", schedule="1f1b") / 3)
    for bad in [dict(p=0, m=4), dict(p=4, m=-1), dict(p=4, m=4, of="wall"), dict(p=4, m=4, v=0),
                dict(p=4, m=4, schedule="zb_h1", costs=(1, 1, 2)), dict(p=4, m=4, schedule="x")]:
        with pytest.raises(ValueError):
            pipeline_bubble(**bad)


# ----------------------------------------------------------------- every schedule, every small shape
@pytest.mark.slow
@pytest.mark.parametrize("name", pp.NAMES)
def test_every_schedule_is_valid_and_its_measured_bubble_is_the_formula(name):
    """p in 1..8, m in 1..3p: each action once, in order; executed on the emulator (a free
    network, equal stages) the idle share is the formula's; 1F1B holds at most p."""
    for name, p, m, v in grid(name):
        s = pp.schedule(name, p, m, v)
        assert pp.validate(s, p, m, v) == (p, m, v, name == "zb_h1")
        kinds = "FBW" if name == "zb_h1" else "FB"
        for acts in s:
            assert Counter(acts) == Counter(pp.Action(k, i, c) for k in kinds for i in range(m) for c in range(v))
        model, params = tiny(p * v)
        x = np.zeros((m, 2), dtype=np.int64)
        run = pp.run(World(p, topology=FREE), model, params, s, x, x, costs=COSTS)
        assert run.bubble == pytest.approx(pipeline_bubble(p, m, v, schedule=name), abs=1e-9), (name, p, m, v)
        if v == 1:
            held = pp.in_flight(s)
            assert held == [peak_in_flight(name, p, m, r) for r in range(p)]
            if name == "1f1b":
                assert max(held) <= p and held[-1] == 1
            if name != "zb_h1":  # one micro-batch's activations, times the count held, is the peak
                for led, n, stage in zip(run.world.memory, held, run.stages):
                    one = stage.micro_batch_bytes[0]  # what F0 held, every layer's activations
                    assert one > 0 and led.peak_by_kind["activations"] == n * one


def test_zb_h1_formula_is_the_simulated_bubble_when_w_is_no_longer_than_f_or_b():
    costs_ok = [(1, 1, 1), (1, 2, 1), (2, 1, 1), (1, 1.5, 0.5), (3, 2, 2), (1, 2, 0)]
    for p in range(1, 7):
        for m in range(1, 2 * p + 2):
            s = pp.schedule("zb_h1", p, m)
            for costs in costs_ok:
                assert pp.bubble_of(pp.simulate(s, costs)) == pytest.approx(
                    pipeline_bubble(p, m, schedule="zb_h1", costs=costs), abs=1e-9), (p, m, costs)
    # a W longer than a forward: the schedule idles more than the formula says, so it is refused
    assert pp.bubble_of(pp.simulate(pp.schedule("zb_h1", 3, 3), (1, 2, 2))) > 0.2 > 2 / 17
    with pytest.raises(ValueError, match="t_w <= t_f"):
        pipeline_bubble(3, 3, schedule="zb_h1", costs=(1, 2, 2))


def test_interleaved_order_is_torchs_for_every_m_it_accepts():
    """Our interleaved 1F1B is torch's ScheduleInterleaved1F1B order, rank by rank (its
    warm-up and 1F1B helpers, the padding dropped), m not a multiple of p included."""
    S = pytest.importorskip("torch.distributed.pipelining.schedules")
    if not (hasattr(S, "_get_warmup_ops") and hasattr(S, "_get_1f1b_rank_ops")):
        pytest.skip("this torch has no _get_warmup_ops/_get_1f1b_rank_ops")
    kinds = {S._ComputationType.FORWARD: "F", S._ComputationType.FULL_BACKWARD: "B"}
    compared = 0
    for p in range(2, 7):
        for v in (2, 3):
            for m in range(1, 3 * p + 1):
                if not interleavable(p, m):
                    continue
                g = m // max(1, m // p)
                theirs = []
                for rank in range(p):
                    w = S._get_warmup_ops(rank, v, g, p, m, multiply_factor=2)
                    ops = S._get_1f1b_rank_ops(
                        v, p, w, v * m - w, w, rank, lambda k, r=rank: ((k // g) % v) * p + r,
                        lambda k, r=rank, w=w: (v - 1 - ((k - w) // g) % v) * p + r)
                    theirs.append([pp.Action(kinds[a.computation_type], a.microbatch_index, a.stage_index // p)
                                   for a in ops if a is not None])
                assert pp.schedule("interleaved_1f1b", p, m, v) == theirs, (p, m, v)
                compared += 1
    assert compared > 100


def test_simulation_and_emulator_agree_with_other_costs():
    model, params = tiny(8)
    x = np.zeros((8, 2), dtype=np.int64)
    for name, v in [("1f1b", 1), ("zb_h1", 1), ("interleaved_1f1b", 2)]:
        for costs in [(1e-3, 2e-3, 1e-3), (2e-3, 1.5e-3, 1e-3)]:
            s = pp.schedule(name, 4, 8, v)
            run = pp.run(World(4, topology=FREE), model, params, s, x, x, costs=costs)
            assert run.bubble == pytest.approx(pp.bubble_of(pp.simulate(s, costs)), abs=1e-9)
            assert run.bubble == pytest.approx(pipeline_bubble(4, 8, v, schedule=name, costs=costs), abs=1e-9)


# ----------------------------------------------------------------- correctness against one device
def reference_grads(model, params, x, y):
    logits, cache = model.forward(params, x)
    _, lc = nn.cross_entropy(logits, y)
    return model.backward(params, cache, nn.cross_entropy_backward(lc))[1]


@pytest.mark.parametrize("name, p, m, v", [("gpipe", 4, 4, 1), ("1f1b", 4, 8, 1), ("1f1b", 4, 2, 1),
                                           ("1f1b", 1, 4, 1), ("interleaved_1f1b", 2, 4, 2),
                                           ("interleaved_1f1b", 1, 2, 2), ("zb_h1", 4, 8, 1), ("zb_h1", 4, 2, 1)])
@pytest.mark.parametrize("dtype, tol", [(np.float64, 1e-12), (np.float32, 2e-5)])
def test_gradients_equal_one_device(name, p, m, v, dtype, tol):
    model = nn.GPT(vocab=16, d_model=16, n_heads=2, d_ff=32, n_layers=4, max_seq=8, dtype=dtype)
    params = model.init(np.random.default_rng(1))
    (x, y), = synthetic_batches(1, 8, 8, 16, seed=2)
    run = pp.run(World(p), model, params, pp.schedule(name, p, m, v), x, y)
    ref = reference_grads(model, params, x, y)
    got = run.grads()
    assert set(got) == set(ref)
    for k in ref:
        np.testing.assert_allclose(got[k], ref[k], rtol=tol, atol=tol * 1e-2, err_msg=k)
    assert run.loss == pytest.approx(nn.cross_entropy(model.forward(params, x)[0], y)[0], rel=tol)


def test_pipeline_and_data_parallel_training_equals_one_device():
    model = nn.GPT(vocab=16, d_model=16, n_heads=2, d_ff=32, n_layers=4, max_seq=8, dtype=np.float64)
    params = model.init(np.random.default_rng(0))
    batches = synthetic_batches(3, 8, 8, 16)
    ref, ref_losses = train_single(model, dict(params), batches, nn.AdamW(lr=1e-2))
    for mesh, name, m, v in [({"dp": 2, "pp": 2}, "1f1b", 2, 1), ({"dp": 2, "pp": 2}, "interleaved_1f1b", 2, 2),
                             ({"pp": 4}, "zb_h1", 4, 1)]:
        s = pp.schedule(name, mesh["pp"], m, v)
        out = World(mesh=mesh).run(lambda comm: pp.train_pipeline(comm, model, params, batches, s,
                                                                   nn.AdamW(lr=1e-2)))
        got = {k: a for stage_params, _ in out for k, a in stage_params.items()}
        assert set(got) == set(ref)
        for k in ref:
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-9, atol=1e-12, err_msg=f"{name} {k}")
        if "dp" not in mesh:
            assert np.allclose(out[-1][1], ref_losses, rtol=1e-10)


def test_dp_all_reduce_happens_after_the_last_backward():
    model, params = tiny(2)
    batches = synthetic_batches(1, 8, 4, 8)
    world = World(mesh={"dp": 2, "pp": 2})
    s = pp.schedule("1f1b", 2, 4)
    world.run(lambda comm: pp.train_pipeline(comm, model, params, batches, s, nn.AdamW()))
    tl = world.timeline()
    for r in range(4):
        reduces = [e for e in tl.events if e.rank == r and e.group == "dp"]
        last_backward = max(e.end for e in tl.of(r, "compute", "compute") if e.name.startswith("B"))
        assert reduces and min(e.start for e in reduces) >= last_backward
        assert [c.op for c in world.calls[r] if c.group == "dp"] == ["all_reduce"]  # one bucket per stage
