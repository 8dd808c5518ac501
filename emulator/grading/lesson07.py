"""Checks for lesson 07 (failures, checkpoints, resharding).

Finding the straggler is checked on emulated runs of 3 to 16 ranks with a slow rank,
noise on every step and, in some, a one-off hiccup of another rank that makes its total
compute the largest. Reading a block from saved chunks is compared with slicing the whole
tensor on random tilings (1 to 3 dims, uneven cuts, large and single-element blocks),
then plugged into the checkpoint loader: runs saved on one mesh and resumed on another
must equal the runs that never stopped. The checkpoint interval is called with other
costs and failure rates and judged by the goodput it gives, in Daly's expectation and by
Monte Carlo. Napkins are called with other numbers. While a check runs, the library's
own answer refuses.
"""

import shutil
import tempfile
from pathlib import Path

import numpy as np

from .. import nn
from ..errors import RankError
from ..engine.faults import Straggler
from ..engine.world import World
from ..accounting import failures as F
from ..engine import faults
from ..parallel import ParallelDims, run_on_mesh
from ..parallel.checkpoint import Checkpoint
from ..training import synthetic_batches
from .common import CheckFailed, expect, passed
from .lesson07_blocks import READ, READ_SHAPES, check_blocks
from .napkins import variants
from .refuse import refusing

STRAGGLER = (faults.find_straggler,)
INTERVAL = (F.young_interval, F.daly_interval)


# ----------------------------------------------------------------- Exercise 7.1: the straggler
def straggler_world(n, steps, slow, slowdown, seed, hiccup=None):
    """A data-parallel run of ``n`` ranks: per step, compute (1 ms, with 3% noise) then an
    all-reduce; rank ``slow`` computes ``slowdown`` times slower; ``hiccup``: (rank,
    step) that once takes long enough to give that rank twice the straggler's extra
    compute in total. Returns the World after the run."""
    rng = np.random.default_rng(seed)
    noise = 1 + 0.03 * rng.standard_normal((n, steps))

    def prog(comm):
        for k in range(steps):
            t = 1e-3 * noise[comm.rank, k]
            if hiccup == (comm.rank, k):
                t *= 1 + 2 * (slowdown - 1) * steps
            comm.compute(seconds=t, name=f"step {k}")
            comm.all_reduce(np.ones(64, np.float32))
        return comm.rank

    world = World(n, faults=[Straggler(slow, slowdown)] if slowdown > 1 else [])
    world.run(prog)
    return world


STRAGGLER_CASES = [  # (ranks, steps, slow rank, slowdown, seed, hiccup)
    (4, 10, 2, 1.3, 0, None), (8, 12, 5, 1.15, 1, (1, 3)), (3, 8, 0, 1.5, 2, (2, 0)),
    (16, 10, 11, 1.2, 3, (4, 7)), (8, 20, 7, 1.1, 4, (0, 19)), (5, 6, 3, 2.0, 5, None),
]


def check_find_straggler(fn):
    """Exercise 7.1: fn(timeline) -> the rank whose compute ends last, step after step."""
    what = "Exercise 7.1"
    for n, steps, slow, slowdown, seed, hiccup in STRAGGLER_CASES:
        tl = straggler_world(n, steps, slow, slowdown, seed, hiccup).timeline()
        with refusing(what, *STRAGGLER):
            got = fn(tl)
        expect(isinstance(got, (int, np.integer)) and not isinstance(got, bool),
               f"{what}: return a rank number (an int), got {got!r}")
        if got != slow:
            raise CheckFailed(f"{what}, {n} ranks, {steps} steps: the straggler is rank {slow} ({slowdown}x slower), "
                              f"not rank {got}.{_straggler_hint(tl, int(got), slow, steps)}")
    passed(what, f"the slow rank found in {len(STRAGGLER_CASES)} runs of 3 to 16 ranks, despite noise and hiccups")


def _straggler_hint(tl, got, slow, steps):
    """What is true of the rank a wrong answer named, from the timeline: in how many steps it
    ends last (a hiccup's one step, or none), and whether it waits more than most."""
    if not 0 <= got < tl.size:
        return f" There are {tl.size} ranks, 0 to {tl.size - 1}."
    ends = np.array([[e.end for e in tl.of(r, "compute", "compute")] for r in range(tl.size)])
    last = np.argmax(ends, axis=0)  # per step: whose compute ends last
    mine = [int(k) for k in np.flatnonzero(last == got)]
    if mine == [steps - 1]:  # the final step alone decided (an answer reading totals failed an earlier case)
        return (f" Rank {got} ends last only in the final step (step {steps - 1}), where one very slow step (a "
                f"hiccup) put it behind; rank {slow} ends last in {int(np.sum(last == slow))} of {steps}. The last "
                f"step alone shows who hiccupped there, not who is slow: count, step by step, whose compute ends "
                f"last.")
    if mine:
        which = ", ".join(str(k) for k in mine[:3]) + ("..." if len(mine) > 3 else "")
        total = max(range(tl.size), key=lambda r: tl.total("compute", r)) == got
        return (f" Rank {got} ends last in {len(mine)} of {steps} steps (step {which})"
                + (", one very slow step that also gives it the most compute in total" if total else "")
                + f"; rank {slow} ends last in {int(np.sum(last == slow))}. A single bad step (a hiccup) is not "
                  f"a straggler: count, step by step, whose compute ends last.")
    if tl.total("idle", got) > np.median([tl.total("idle", r) for r in range(tl.size)]):
        return (f" Rank {got} never ends last, and it waits more than most: the straggler is the one the others "
                f"wait for.")
    return f" Rank {got} never ends last in a step; count, step by step, whose compute ends last."


