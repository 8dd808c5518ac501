"""Checks for lesson 03 (pipeline parallelism).

A schedule is checked by what it does, not by its text: it must be valid (each action
once, in an order that can run, messages matched in order), and, executed on the
emulator with equal stages and a free network, reach the formula's bubble with no more
micro-batches in flight than 1F1B allows. The per-rank loop runs every kind of schedule
and is compared with one device, its messages counted and its ledger read. While a
check runs, the library's own schedules and loop refuse.
"""

import numpy as np

from .. import Topology, World, nn
from ..accounting import pipeline as formulas
from ..parallel import pipeline as pp
from ..parallel.pipeline import executor, schedules
from ..training import synthetic_batches, train_single
from .common import CheckFailed, compare_arrays, expect, passed, run_on_emulator
from .napkins import variants
from .refuse import refusing

SCHEDULES = (schedules.schedule, schedules.one_f_one_b, schedules.gpipe, schedules.interleaved_1f1b)
LOOP = (executor.run_actions,)
SYNC = (executor.sync_dp_grads,)
FORMULAS = (formulas.micro_batches_for_bubble, formulas.pipeline_bubble)
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


def check_one_f_one_b(fn):
    """Exercise 3.1: fn(p, m) -> the 1F1B schedule, a list per rank of Action("F"/"B", i)."""
    what = "Exercise 3.1"
    for p, m in [(1, 1), (1, 3), (2, 1), (2, 5), (3, 2), (4, 8), (5, 12), (8, 8)]:
        with refusing(what, *SCHEDULES):
            s = fn(p, m)
        try:
            pp.validate(s, p=p, m=m, v=1)
        except pp.ScheduleError as exc:
            raise CheckFailed(f"{what}, p={p}, m={m}: the schedule cannot run: {exc}") from None
        expect(all(a.kind in "FB" for acts in s for a in acts), f"{what}: 1F1B has F and B actions only (its B is the "
                                                                f"whole backward); W belongs to zero-bubble schedules")
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
    passed(what, "valid for 8 shapes (m < p included); executed, the bubble is (p-1)/(m+p-1) and rank r holds at "
           "most p - r micro-batches")


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
    """Exercise 3.2: loop(comm, stage, actions, micro_x, micro_y) -> the stage's losses."""
    what = "Exercise 3.2"
    for name, p, m, v in [("gpipe", 2, 3, 1), ("1f1b", 4, 8, 1), ("1f1b", 4, 2, 1), ("zb_h1", 4, 6, 1),
                          ("interleaved_1f1b", 2, 4, 2)]:
        model, params = tiny(p * v)
        (x, y), = synthetic_batches(1, m * 2, 4, 16, seed=p + m)
        s = pp.schedule(name, p, m, v)
        reference = pp.run(World(p), model, params, s, x, y)  # the library's loop: the least memory it needs
        world = World(p)
        with refusing(what, *LOOP):
            try:
                run = pp.run(world, model, params, s, x, y, loop=loop)
            except Exception as exc:  # noqa: BLE001
                if isinstance(getattr(exc, "original", None), NotImplementedError):
                    raise exc.original from None
                raise CheckFailed(f"{what}, {name} p={p} m={m}: the loop failed on the emulator:\n{exc}") from None
        label = f"{what}, {name} p={p} m={m}" + (f" v={v}" if v > 1 else "")
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
    passed(what, "your loop runs GPipe, 1F1B (m < p too), ZB-H1 and interleaved 1F1B: gradients equal one device's, "
           "2m(pv-1) messages, activations freed as soon as each backward is done")


def check_dp_sync(sync):
    """Exercise 3.3: sync(dp_comm, grads) -> gradients averaged over the data-parallel group."""
    what = "Exercise 3.3"
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


def problem_8_2(fn):
    """fn(p, target, seqs_per_micro) -> (m over ideal time, sequences, m over total time)."""
    cases = [dict(p=12, target=0.05, seqs_per_micro=4), dict(p=8, target=0.1, seqs_per_micro=2),
             dict(p=16, target=0.02, seqs_per_micro=1), dict(p=24, target=0.05, seqs_per_micro=8)]

    def model(p, target, seqs_per_micro):
        m = formulas.micro_batches_for_bubble(p, target, of="ideal")
        return m, m * seqs_per_micro, formulas.micro_batches_for_bubble(p, target, of="total")

    m, n, m_total = variants("Problem 8.2", fn, cases, model, "", ("micro-batches, bubble over ideal time",
                                                                    "sequences", "micro-batches, idle share of the "
                                                                                 "step"), FORMULAS, rel=0)
    passed("Problem 8.2", f"{m} micro-batches of 4 = {n} sequences per pipeline (bubble over ideal time); "
           f"{m_total} if the 5% is the idle share of the whole step")


def memory_vs_bubble(p, per_micro_batch, budget, max_m):
    """Model answer of Napkin 3.1: (m, bubble) for GPipe and for 1F1B within the budget."""
    m_gpipe = min(int(budget // per_micro_batch), max_m)
    m_1f1b = max_m if p * per_micro_batch <= budget else m_gpipe
    return (m_gpipe, formulas.pipeline_bubble(p, m_gpipe), m_1f1b, formulas.pipeline_bubble(p, m_1f1b))


def napkin_memory_vs_bubble(fn):
    """fn(p, per_micro_batch, budget, max_m) -> (m GPipe, bubble GPipe, m 1F1B, bubble 1F1B)."""
    cases = [dict(p=8, per_micro_batch=2e9, budget=40e9, max_m=256), dict(p=4, per_micro_batch=3e9, budget=30e9,
                                                                          max_m=64),
             dict(p=16, per_micro_batch=1e9, budget=24e9, max_m=512), dict(p=6, per_micro_batch=5e9, budget=52e9,
                                                                           max_m=128)]
    ans = variants("Napkin 3.1", fn, cases, memory_vs_bubble, "", ("GPipe's micro-batches", "GPipe's bubble",
                                                                    "1F1B's micro-batches", "1F1B's bubble"),
                   FORMULAS, rel=1e-6)
    passed("Napkin 3.1", f"GPipe fits {ans[0]} micro-batches (bubble {ans[1]:.1%}); 1F1B holds p of them whatever m, "
           f"so it runs {ans[2]} (bubble {ans[3]:.1%})")
