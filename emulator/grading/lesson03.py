"""Checks for lesson 03 (pipeline parallelism).

A schedule is checked by what it does, not by its text: its actions must name existing
micro-batches, it must be valid (each action once, in an order that can run, messages
matched in order), and, executed with equal stages and a free network, reach the
formula's bubble with no more micro-batches in flight than the schedule allows. The
per-rank loop runs every kind of schedule and is compared with one device, its messages
counted and its ledger read. While a check runs, the library's own schedules and loop
refuse.
"""

import numpy as np

from .. import nn
from ..machine.topology import Topology
from ..engine.world import World
from ..accounting import pipeline as formulas
from ..errors import RankError
from ..parallel import pipeline as pp
from ..parallel.pipeline import executor, schedules
from ..training import synthetic_batches, train_single
from .common import CheckFailed, compare_arrays, expect, passed, run_on_emulator
from .lesson03_napkins import FORMULAS, NAPKIN_3_1_CASES, PROBLEM_8_2_CASES, memory_hint, napkin, rounding_hint
from .lesson03_watched_stage import loop_hint, watching
from .refuse import refusing

SCHEDULES = (schedules.schedule, schedules.one_f_one_b, schedules.gpipe, schedules.interleaved_1f1b,
             schedules.zb_h1)
LOOP = (executor.run_actions,)
SYNC = (executor.sync_dp_grads,)
FREE = Topology.free_network()
COSTS = (1e-3, 1e-3, 1e-3)


def tiny(stages, dtype=np.float64):
    """A GPT with one block per stage, small enough to run many schedules fast."""
    model = nn.GPT(vocab=16, d_model=8, n_heads=2, d_ff=16, n_layers=stages, max_seq=4, dtype=dtype)
    return model, model.init(np.random.default_rng(stages))


def _activation_counts(run):
    """Per rank: the peak of activations held, in micro-batches (what one micro-batch's
    forward holds), and what is still held at the end."""
    out = []
    for led, stage in zip(run.world.memory, run.stages):
        one = stage.micro_batch_bytes.get(0, 0) if stage is not None else 0
        out.append((led.peak_by_kind["activations"] / one if one else 0, led.current["activations"]))
    return out


def _check_actions(what, s, p, m, kinds):
    """The schedule's shape and names, before anything runs: one list per rank of
    Action(kind, i) with kind in ``kinds`` and i a micro-batch that exists."""
    expect(isinstance(s, (list, tuple)) and len(s) == p and all(isinstance(acts, (list, tuple)) for acts in s),
           f"{what}, p={p}, m={m}: return one list of actions per rank ({p} lists), got {type(s).__name__}"
           + (f" of {len(s)}" if isinstance(s, (list, tuple)) else ""))
    for r, acts in enumerate(s):
        for a in acts:
            expect(isinstance(a, pp.Action) and a.kind in kinds and a.chunk == 0,
                   f"{what}, p={p}, m={m}: rank {r} has {a!r}; write Action(kind, microbatch) with kind in "
                   f"{'/'.join(kinds)}")
        bad = [str(a) for a in acts if not (isinstance(a.microbatch, (int, np.integer)) and 0 <= a.microbatch < m)]
        if bad:
            raise CheckFailed(
                f"{what}, p={p}, m={m}: rank {r} has {' '.join(bad[:4])}{' ...' if len(bad) > 4 else ''}, but the "
                f"micro-batches are 0..{m - 1}. With fewer micro-batches than the warm-up wants (m < p - 1 - rank), "
                f"a rank can only run the m that exist: warm up with min(p - 1 - rank, m) forwards")


