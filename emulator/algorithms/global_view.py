"""Collectives in the global view: functions over the list of every rank's buffer.

Versions side by side, each with a one-line NumPy truth:

* ``ring``  -- bandwidth-optimal. Reduce-scatter in n-1 steps, all-gather in n-1 steps,
  all-reduce = reduce-scatter then all-gather (2(n-1) steps). Each rank sends
  (n-1)/n of the buffer per phase, whatever n is.
* ``tree``  -- latency-optimal: a binomial tree reduces to rank 0 (ceil(log2 n) steps) and
  broadcasts back (ceil(log2 n) steps); every step moves the whole buffer.
* ``naive`` -- everybody sends everything to rank 0, which reduces and sends it back:
  two steps, but rank 0's link carries (n-1) whole buffers each way.

Every algorithm is written once (:mod:`emulator.algorithms.ring`, :mod:`emulator.algorithms.tree`), as a
generator that mutates stacked per-rank buffers and yields the :class:`Messages` of each
communication step. Three things use it:
``ring_all_reduce(bufs)`` (run to the end, return the results), ``ring_all_reduce_steps(bufs)``
(yield a :class:`Step` snapshot after every step, for pictures and widgets) and the SPMD
engine in :mod:`emulator.engine.world` (which needs the results plus the messages, to charge time
and record the trace).

A ring step is one vectorised operation over all ranks (every rank sends at once), not a
loop over ranks: see :mod:`emulator.algorithms.ring`.
"""

from dataclasses import dataclass

import numpy as np

from .all_to_all import all_to_all_grouped, all_to_all_pairwise, reference_all_to_all  # noqa: F401 -- public here too
from .reduce_ops import REDUCE_OPS  # noqa: F401
from .steps import Messages  # noqa: F401
from .step_plans import (ALGORITHMS, SMALL, Plan, check_algorithm, check_op, plan_all_gather,  # noqa: F401
                    plan_all_reduce, plan_broadcast, plan_reduce_scatter, run_plan)

_NP_REDUCE = {"sum": np.sum, "avg": np.mean, "max": np.max, "min": np.min, "product": np.prod}


# --------------------------------------------------------------------------- references
def reference_all_reduce(bufs, op="sum"):
    return [_NP_REDUCE[op](np.stack(bufs), axis=0) for _ in bufs]


def reference_reduce_scatter(bufs, op="sum"):
    return np.split(_NP_REDUCE[op](np.stack(bufs), axis=0), len(bufs))


def reference_all_gather(bufs):
    return [np.concatenate(bufs) for _ in bufs]


def reference_broadcast(bufs, src=0):
    return [bufs[src].copy() for _ in bufs]


# --------------------------------------------------------------------------- step by step
@dataclass
class Step:
    """What a ``*_steps`` generator yields after each communication step.

    ``holds[r, c]`` is a bitmask of the ranks whose input is already inside chunk ``c`` on
    rank ``r`` (0: rank r does not hold chunk c yet); ``final[c]`` is the mask of a finished
    chunk c (every rank for a reduction, the owner for a gather), so ``complete(r, c)`` says
    whether rank r has its final value. ``buffers[r]`` is rank r's data, shape
    (n_chunks, chunk_elements).
    """

    index: int
    phase: str
    src: np.ndarray
    dst: np.ndarray
    chunks: list
    nbytes: np.ndarray
    holds: np.ndarray
    buffers: list
    final: list

    @property
    def n(self):
        return self.holds.shape[0]

    def contributors(self, rank, chunk):
        """The ranks whose input chunk ``chunk`` on ``rank`` already contains."""
        bits = int(self.holds[rank, chunk])
        return [k for k in range(self.n) if bits >> k & 1]

    def complete(self, rank, chunk):
        return int(self.holds[rank, chunk]) == self.final[chunk]


def initial_step(plan):
    """The state before any communication, as a :class:`Step` with no messages (index -1)."""
    holds = plan.holds0()
    empty = np.zeros(0, int)
    return Step(-1, "start", empty, empty, [], empty, holds, plan.snapshot(), _final(holds))


def _final(holds):
    """A finished chunk holds everything that exists of it: the OR over ranks at the start."""
    return [int(np.bitwise_or.reduce(holds[:, c])) for c in range(holds.shape[1])]


def steps_of(plan):
    """Yield a :class:`Step` after every communication step; return the results."""
    holds = plan.holds0()
    final = _final(holds)
    n_chunks = holds.shape[1]
    for i, msg in enumerate(plan.gen):
        mask = msg.chunk_mask(n_chunks)
        new = holds.copy()
        for j in range(len(msg.src)):
            s, d, cs = msg.src[j], msg.dst[j], mask[j]
            new[d, cs] = (new[d, cs] | holds[s, cs]) if msg.reduce else holds[s, cs]
        holds = new
        chunk_lists = [tuple(int(c) for c in np.flatnonzero(row)) for row in mask]
        yield Step(i, msg.phase, msg.src, msg.dst, chunk_lists, msg.nbytes, holds.copy(), plan.snapshot(), final)
    return plan.results()


def ring_reduce_scatter(bufs, op="sum"):
    return run_plan(plan_reduce_scatter(bufs, op, "ring"))[0]


def ring_all_gather(bufs):
    return run_plan(plan_all_gather(bufs, "ring"))[0]


def ring_all_reduce(bufs, op="sum"):
    return run_plan(plan_all_reduce(bufs, op, "ring"))[0]


def tree_all_reduce(bufs, op="sum"):
    return run_plan(plan_all_reduce(bufs, op, "tree"))[0]


def naive_all_reduce(bufs, op="sum"):
    return run_plan(plan_all_reduce(bufs, op, "naive"))[0]


def tree_reduce_scatter(bufs, op="sum"):
    return run_plan(plan_reduce_scatter(bufs, op, "tree"))[0]


def naive_reduce_scatter(bufs, op="sum"):
    return run_plan(plan_reduce_scatter(bufs, op, "naive"))[0]


def tree_all_gather(bufs):
    return run_plan(plan_all_gather(bufs, "tree"))[0]


def naive_all_gather(bufs):
    return run_plan(plan_all_gather(bufs, "naive"))[0]


def ring_reduce_scatter_steps(bufs, op="sum"):
    return steps_of(plan_reduce_scatter(bufs, op, "ring"))


def ring_all_gather_steps(bufs):
    return steps_of(plan_all_gather(bufs, "ring"))


def ring_all_reduce_steps(bufs, op="sum"):
    return steps_of(plan_all_reduce(bufs, op, "ring"))


def tree_all_reduce_steps(bufs, op="sum"):
    return steps_of(plan_all_reduce(bufs, op, "tree"))


def naive_all_reduce_steps(bufs, op="sum"):
    return steps_of(plan_all_reduce(bufs, op, "naive"))