# ----------------------------------------------------------------- Exercise 7.2: reading a block
MODEL = dict(vocab=16, d_model=16, n_heads=4, d_ff=32, n_layers=2, max_seq=8)
PAIRS = [(ParallelDims(dp=4), ParallelDims(dp=3)),
         (ParallelDims(tp=2), ParallelDims(tp=4, zero_stage=3)),
         (ParallelDims(pp=2, zero_stage=1, micro_batches=2), ParallelDims(dp=2, tp=2, zero_stage=3))]
_saved = {}


def _saved_runs():
    """Per mesh pair: the uninterrupted run's parameters and a checkpoint after its first
    step (made once per kernel, with the library's loader)."""
    if not _saved:
        model = nn.GPT(**MODEL, dtype=np.float64)
        params = model.init(np.random.default_rng(0))
        batches = synthetic_batches(2, 12, 8, 16, seed=1)
        root = Path(tempfile.mkdtemp(prefix="lesson07-"))
        for i, (a, _) in enumerate(PAIRS):
            run_on_mesh(model, params, batches[:1], a, nn.AdamW(lr=1e-2), checkpoint_dir=root / str(i))
            _saved[i] = (run_on_mesh(model, params, batches, a, nn.AdamW(lr=1e-2)).params, root / str(i))
        _saved["model"], _saved["batches"], _saved["root"] = model, batches, root
    return _saved


def _resume(fn, what, path, dims):
    try:
        with refusing(what, *READ):
            return run_on_mesh(_saved["model"], None, _saved["batches"][1:], dims, nn.AdamW(lr=1e-2),
                               resume_from=Checkpoint(path, read_block=fn))
    except RankError as exc:
        if isinstance(exc.original, (NotImplementedError, CheckFailed)):
            raise exc.original from None
        raise CheckFailed(f"{what}: resuming on {dims} with your read_block failed on rank {exc.rank}: "
                          f"{type(exc.original).__name__}: {exc.original}") from None


def check_read_block(fn):
    """Exercise 7.2: fn(saved, offsets, sizes) -> the block of a tensor saved as chunks."""
    what = "Exercise 7.2"
    check_blocks(fn, what)
    saved = _saved_runs()
    for i, (a, b) in enumerate(PAIRS):
        full, path = saved[i]
        got = _resume(fn, what, path, b).params
        diff = {k: float(np.max(np.abs(got[k] - full[k]))) for k in full}
        worst = max(diff, key=diff.get)
        expect(diff[worst] < 1e-12, f"{what}: saved on {a} after one step, resumed on {b}: {worst} differs from the "
                                    f"run that never stopped by {diff[worst]:.3g}")
    passed(what, f"blocks read from {len(READ_SHAPES)} random tilings; runs resharded "
                 f"{', '.join(f'{_short(a)} -> {_short(b)}' for a, b in PAIRS)} equal the runs that never stopped")


def _short(dims):
    axes = " x ".join(f"{a.upper()} {getattr(dims, a)}" for a in ("dp", "tp", "pp") if getattr(dims, a) > 1) or "1 GPU"
    return axes + (f" (ZeRO-{dims.zero_stage})" if dims.zero_stage else "")


def cleanup():
    """Remove the checkpoints the checks made."""
    if "root" in _saved:
        shutil.rmtree(_saved["root"], ignore_errors=True)
    _saved.clear()


# ----------------------------------------------------------------- Exercise 7.3: the interval
RESTART = 15 * 60.0  # section 7's restart: a 10-minute watchdog and 5 minutes to relaunch and load
INTERVAL_CASES = [(60.0, F.llama3_job_mtbf()), (300.0, 24 * 3600.0), (10.0, 1800.0), (1.0, 1000 * 3600.0),
                  (120.0, 6 * 3600.0)]