def check_one_f_one_b(fn):
    """Exercise 3.1: fn(p, m) -> the 1F1B schedule, a list per rank of Action("F"/"B", i)."""
    what = "Exercise 3.1"
    for p, m in [(1, 1), (1, 3), (2, 1), (2, 5), (3, 2), (4, 2), (4, 8), (5, 12), (6, 3), (8, 2), (8, 8)]:
        with refusing(what, *SCHEDULES):
            s = fn(p, m)
        _check_actions(what, s, p, m, "FB")
        try:
            pp.validate(s, p=p, m=m, v=1)
        except pp.ScheduleError as exc:
            raise CheckFailed(f"{what}, p={p}, m={m}: the schedule cannot run: {exc}") from None
        model, params = tiny(p)
        x = np.zeros((m, 2), dtype=np.int64)
        world = World(p, topology=FREE)
        run = _run_schedule(what, world, model, params, s, x)
        want = formulas.pipeline_bubble(p, m)
        expect(abs(run.bubble - want) < 1e-9, f"{what}, p={p}, m={m}: measured bubble {run.bubble:.4f}, but 1F1B's is "
               f"(p-1)/(m+p-1) = {want:.4f}: some rank waits when it could compute; start each backward as soon as "
               f"its micro-batch has come back")
        for r, (held, _) in enumerate(_activation_counts(run)):
            limit = min(p - r, m)
            expect(held <= limit + 1e-9, f"{what}, p={p}, m={m}: rank {r} holds {held:g} micro-batches of activations "
                   f"at its peak; 1F1B holds at most p - rank = {limit} (GPipe holds all m): after p - 1 - rank "
                   f"warm-up forwards, alternate one forward and one backward")
    passed(what, "valid for 11 shapes (m < p - 1 included); executed, the bubble is (p-1)/(m+p-1) and rank r holds "
           "at most p - r micro-batches")


def _run_schedule(what, world, model, params, s, x):
    try:
        return pp.run(world, model, params, s, x, x, costs=COSTS)
    except Exception as exc:  # noqa: BLE001 -- the emulator's report
        raise CheckFailed(f"{what}: the schedule failed on the emulator:\n{exc}") from None


def _reference_grads(model, params, x, y):
    logits, cache = model.forward(params, x)
    _, lc = nn.cross_entropy(logits, y)
    return model.backward(params, cache, nn.cross_entropy_backward(lc))[1]


def check_stage_loop(loop):
    """Exercise 3.2: loop(comm, stage, steps, micro_x, micro_y) -> the stage's losses;
    ``steps`` is the rank's program (:func:`emulator.parallel.pipeline.program`)."""
    what = "Exercise 3.2"
    for name, p, m, v in [("gpipe", 2, 3, 1), ("1f1b", 4, 8, 1), ("1f1b", 4, 2, 1), ("zb_h1", 4, 6, 1),
                          ("interleaved_1f1b", 2, 4, 2), ("interleaved_1f1b", 3, 2, 2)]:
        model, params = tiny(p * v)
        (x, y), = synthetic_batches(1, m * 2, 4, 16, seed=p + m)
        s = pp.schedule(name, p, m, v)
        reference = pp.run(World(p), model, params, s, x, y)  # the library's loop: the least memory it needs
        world = World(p)
        label = f"{what}, {name} p={p} m={m}" + (f" v={v}" if v > 1 else "")
        with refusing(what, *LOOP):
            try:
                run = pp.run(world, model, params, s, x, y, loop=watching(loop, label))
            except Exception as exc:  # noqa: BLE001
                original = exc.original if isinstance(exc, RankError) else None
                if isinstance(original, (NotImplementedError, CheckFailed)):
                    raise original from None
                raise CheckFailed(f"{label}: the loop failed on the emulator:\n{exc}{loop_hint(exc)}") \
                    from None
        ref = _reference_grads(model, params, x, y)
        got = run.grads()
        expect(set(got) == set(ref), f"{label}: the stages hold gradients for {sorted(got)}; expected every "
                                     f"layer's (did every backward run?)")
        for k in ref:
            compare_arrays(f"{label}, gradient of {k}", got[k], ref[k])
        loss = nn.cross_entropy(model.forward(params, x)[0], y)[0]
        expect(run.loss is not None and abs(run.loss - loss) < 1e-9,
               f"{label}: return the stage's losses (stage.losses) so the last stage reports the loss")
        sends = [c for calls in world.calls for c in calls if c.op == "send"]
        want = 2 * m * (p * v - 1)
        expect(len(sends) == want, f"{label}: {len(sends)} sends; a step needs {want} (each micro-batch forward "
                                   f"and back over the {p * v - 1} boundaries), no more")
        for r, (led, least) in enumerate(zip(world.memory, reference.peak_activations())):
            left = led.current["activations"]
            expect(left == 0, f"{label}: rank {r} still holds {left} bytes of activations after the step; free a "
                              f"micro-batch's activations (stage.free) once its backward is done")
            peak = led.peak_by_kind["activations"]
            expect(peak <= least, f"{label}: rank {r} held {peak} bytes of activations at its peak; the schedule "
                   f"needs only {least}: free each micro-batch as soon as stage.finishes_backward says so")
    passed(what, "your loop runs GPipe, 1F1B (m < p too), ZB-H1 and interleaved 1F1B (m = 2p and m < p), each action "
           "on what its neighbour sent: gradients equal one device's, 2m(pv-1) messages, activations freed as soon as "
           "each backward is done")


