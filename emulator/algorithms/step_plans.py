"""Plans: one collective on stacked buffers, as a generator of steps plus its results.

A plan is what both views of the emulator run: the global view runs it to the end (or
step by step, for pictures), the SPMD engine runs it when the last rank of a group
arrives and charges its messages on the links. Ring plans take a number of ``channels``
and ``rings_for(c)``, the rings of the group for c channels (one ring in rank order by
default: the global view, or a group inside one node).
"""

import math
from functools import partial

import numpy as np

from . import ring
from . import tree
from ..arrays.shape_only import ShapeArray
from ..errors import ConfigError, ShapeError
from .reduce_ops import REDUCE_OPS

ALGORITHMS = ("ring", "tree", "naive")
SMALL = 64 * 1024  # bytes per rank below which the ring runs chunk-major (ring.direct)


class Plan:
    """``gen`` yields the Messages of each step while mutating the stacked buffers;
    ``results()`` reads every rank's result; ``snapshot()`` copies the buffers (for
    pictures); ``holds0()`` says who holds what at the start; ``messages`` are the
    cached messages when the pattern is fixed; ``direct`` does the same arithmetic
    without per-step slices (small buffers)."""

    def __init__(self, gen, results, snapshot, holds0, messages=None, direct=None):
        self.gen, self.results, self.snapshot, self.holds0 = gen, results, snapshot, holds0
        self.messages, self.direct = messages, direct


def check_op(op, dtype, who=""):
    """A reduce op the collectives know, on a dtype it makes sense for. ``who`` prefixes
    the message (the SPMD view names the rank)."""
    if op not in REDUCE_OPS:
        hint = " (torch calls the mean 'avg')" if op == "mean" else ""
        raise ConfigError(f"{who}unknown reduce op {op!r}; choose one of {REDUCE_OPS}{hint}")
    if op == "avg" and dtype.kind in "iub":
        raise ShapeError(f"{who}op='avg' needs a floating dtype, got {dtype}; use op='sum' and divide")


def check_algorithm(algorithm, who=""):
    if algorithm not in ALGORITHMS:
        raise ConfigError(f"{who}unknown algorithm {algorithm!r}; choose one of {ALGORITHMS}")


def check_same(bufs, what):
    if len(bufs) == 0:
        raise ShapeError(f"{what}: need one buffer per rank, got an empty list")
    a0 = np.asarray(bufs[0])
    for r, b in enumerate(bufs):
        if not isinstance(b, np.ndarray):
            b = np.asarray(b)
        if b.shape != a0.shape or b.dtype != a0.dtype:
            raise ShapeError(f"{what}: rank {r} has shape {b.shape} dtype {b.dtype}, but rank 0 has "
                             f"shape {a0.shape} dtype {a0.dtype}; every rank must pass the same shape and dtype")
    return a0.shape, a0.dtype


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


def _chain(*gens):
    for g in gens:
        yield from g


def _finish_avg(out, op, n):
    if op == "avg":
        out /= n
    return out


def _rings(n, c, rings_for):
    return rings_for(c) if rings_for else ring.single_ring(n, c)


def _snapshot(X):
    n = X.shape[0]
    return lambda: list(X.reshape(n, n, -1).copy())


def plan_all_reduce(bufs, op="sum", algorithm="ring", channels=1, rings_for=None):
    shape, dtype = check_same(bufs, "all_reduce")
    check_op(op, dtype)
    check_algorithm(algorithm)
    n, total = len(bufs), math.prod(shape)
    q, bounds = ring.layout(total, n, channels if algorithm == "ring" else 1)
    cb = ring.chunk_bytes(total, n, q, bounds, dtype.itemsize)
    X = ring.stack(bufs, n, q, total)

    def results():
        out = _finish_avg(ring.natural(X, total), op, n)
        return [out[r].reshape(shape) for r in range(n)]

    holds = partial(_reduce_holds, n)
    if algorithm == "ring":
        rings = _rings(n, len(bounds) - 1, rings_for)
        gen = _chain(ring.reduce_scatter(X, op, cb, rings, bounds), ring.all_gather(X, cb, rings, bounds))
        small = n * q * dtype.itemsize <= SMALL
        direct = partial(ring.direct, X, op, rings, bounds, True) if small else None
        return Plan(gen, results, _snapshot(X), holds, ring.all_reduce_messages(n, cb, rings), direct)
    per_chunk = np.array(cb).sum(axis=1)
    if algorithm == "tree":
        gen = _chain(tree.tree_reduce(X, op, per_chunk), tree.tree_broadcast(X, per_chunk))
    else:
        gen = _chain(tree.naive_reduce(X, op, per_chunk), tree.naive_broadcast(X, per_chunk))
    return Plan(gen, results, _snapshot(X), holds)


