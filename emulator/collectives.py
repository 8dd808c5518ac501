"""Collectives in the global view: functions over the list of every rank's buffer.

Versions side by side, each with a one-line NumPy truth:

* ``ring``  -- bandwidth-optimal. Reduce-scatter in n-1 steps, all-gather in n-1 steps,
  all-reduce = reduce-scatter then all-gather (2(n-1) steps). Each rank sends
  (n-1)/n of the buffer per phase, whatever n is.
* ``tree``  -- latency-optimal: a binomial tree reduces to rank 0 (ceil(log2 n) steps) and
  broadcasts back (ceil(log2 n) steps); every step moves the whole buffer.
* ``naive`` -- everybody sends everything to rank 0, which reduces and sends it back:
  two steps, but rank 0's link carries (n-1) whole buffers each way.

Every algorithm is written once (:mod:`emulator.ring`, :mod:`emulator.tree`), as a
generator that mutates stacked per-rank buffers and yields the :class:`Messages` of each
communication step. Three things use it:
``ring_all_reduce(bufs)`` (run to the end, return the results), ``ring_all_reduce_steps(bufs)``
(yield a :class:`Step` snapshot after every step, for pictures and widgets) and the SPMD
engine in :mod:`emulator.world` (which needs the results plus the messages, to charge time
and record the trace).

A ring step is one vectorised operation over all ranks (every rank sends at once), not a
loop over ranks: see :mod:`emulator.ring`.
"""

from dataclasses import dataclass
from functools import partial

import math

import numpy as np

from . import ring, tree
from .errors import ArgumentError, ShapeError
from .messages import Messages

REDUCE_OPS = ("sum", "mean", "max", "min")
ALGORITHMS = ("ring", "tree", "naive")
_NP_REDUCE = {"sum": np.sum, "mean": np.mean, "max": np.max, "min": np.min}


# --------------------------------------------------------------------------- references
def reference_all_reduce(bufs, op="sum"):
    return [_NP_REDUCE[op](np.stack(bufs), axis=0) for _ in bufs]


def reference_reduce_scatter(bufs, op="sum"):
    return np.split(_NP_REDUCE[op](np.stack(bufs), axis=0), len(bufs))


def reference_all_gather(bufs):
    return [np.concatenate(bufs) for _ in bufs]


def reference_broadcast(bufs, src=0):
    return [bufs[src].copy() for _ in bufs]


def reference_all_to_all(chunks):
    return [[chunks[i][r] for i in range(len(chunks))] for r in range(len(chunks))]


# --------------------------------------------------------------------------- messages
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


# --------------------------------------------------------------------------- layouts
def _check_same(bufs, what):
    if len(bufs) == 0:
        raise ShapeError(f"{what}: need one buffer per rank, got an empty list")
    a0 = np.asarray(bufs[0])
    for r, b in enumerate(bufs):
        if not isinstance(b, np.ndarray):
            b = np.asarray(b)
        if b.shape != a0.shape or b.dtype != a0.dtype:
            raise ShapeError(
                f"{what}: rank {r} has shape {b.shape} dtype {b.dtype}, but rank 0 has "
                f"shape {a0.shape} dtype {a0.dtype}; every rank must pass the same shape and dtype"
            )
    return a0.shape, a0.dtype