def check_zb_h1(fn):
    """Exercise 3.3: fn(p, m) -> ZB-H1, a list per rank of Action("F"/"B"/"W", i): 1F1B's
    forwards and input-gradient passes, the weight-gradient passes deferred into the
    slots where 1F1B's rank would wait."""
    what = "Exercise 3.3"
    shapes = [(1, 2), (2, 3), (3, 2), (4, 2), (4, 4), (4, 8), (5, 7), (6, 3), (6, 12)]
    cost_sets = [(1, 1, 1), (1, 2, 1), (2, 2, 1), (1, 1.5, 0.5)]
    for p, m in shapes:
        with refusing(what, *SCHEDULES):
            s = fn(p, m)
        _check_actions(what, s, p, m, "FBW")
        try:
            _, _, _, split = pp.validate(s, p=p, m=m, v=1)
        except pp.ScheduleError as exc:
            raise CheckFailed(f"{what}, p={p}, m={m}: the schedule cannot run: {exc}") from None
        expect(split, f"{what}, p={p}, m={m}: the schedule has no W actions; split every backward into B (the "
                      f"input gradient, which the previous stage waits for) and W (the weight gradient)")
        for costs in cost_sets:
            got = pp.bubble_of(pp.simulate(s, costs))
            want = formulas.pipeline_bubble(p, m, schedule="zb_h1", costs=costs)
            if got > want + 1e-9:
                raise CheckFailed(
                    f"{what}, p={p}, m={m}, F:B:W = {costs[0]:g}:{costs[1]:g}:{costs[2]:g}: the bubble is "
                    f"{got:.2%}; ZB-H1's is {want:.2%}. Run each B as early as 1F1B does and defer W's into the "
                    f"slots where the rank would wait: rank r holds back r of them and runs them at the end")
        held, limit = pp.in_flight(s), min(p, m)
        for r, n in enumerate(held):
            expect(n <= limit, f"{what}, p={p}, m={m}: rank {r} holds {n} micro-batches' activations until their W; "
                               f"ZB-H1 holds at most {limit} (as many as 1F1B's first stage): rank r defers only r "
                               f"W's, and runs each as soon as it is no longer needed to fill a gap")
    p, m = 4, 8
    model, params = tiny(p)
    x = np.zeros((m, 2), dtype=np.int64)
    with refusing(what, *SCHEDULES):
        s = fn(p, m)
    world = World(p, topology=FREE)
    run = _run_schedule(what, world, model, params, s, x)
    want = formulas.pipeline_bubble(p, m, schedule="zb_h1", costs=COSTS)
    expect(abs(run.bubble - want) < 1e-9, f"{what}, p={p}, m={m}: executed on the emulator the bubble is "
           f"{run.bubble:.2%}; ZB-H1's is {want:.2%}")
    for r, led in enumerate(world.memory):
        left = led.current["activations"]
        expect(left == 0, f"{what}: rank {r} still holds {left} bytes of activations after the step: every "
                          f"micro-batch needs its W")
    passed(what, f"valid for {len(shapes)} shapes (m < p included), W split from B; the bubble is ZB-H1's for "
           f"F:B:W = 1:1:1, 1:2:1, 2:2:1 and 1:1.5:0.5 (p=4, m=8, 1:1:1: {want:.1%} on the emulator, 1F1B's "
           f"{formulas.pipeline_bubble(p, m):.1%}), holding at most min(p, m) micro-batches")