def plan_reduce_scatter(bufs, op="sum", algorithm="ring", channels=1, rings_for=None):
    shape, dtype = check_same(bufs, "reduce_scatter")
    check_op(op, dtype)
    check_algorithm(algorithm)
    n = len(bufs)
    if len(shape) == 0 or shape[0] % n:
        raise ShapeError(f"reduce_scatter: dim 0 of shape {shape} does not split into {n} equal chunks; "
                         f"pad dim 0 to a multiple of {n}")
    out_shape = (shape[0] // n,) + shape[1:]
    total = math.prod(shape)
    q, bounds = ring.layout(total, n, channels if algorithm == "ring" else 1)
    cb = ring.chunk_bytes(total, n, q, bounds, dtype.itemsize)
    X = ring.stack(bufs, n, q, total)
    static = direct = None
    if algorithm == "ring":
        rings = _rings(n, len(bounds) - 1, rings_for)
        gen = ring.reduce_scatter(X, op, cb, rings, bounds)
        static = ring.messages(n, "reduce-scatter", cb, rings)
        if n * q * dtype.itemsize <= SMALL:
            direct = partial(ring.direct, X, op, rings, bounds, False)
    else:
        per_chunk = np.array(cb).sum(axis=1)
        if algorithm == "tree":
            gen = _chain(tree.tree_reduce(X, op, per_chunk), tree.tree_scatter(X, per_chunk))
        else:
            gen = _chain(tree.naive_reduce(X, op, per_chunk), tree.naive_scatter(X, per_chunk))

    def results():
        out = _finish_avg(ring.diagonal(X).copy(), op, n)
        return [out[r].reshape(out_shape) for r in range(n)]

    return Plan(gen, results, _snapshot(X), partial(_reduce_holds, n), static, direct)


def plan_all_gather(bufs, algorithm="ring", channels=1, rings_for=None):
    shape, dtype = check_same(bufs, "all_gather")
    check_algorithm(algorithm)
    if len(shape) == 0:
        raise ShapeError("all_gather: got a 0-d array; pass an array with at least one dim")
    n, s = len(bufs), math.prod(shape)
    q, bounds = ring.layout(n * s, n, channels if algorithm == "ring" else 1)
    cb = ring.chunk_bytes(n * s, n, q, bounds, dtype.itemsize)
    out_shape = (n * shape[0],) + shape[1:]
    X = np.zeros((n, n, s), dtype=dtype)  # zeros: a picture of a step shows nothing not yet received
    ring.diagonal(X)[:] = np.stack([np.asarray(b).reshape(-1) for b in bufs])
    static = None
    if algorithm == "ring":
        rings = _rings(n, len(bounds) - 1, rings_for)
        gen = ring.all_gather(X, cb, rings, bounds)
        static = ring.messages(n, "all-gather", cb, rings)
    else:
        per_chunk = np.array(cb).sum(axis=1)
        if algorithm == "tree":
            gen = _chain(tree.tree_gather(X, per_chunk), tree.tree_broadcast(X, per_chunk))
        else:
            gen = _chain(tree.naive_gather(X, per_chunk), tree.naive_broadcast(X, per_chunk))

    def results():
        return [X[r].reshape(out_shape) for r in range(n)]

    return Plan(gen, results, _snapshot(X), partial(_gather_holds, n), static)


def plan_broadcast(bufs, src=0, algorithm="tree"):
    shape, dtype = check_same(bufs, "broadcast")
    n = len(bufs)
    if not 0 <= src < n:
        raise ConfigError(f"broadcast: src={src} is out of range for {n} ranks")
    if algorithm not in ("tree", "naive"):
        raise ConfigError(f"broadcast: algorithm must be 'tree' or 'naive', got {algorithm!r}")
    total = math.prod(shape)
    X = np.empty((n, 1, total), dtype=dtype)
    X[src, 0] = np.asarray(bufs[src]).reshape(-1)
    nbytes = np.array([total * dtype.itemsize])
    if algorithm == "naive":
        gen = tree.naive_broadcast(X, nbytes, root=src)
    else:
        gen = tree.tree_broadcast(X, nbytes, root=src)
    return Plan(gen, lambda: [X[r, 0].reshape(shape) for r in range(n)], lambda: list(X.copy()),
                partial(_broadcast_holds, n, src))


def run_plan(plan):
    """Run a plan to the end: (per-rank results, the Messages of every step)."""
    if plan.direct is not None:
        plan.direct()
        steps = plan.messages
    else:
        steps = list(plan.gen)
    return plan.results(), plan.messages if plan.messages is not None else steps


def shape_only_run(kind, shapes_dtype, n, op="sum", algorithm="ring", channels=1, rings_for=None):
    """A collective on shape-only buffers (:mod:`emulator.arrays.shape_only`): the shapes of
    its results and the messages of its steps, computed as :func:`plan_all_reduce` and the
    others compute them, without data. Rings only: a tree's messages follow its data."""
    shape, dtype = shapes_dtype
    if algorithm != "ring":
        raise ConfigError(f"a shape-only run charges ring collectives; {kind} with algorithm={algorithm!r} needs data")
    total = math.prod(shape)
    if kind == "all_gather":
        q, bounds = ring.layout(n * total, n, channels)
        cb = ring.chunk_bytes(n * total, n, q, bounds, dtype.itemsize)
        out = (n * shape[0],) + tuple(shape[1:])
    else:
        q, bounds = ring.layout(total, n, channels)
        cb = ring.chunk_bytes(total, n, q, bounds, dtype.itemsize)
        out = shape if kind == "all_reduce" else (shape[0] // n,) + tuple(shape[1:])
    rings = _rings(n, len(bounds) - 1, rings_for)
    if kind == "all_reduce":
        steps = ring.all_reduce_messages(n, cb, rings)
    else:
        steps = ring.messages(n, "reduce-scatter" if kind == "reduce_scatter" else "all-gather", cb, rings)
    return [ShapeArray(out, dtype) for _ in range(n)], steps