def check_optimal_interval(fn):
    """Exercise 7.3: fn(save_cost, mtbf) -> the checkpoint interval (seconds) that
    maximises goodput."""
    what = "Exercise 7.3"
    for save, mtbf in INTERVAL_CASES:
        with refusing(what, *INTERVAL):
            tau = fn(save, mtbf)
        try:
            tau = float(tau)
        except (TypeError, ValueError):
            raise CheckFailed(f"{what}: return a number of seconds, got {tau!r}") from None
        expect(np.isfinite(tau) and tau > 0, f"{what}: save cost {save:g} s, MTBF {mtbf:g} s: the interval must be a "
                                            f"positive number of seconds, got {tau!r}")
        best = F.expected_goodput(F.daly_interval(save, mtbf), save, mtbf)
        got = F.expected_goodput(tau, save, mtbf)
        expect(got >= best * (1 - 1e-3), f"{what}: save cost {save:g} s, MTBF {mtbf / 3600:.3g} h: checkpointing every "
                                         f"{tau:.4g} s gives a goodput of {got:.4f}, the best interval "
                                         f"{best:.4f}; balance the cost of saving (save cost / interval) against the "
                                         f"work a failure loses (half an interval per MTBF)")
    # at Llama 3's rate, by Monte Carlo: the same random failures for every interval
    save, mtbf = INTERVAL_CASES[0]
    with refusing(what, *INTERVAL):
        tau = float(fn(save, mtbf))
    grid = np.geomspace(tau / 3, tau * 3, 9)
    sims = [F.simulate_goodput(t, save, mtbf, restart=RESTART, runs=150, seed=11).mean() for t in grid]
    mine = sims[4]
    expect(mine >= max(sims) - 2e-3, f"{what}: simulated at Llama 3's rate with a {RESTART / 60:.0f}-minute restart, "
                                     f"goodput {mine:.4f} at your interval, {max(sims):.4f} at "
                                     f"{grid[int(np.argmax(sims))]:.4g} s")
    passed(what, f"every {tau / 60:.1f} minutes at Llama 3's rate, a 60 s save and a {RESTART / 60:.0f}-minute restart "
                 f"(section 7's): goodput {mine:.3f} in 150 simulated runs, the best of intervals 3x shorter to 3x "
                 f"longer; right for {len(INTERVAL_CASES)} cost and MTBF pairs")


# ----------------------------------------------------------------- napkins
def _watchdog_model(gpus, timeout_minutes):
    return (F.watchdog_gpu_hours(gpus, timeout_minutes),)


def napkin_watchdog(fn):
    """Napkin 7.1: fn(gpus, timeout_minutes) -> GPU-hours idle per failure."""
    cases = [dict(gpus=16384, timeout_minutes=10), dict(gpus=2048, timeout_minutes=30),
             dict(gpus=100000, timeout_minutes=2), dict(gpus=8, timeout_minutes=10)]
    (h,) = variants("Napkin 7.1", lambda **kw: (fn(**kw),), cases, _watchdog_model, " GPU-hours", ("GPU-hours",),
                    (F.watchdog_gpu_hours,))
    passed("Napkin 7.1", f"{h:,.0f} GPU-hours idle per failure while 16,384 GPUs wait out a 10-minute watchdog")


_goodput_first_order, _goodput_daly = F.goodput_first_order, F.goodput_daly  # Napkin 7.2's two models


GOODPUT_CASES = [dict(gpus=16384, gpu_mtbf_hours=50000, interval_minutes=20, save_seconds=60, restart_minutes=15),
                 dict(gpus=4096, gpu_mtbf_hours=50000, interval_minutes=60, save_seconds=120, restart_minutes=10),
                 dict(gpus=65536, gpu_mtbf_hours=80000, interval_minutes=10, save_seconds=20, restart_minutes=5),
                 dict(gpus=1024, gpu_mtbf_hours=30000, interval_minutes=120, save_seconds=300, restart_minutes=30)]


def napkin_goodput(fn):
    """Napkin 7.2: fn(gpus, gpu_mtbf_hours, interval_minutes, save_seconds, restart_minutes)
    -> goodput, to first order (Daly's exact expectation is accepted too)."""
    what = "Napkin 7.2"
    for i, case in enumerate(GOODPUT_CASES):
        with refusing(what, F.expected_goodput, F.goodput_first_order, F.goodput_daly):
            got = fn() if i == 0 else fn(**case)
        try:
            got = float(got)
        except (TypeError, ValueError):
            raise CheckFailed(f"{what}: return the goodput as a number between 0 and 1, got {got!r}") from None
        models = (_goodput_first_order(**case), _goodput_daly(**case))
        ok = any(abs(got - m) <= 0.02 * m for m in models)
        args = ", ".join(f"{k}={v:g}" for k, v in case.items())
        expect(ok, f"{what} ({args}): expected about {models[0]:.4f} (to first order; {models[1]:.4f} in Daly's "
                   f"model), got {got:.4g}. The job fails every GPU MTBF / GPUs; per interval you pay one save, per "
                   f"failure half an interval of lost work and the restart")
    passed(what, f"goodput {_goodput_first_order(**GOODPUT_CASES[0]):.3f} for 16,384 GPUs checkpointing every 20 "
                 f"minutes (Daly's model: {_goodput_daly(**GOODPUT_CASES[0]):.3f})")