def check_dp_sync(sync):
    """Exercise 3.4: sync(dp_comm, grads) -> gradients averaged over the data-parallel group."""
    what = "Exercise 3.4"
    for mesh, name, m, v in [({"dp": 2, "pp": 2}, "1f1b", 2, 1), ({"dp": 4, "pp": 2}, "interleaved_1f1b", 2, 2),
                             ({"dp": 3, "pp": 1}, "gpipe", 1, 1)]:
        model, params = tiny(mesh["pp"] * v)
        batches = synthetic_batches(2, 2 * mesh["dp"] * m, 4, 16, seed=3)
        ref, _ = train_single(model, dict(params), batches, nn.AdamW(lr=1e-2))
        s = pp.schedule(name, mesh["pp"], m, v)
        world = World(mesh=mesh)
        with refusing(what, *SYNC):
            out = run_on_emulator(world, lambda comm: pp.train_pipeline(comm, model, params, batches, s,
                                                                        nn.AdamW(lr=1e-2), sync=sync), what)
        label = f"{what}, dp={mesh['dp']} pp={mesh['pp']}"
        for r, (got, _) in enumerate(out):
            for k, a in got.items():
                if not np.allclose(a, ref[k], rtol=1e-7, atol=1e-10):
                    raise CheckFailed(f"{label}: after 2 steps rank {r}'s {k} differs from one device's training; "
                                      f"the stage's gradient must be the mean over its dp group (all-reduce, then "
                                      f"divide by the group's size), for every parameter")
        for r in range(world.size):
            groups = {c.group for c in world.calls[r] if c.op != "send" and c.op != "recv"}
            expect(groups <= {"dp"}, f"{label}: rank {r} used groups {sorted(groups)}; the gradient average is over "
                                     f"the data-parallel group only (the pp stages hold different layers)")
    passed(what, "pipeline + data parallel training equals one device after 2 steps (dp 2 x pp 2, dp 4 x pp 2 "
           "interleaved, dp 3 alone), averaging over the dp group only")


problem_8_2_answer = formulas.bubble_micro_batches  # the model answer of Problem 8.2


def problem_8_2(fn):
    """fn(p, target, seqs_per_micro) -> (m over ideal time, sequences, m over total time).
    Called with the problem's numbers and with others, some where (p-1)/target is not a
    whole number (so rounding down fails); each count compared exactly."""
    m, n, m_total = napkin("Problem 8.2", fn, PROBLEM_8_2_CASES, problem_8_2_answer,
                            ("micro-batches, bubble over the ideal time", "sequences",
                             "micro-batches, idle share of the step"), rounding_hint)
    passed("Problem 8.2", f"{m} micro-batches of 4 = {n} sequences per pipeline (bubble over ideal time); {m_total} "
                          f"if the 5% is the idle share of the whole step; right for {len(PROBLEM_8_2_CASES)} cases, "
                          f"rounding included")


memory_vs_bubble = formulas.memory_vs_bubble  # the model answer of Napkin 3.1


def napkin_memory_vs_bubble(fn):
    """fn(p, per_micro_batch, budget, max_m) -> (m GPipe, bubble GPipe, m 1F1B, bubble 1F1B).
    The cases include a budget that cannot hold p micro-batches (1F1B is then no better
    than GPipe) and one that holds more than the batch has (GPipe stops at max_m)."""
    ans = napkin("Napkin 3.1", fn, NAPKIN_3_1_CASES, memory_vs_bubble,
                  ("GPipe's micro-batches", "GPipe's bubble", "1F1B's micro-batches", "1F1B's bubble"), memory_hint)
    passed("Napkin 3.1", f"GPipe fits {ans[0]} micro-batches (bubble {ans[1]:.1%}); 1F1B holds p of them whatever m, "
           f"so it runs {ans[2]} (bubble {ans[3]:.1%}); right for {len(NAPKIN_3_1_CASES)} cases, including a budget "
           f"too small for p micro-batches and a batch smaller than the budget")