def _chunk_nbytes(total, n, itemsize):
    """Bytes of each of the n chunks of a ``total``-element buffer (ceil-sized chunks, the
    last ones shorter or empty), and the chunk length m."""
    m = -(-total // n)
    return tuple(max(0, min(m, total - c * m)) * itemsize for c in range(n)), m


# --------------------------------------------------------------------------- plans
class _Plan:
    """One collective on stacked buffers: a generator of steps and a way to read results.

    ``holds0()`` gives the starting bitmask of who holds what, for :class:`Step` snapshots.
    """

    def __init__(self, gen, results, snapshot, holds0, messages=None, direct=None):
        self.gen, self.results, self.snapshot, self.holds0 = gen, results, snapshot, holds0
        self.messages = messages  # the cached messages, when the pattern is fixed
        self.direct = direct  # the same arithmetic without per-step slices (small buffers)


SMALL = 64 * 1024  # bytes per rank below which the ring runs chunk-major (ring.reduce_scatter_direct)


def _small(n, m, itemsize):
    return n * m * itemsize <= SMALL


def _reduce_holds(n):
    return np.tile((1 << np.arange(n, dtype=object))[:, None], (1, n))


def _gather_holds(n):
    h = np.zeros((n, n), dtype=object)
    h[np.arange(n), np.arange(n)] = 1 << np.arange(n, dtype=object)
    return h


def _broadcast_holds(n, src):
    holds = np.zeros((n, 1), dtype=object)
    holds[src, 0] = 1 << src
    return holds


def check_op(op, dtype, who=""):
    """A reduce op the collectives know, on a dtype it makes sense for. ``who`` prefixes
    the message (the SPMD view names the rank)."""
    if op not in REDUCE_OPS:
        raise ArgumentError(f"{who}unknown reduce op {op!r}; choose one of {REDUCE_OPS}")
    if op == "mean" and dtype.kind in "iub":
        raise ShapeError(f"{who}op='mean' needs a floating dtype, got {dtype}; use op='sum' and divide")


def check_algorithm(algorithm, who=""):
    if algorithm not in ALGORITHMS:
        raise ArgumentError(f"{who}unknown algorithm {algorithm!r}; choose one of {ALGORITHMS}")


def _finish_mean(out, op, n):
    if op == "mean":
        out /= n
    return out


def plan_all_reduce(bufs, op="sum", algorithm="ring"):
    shape, dtype = _check_same(bufs, "all_reduce")
    check_op(op, dtype)
    check_algorithm(algorithm)
    n, total = len(bufs), math.prod(shape)
    chunk_bytes, m = _chunk_nbytes(total, n, dtype.itemsize)
    X = ring.stack(bufs, n, m, total)
    if algorithm == "ring":
        gen = _chain(ring.reduce_scatter(X, op, chunk_bytes), ring.all_gather(X, chunk_bytes))

        def direct():
            X[:] = ring.reduce_scatter_direct(X, op)[None]  # then every rank receives every chunk

        return _Plan(gen, lambda: _natural_results(X, total, shape, op), lambda: list(X.copy()),
                     partial(_reduce_holds, n), ring.all_reduce_messages(n, chunk_bytes),
                     direct if _small(n, m, dtype.itemsize) else None)
    if algorithm == "tree":
        gen = _chain(tree.tree_reduce(X, op, chunk_bytes), tree.tree_broadcast(X, chunk_bytes))
    else:
        gen = _chain(tree.naive_reduce(X, op, chunk_bytes), tree.naive_broadcast(X, chunk_bytes))
    return _Plan(gen, lambda: _natural_results(X, total, shape, op), lambda: list(X.copy()), partial(_reduce_holds, n))


def plan_reduce_scatter(bufs, op="sum", algorithm="ring"):
    shape, dtype = _check_same(bufs, "reduce_scatter")
    check_op(op, dtype)
    check_algorithm(algorithm)
    n = len(bufs)
    if len(shape) == 0 or shape[0] % n:
        raise ShapeError(
            f"reduce_scatter: axis 0 of shape {shape} does not split into {n} equal chunks; "
            f"pad axis 0 to a multiple of {n}"
        )
    out_shape = (shape[0] // n,) + shape[1:]
    total = math.prod(shape)
    chunk_bytes, m = _chunk_nbytes(total, n, dtype.itemsize)
    X = ring.stack(bufs, n, m, total)
    static = direct = None
    if algorithm == "ring":
        gen = ring.reduce_scatter(X, op, chunk_bytes)
        static = ring.messages(n, "reduce-scatter", chunk_bytes)
        if _small(n, m, dtype.itemsize):
            def reduce_scatter_direct():
                ring.diagonal(X)[:] = ring.reduce_scatter_direct(X, op)
            direct = reduce_scatter_direct
    elif algorithm == "tree":
        gen = _chain(tree.tree_reduce(X, op, chunk_bytes), tree.tree_scatter(X, chunk_bytes))
    else:
        gen = _chain(tree.naive_reduce(X, op, chunk_bytes), tree.naive_scatter(X, chunk_bytes))

    def results():
        out = _finish_mean(ring.diagonal(X).copy(), op, n)
        return [out[r].reshape(out_shape) for r in range(n)]

    return _Plan(gen, results, lambda: list(X.copy()), partial(_reduce_holds, n), static, direct)


def plan_all_gather(bufs, algorithm="ring"):
    shape, dtype = _check_same(bufs, "all_gather")
    check_algorithm(algorithm)
    if len(shape) == 0:
        raise ShapeError("all_gather: got a 0-d array; pass an array with at least one dim")
    n, m = len(bufs), math.prod(shape)
    chunk_bytes = (m * dtype.itemsize,) * n
    out_shape = (n * shape[0],) + shape[1:]
    X = np.empty((n, n, m), dtype=dtype)
    ring.diagonal(X)[:] = np.stack([np.asarray(b).reshape(-1) for b in bufs])
    static = None
    if algorithm == "ring":
        gen = ring.all_gather(X, chunk_bytes)
        static = ring.messages(n, "all-gather", chunk_bytes)
    elif algorithm == "tree":
        gen = _chain(tree.tree_gather(X, chunk_bytes), tree.tree_broadcast(X, chunk_bytes))
    else:
        gen = _chain(tree.naive_gather(X, chunk_bytes), tree.naive_broadcast(X, chunk_bytes))
    results = lambda: [X[r].reshape(out_shape) for r in range(n)]  # noqa: E731
    return _Plan(gen, results, lambda: list(X.copy()), partial(_gather_holds, n), static)


def plan_broadcast(bufs, src=0, algorithm="tree"):
    shape, dtype = _check_same(bufs, "broadcast")
    n = len(bufs)
    if not 0 <= src < n:
        raise ArgumentError(f"broadcast: src={src} is out of range for {n} ranks")
    total = math.prod(shape)
    X = np.empty((n, 1, total), dtype=dtype)
    X[src, 0] = np.asarray(bufs[src]).reshape(-1)
    nbytes = np.array([total * dtype.itemsize])
    if algorithm == "naive":
        gen = tree.naive_broadcast(X, nbytes, root=src)
    else:
        gen = tree.tree_broadcast(X, nbytes, root=src)
    return _Plan(gen, lambda: [X[r, 0].reshape(shape) for r in range(n)], lambda: list(X.copy()), partial(_broadcast_holds, n, src))


def _natural_results(X, total, shape, op):
    """Rank r's result is row r of X, its padding cut off: a view, since X belongs to this
    collective alone (ring.stack copied the inputs)."""
    n = X.shape[0]
    out = _finish_mean(X.reshape(n, -1)[:, :total], op, n)
    return [out[r].reshape(shape) for r in range(n)]


def _chain(*gens):
    for g in gens:
        yield from g


def all_to_all_pairwise(chunks):
    """Pairwise exchange: in step s (1..n-1) rank r sends its chunk for rank r+s.

    ``chunks[r][i]`` is what rank r sends to rank i; returns (received, messages) with
    ``received[r][i]`` what rank r got from rank i.
    """
    n = len(chunks)
    for r, row in enumerate(chunks):
        if len(row) != n:
            raise ShapeError(f"all_to_all: rank {r} passed {len(row)} arrays; pass one per rank ({n})")
    received = [[np.array(chunks[i][r], copy=True) for i in range(n)] for r in range(n)]
    sizes = np.array([[np.asarray(chunks[i][j]).nbytes for j in range(n)] for i in range(n)])
    steps = []
    for s in range(1, n):
        src = np.arange(n)
        dst = (src + s) % n
        steps.append(Messages("all-to-all", src, dst, dst, sizes[src, dst], False))
    return received, steps


# --------------------------------------------------------------------------- public API
def run_plan(plan):
    """Run a plan to the end: (per-rank results, the Messages of every step)."""
    if plan.direct is not None:
        plan.direct()
        steps = plan.messages
    else:
        steps = list(plan.gen)
    return plan.results(), plan.messages if plan.messages is not None else steps


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
