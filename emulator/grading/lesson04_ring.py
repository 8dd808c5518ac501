"""A ring attention run as lesson 04's checks read it: every call point to point with a
neighbour, the compute each rank's causal mask leaves, and the memory held beside the
library's ring run the same way."""

import numpy as np

from ..engine.world import World
from ..parallel.context_parallel import layout as L
from ..parallel.context_parallel import ring as RING
from .common import CheckFailed, expect, run_on_emulator
from .lesson04_measured_memory import traced_peak, without_torch
from .refuse import refusing


CASES = [(c, causal, layout) for c in (1, 2, 3, 4, 8) for causal in (False, True) for layout in L.LAYOUTS]


def ring_calls(label, world, c, ops=("send", "recv")):
    """Every call is point to point with a neighbour: sends to r+1, receives from r-1."""
    for r in range(c):
        calls = world.calls[r]
        bad = [x for x in calls if x.op not in ops]
        if bad:
            raise CheckFailed(f"{label}: rank {r} called {bad[0].op} on group {bad[0].group}; the ring needs point to "
                              f"point with its neighbours only (no collective gathers the sequence)")
        expect(all(x.peer == (r + 1) % c for x in calls if x.op == "send") and
               all(x.peer == (r - 1) % c for x in calls if x.op == "recv"),
               f"{label}: rank {r} talks to {sorted({x.peer for x in calls})}; send to rank r+1 and receive from "
               f"r-1 only")


def compute_per_rank(c, n, causal, layout, lead, d):
    """Seconds of compute (at 1 FLOP/s) each rank's score blocks need: the quarter-blocks a
    causal mask leaves, 4 lead n_q n_k d FLOPs each."""
    need = []
    for r in range(c):
        flops = 0
        for t in range(c):
            for rows, cols, _ in RING.blocks(r, (r - t) % c, c, n, causal, layout):
                flops += 4 * lead * (rows.stop - rows.start) * (cols.stop - cols.start) * d
        need.append(flops)
    return np.array(need, float)


def memory_against_the_library(what, label, fn, library, shards, c, block, kwargs, refuse, extra_blocks=2):
    """Run ``fn`` and the library's ring on the same shards, tracing memory; the student's
    peak may exceed the library's by ``extra_blocks`` K/V blocks per rank, no more."""

    def runner(f, refused):
        def go():
            world = World(c)
            with refusing(what, *refused):
                return run_on_emulator(world, lambda comm: f(comm, *(s[comm.rank].copy() for s in shards), **kwargs),
                                       label)
        return go

    _, lib_peak = traced_peak(runner(library, ()))
    with without_torch(what):
        _, peak = traced_peak(runner(fn, refuse))
    held = (peak - lib_peak) / (c * block) + 2
    expect(peak <= lib_peak + extra_blocks * c * block,
           f"{label}: your {c} ranks held about {held:.1f} K/V blocks each at their peak (measured), where the ring "
           f"needs two: the block it computes with and the one arriving. Keep no other rank's block once you have "
           f"folded it in (no list of blocks, no concatenated K/V)")
