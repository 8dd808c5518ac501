"""Collectives in the global view: functions over the list of every rank's buffer.

Versions side by side, each with a one-line NumPy truth:

* ``ring``  -- bandwidth-optimal. Reduce-scatter in n-1 steps, all-gather in n-1 steps,
  all-reduce = reduce-scatter then all-gather (2(n-1) steps). Each rank sends
  (n-1)/n of the buffer per phase, whatever n is.
* ``tree``  -- latency-optimal: a binomial tree reduces to rank 0 (ceil(log2 n) steps) and
  broadcasts back (ceil(log2 n) steps); every step moves the whole buffer.
* ``naive`` -- everybody sends everything to rank 0, which reduces and sends it back:
  two steps, but rank 0's link carries (n-1) whole buffers each way.

Every algorithm is written once, as a generator that mutates stacked per-rank buffers and
yields the :class:`Messages` of each communication step. Three things use it:
``ring_all_reduce(bufs)`` (run to the end, return the results), ``ring_all_reduce_steps(bufs)``
(yield a :class:`Step` snapshot after every step, for pictures and widgets) and the SPMD
engine in :mod:`emulator.world` (which needs the results plus the messages, to charge time
and record the trace).

A ring step is one vectorised operation over all ranks (every rank sends at once): the
buffers are stacked as rows ``rank * n + chunk`` of one array, and the chunks that move in
a step lie on a wrapped diagonal, which is a strided slice (step n+1) of those rows. So
"every rank r passes one chunk to rank r+1" is three slice operations, not a loop over ranks.
"""

from dataclasses import dataclass
from functools import lru_cache, partial

import math

import numpy as np

from .errors import ArgumentError, ShapeError

REDUCE_OPS = ("sum", "mean", "max", "min")
ALGORITHMS = ("ring", "tree", "naive")
_UFUNC = {"sum": np.add, "mean": np.add, "max": np.maximum, "min": np.minimum}
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
class Messages:
    """The messages of one communication step, all sent at once.

    ``chunks`` is either a 1-D int array (message i carries chunk ``chunks[i]``) or a 2-D
    bool mask (message i carries the chunks where ``chunks[i]`` is True). ``reduce`` says
    whether the receiver combines what arrives with what it holds, or overwrites.
    """

    phase: str
    src: np.ndarray
    dst: np.ndarray
    chunks: np.ndarray
    nbytes: np.ndarray
    reduce: bool
    exclusive: bool = True  # no rank sends or receives two messages in this step

    def chunk_mask(self, n_chunks):
        if self.chunks.ndim == 2:
            return self.chunks
        mask = np.zeros((len(self.src), n_chunks), dtype=bool)
        mask[np.arange(len(self.src)), self.chunks] = True
        return mask


@dataclass
class Step:
    """What a ``*_steps`` generator yields after each communication step.

    ``holds[r, c]`` is a bitmask of the ranks whose input is already inside chunk ``c`` on
    rank ``r`` (0: rank r does not hold chunk c yet); ``complete(r, c)`` says whether it is
    final. ``buffers[r]`` is rank r's data, shape (n_chunks, chunk_elements).
    """

    index: int
    phase: str
    src: np.ndarray
    dst: np.ndarray
    chunks: list
    nbytes: np.ndarray
    holds: np.ndarray
    buffers: list

    @property
    def n(self):
        return self.holds.shape[0]

    def contributors(self, rank, chunk):
        """The ranks whose input chunk ``chunk`` on ``rank`` already contains."""
        bits = int(self.holds[rank, chunk])
        return [k for k in range(self.n) if bits >> k & 1]

    def complete(self, rank, chunk):
        return int(self.holds[rank, chunk]) == (1 << self.n) - 1


@lru_cache(maxsize=512)
def _ring_messages(n, phase, chunk_bytes):
    """The messages of every step of a ring phase. Cached: they depend only on n and the
    chunk sizes, and the world caches their timing by identity."""
    src = np.arange(n)
    dst = (src + 1) % n
    cb = np.array(chunk_bytes, dtype=np.int64)
    out = []
    for s in range(n - 1):
        chunk = (src - (s + 1 if phase == "reduce-scatter" else s)) % n
        out.append(Messages(phase, src, dst, chunk, cb[chunk], phase == "reduce-scatter"))
    return tuple(out)


@lru_cache(maxsize=512)
def _ring_all_reduce_messages(n, chunk_bytes):
    return _ring_messages(n, "reduce-scatter", chunk_bytes) + _ring_messages(n, "all-gather", chunk_bytes)


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


def _stack(bufs, n, m, total):
    """Stack flat buffers as (n, n, m): rank, chunk, element (zero-padded at the end)."""
    if total == n * m:
        return np.stack(bufs).reshape(n, n, m)
    X = np.zeros((n, n * m), dtype=np.asarray(bufs[0]).dtype)
    for r, b in enumerate(bufs):
        X[r, :total] = np.asarray(b).reshape(-1)
    return X.reshape(n, n, m)


def _ring_pass(X, shift, ufunc=None):
    """Every rank r passes its chunk (r - shift) mod n to rank r+1, which combines it with
    its own copy (``ufunc``) or stores it (``ufunc=None``); all ranks at once.

    In the flat rows F[rank * n + chunk], rank r's chunk sits at r*(n+1) - shift (plus n
    when it wraps) and the receiver's copy n rows later, except for rank n-1 whose
    receiver is rank 0: two strided slices and one row."""
    n = X.shape[0]
    F = X.reshape(n * n, -1)
    for src, dst in _ring_slices(n, shift):
        if ufunc is None:
            F[dst] = F[src]
        else:
            d = F[dst]
            ufunc(d, F[src], out=d)


@lru_cache(maxsize=1024)
def _ring_slices(n, shift):
    """(source rows, destination rows) of one ring pass, as slices of F[rank * n + chunk]."""
    step, pairs = n + 1, []
    for r0, r1, wrap in ((shift, n - 1, 0), (0, min(shift, n - 1), n)):
        if r1 > r0:
            a = r0 * step - shift + wrap
            b = (r1 - 1) * step - shift + wrap + 1
            pairs.append((slice(a, b, step), slice(a + n, b + n, step)))
    c = (n - 1 - shift) % n
    pairs.append((slice((n - 1) * n + c, (n - 1) * n + c + 1), slice(c, c + 1)))
    return tuple(pairs)


def _diagonal(X):
    """Rows (r, r): the chunk each rank owns. A strided view."""
    n = X.shape[0]
    return X.reshape(n * n, -1)[:: n + 1]


def _chunk_nbytes(total, n, itemsize):
    """Bytes of each of the n chunks of a ``total``-element buffer (ceil-sized chunks, the
    last ones shorter or empty), and the chunk length m."""
    m = -(-total // n)
    return tuple(max(0, min(m, total - c * m)) * itemsize for c in range(n)), m


# --------------------------------------------------------------------------- ring
def _ring_reduce_scatter(X, op, chunk_bytes):
    """Step s: every rank r sends chunk (r-s-1) mod n to rank r+1, which combines it
    with its own copy. After n-1 steps rank r holds chunk r, reduced over all ranks."""
    ufunc = _UFUNC[op]
    for s, msg in enumerate(_ring_messages(X.shape[0], "reduce-scatter", chunk_bytes)):
        _ring_pass(X, s + 1, ufunc)
        yield msg


def _ring_all_gather(X, chunk_bytes):
    """Step s: every rank r passes on chunk (r-s) mod n, the last complete chunk it got.
    Starts from rank r holding complete chunk r; ends with every rank holding all."""
    for s, msg in enumerate(_ring_messages(X.shape[0], "all-gather", chunk_bytes)):
        _ring_pass(X, s)
        yield msg


# --------------------------------------------------------------------------- tree / naive
def _levels(n):
    return max(0, int(np.ceil(np.log2(n)))) if n > 1 else 0


def _whole(n_msgs, n):
    return np.ones((n_msgs, n), dtype=bool)


def _tree_reduce(X, op, chunk_bytes, root=0):
    """Binomial tree towards ``root``: at level k, rank v (relative) with bit k set and
    lower bits clear sends its whole buffer to v - 2^k."""
    chunk_bytes = np.asarray(chunk_bytes, dtype=np.int64)
    n = X.shape[0]
    ufunc = _UFUNC[op]
    for k in range(_levels(n)):
        v = np.arange(1 << k, n, 1 << (k + 1))
        src, dst = (v + root) % n, (v - (1 << k) + root) % n
        X[dst] = ufunc(X[dst], X[src])
        yield Messages("reduce", src, dst, _whole(len(src), n), np.full(len(src), chunk_bytes.sum()), True)


def _tree_broadcast(X, chunk_bytes, root=0):
    chunk_bytes = np.asarray(chunk_bytes, dtype=np.int64)
    n = X.shape[0]
    for k in reversed(range(_levels(n))):
        v = np.arange(0, n - (1 << k), 1 << (k + 1))
        src, dst = (v + root) % n, (v + (1 << k) + root) % n
        X[dst] = X[src]
        yield Messages("broadcast", src, dst, _whole(len(src), n), np.full(len(src), chunk_bytes.sum()), False)


def _subtree_mask(v, k, n):
    """Chunks owned by the binomial subtree rooted at relative rank v of level k."""
    mask = np.zeros((len(v), n), dtype=bool)
    for i, a in enumerate(v):
        mask[i, a : min(a + (1 << k), n)] = True
    return mask


def _tree_scatter(X, chunk_bytes):
    """Rank 0 holds every chunk; hand chunk c down a binomial tree to rank c."""
    chunk_bytes = np.asarray(chunk_bytes, dtype=np.int64)
    n = X.shape[0]
    for k in reversed(range(_levels(n))):
        src = np.arange(0, n - (1 << k), 1 << (k + 1))
        dst = src + (1 << k)
        mask = _subtree_mask(dst, k, n)
        for i in range(len(src)):
            X[dst[i], mask[i]] = X[src[i], mask[i]]
        yield Messages("scatter", src, dst, mask, (mask * chunk_bytes).sum(1), False)


def _tree_gather(X, chunk_bytes):
    """Rank c holds chunk c; collect every chunk on rank 0 up a binomial tree."""
    chunk_bytes = np.asarray(chunk_bytes, dtype=np.int64)
    n = X.shape[0]
    for k in range(_levels(n)):
        src = np.arange(1 << k, n, 1 << (k + 1))
        dst = src - (1 << k)
        mask = _subtree_mask(src, k, n)
        for i in range(len(src)):
            X[dst[i], mask[i]] = X[src[i], mask[i]]
        yield Messages("gather", src, dst, mask, (mask * chunk_bytes).sum(1), False)


def _naive_reduce(X, op, chunk_bytes):
    chunk_bytes = np.asarray(chunk_bytes, dtype=np.int64)
    n = X.shape[0]
    if n > 1:
        X[0] = _UFUNC[op].reduce(X, axis=0)
        src = np.arange(1, n)
        yield Messages("reduce", src, np.zeros(n - 1, int), _whole(n - 1, n), np.full(n - 1, chunk_bytes.sum()), True, False)


def _naive_gather(X, chunk_bytes):
    chunk_bytes = np.asarray(chunk_bytes, dtype=np.int64)
    n = X.shape[0]
    if n > 1:
        src = np.arange(1, n)
        X[0, src] = X[src, src]
        yield Messages("gather", src, np.zeros(n - 1, int), src, chunk_bytes[src], False, False)


def _naive_broadcast(X, chunk_bytes, root=0):
    chunk_bytes = np.asarray(chunk_bytes, dtype=np.int64)
    n = X.shape[0]
    if n > 1:
        dst = np.array([r for r in range(n) if r != root])
        X[dst] = X[root]
        yield Messages("broadcast", np.full(n - 1, root), dst, _whole(n - 1, n), np.full(n - 1, chunk_bytes.sum()), False, False)


def _naive_scatter(X, chunk_bytes):
    chunk_bytes = np.asarray(chunk_bytes, dtype=np.int64)
    n = X.shape[0]
    if n > 1:
        dst = np.arange(1, n)
        X[dst, dst] = X[0, dst]
        yield Messages("scatter", np.zeros(n - 1, int), dst, dst, chunk_bytes[dst], False, False)


# --------------------------------------------------------------------------- plans
class _Plan:
    """One collective on stacked buffers: a generator of steps and a way to read results.

    ``holds0()`` gives the starting bitmask of who holds what, for :class:`Step` snapshots.
    """

    def __init__(self, gen, results, snapshot, holds0, messages=None):
        self.gen, self.results, self.snapshot, self.holds0 = gen, results, snapshot, holds0
        self.messages = messages  # the cached messages, when the pattern is fixed


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


def _check_op(op, dtype):
    if op not in REDUCE_OPS:
        raise ArgumentError(f"unknown reduce op {op!r}; choose one of {REDUCE_OPS}")
    if op == "mean" and dtype.kind in "iub":
        raise ShapeError(f"op='mean' needs a floating dtype, got {dtype}; use op='sum' and divide")


def _check_algorithm(algorithm):
    if algorithm not in ALGORITHMS:
        raise ArgumentError(f"unknown algorithm {algorithm!r}; choose one of {ALGORITHMS}")


def _finish_mean(out, op, n):
    if op == "mean":
        out /= n
    return out


def plan_all_reduce(bufs, op="sum", algorithm="ring"):
    shape, dtype = _check_same(bufs, "all_reduce")
    _check_op(op, dtype)
    _check_algorithm(algorithm)
    n, total = len(bufs), math.prod(shape)
    chunk_bytes, m = _chunk_nbytes(total, n, dtype.itemsize)
    X = _stack(bufs, n, m, total)
    if algorithm == "ring":
        gen = _chain(_ring_reduce_scatter(X, op, chunk_bytes), _ring_all_gather(X, chunk_bytes))
        return _Plan(gen, lambda: _natural_results(X, total, shape, op, copy=False), lambda: list(X.copy()),
                     partial(_reduce_holds, n), _ring_all_reduce_messages(n, chunk_bytes))
    if algorithm == "tree":
        gen = _chain(_tree_reduce(X, op, chunk_bytes), _tree_broadcast(X, chunk_bytes))
    else:
        gen = _chain(_naive_reduce(X, op, chunk_bytes), _naive_broadcast(X, chunk_bytes))
    return _Plan(gen, lambda: _natural_results(X, total, shape, op), lambda: list(X.copy()), partial(_reduce_holds, n))


def plan_reduce_scatter(bufs, op="sum", algorithm="ring"):
    shape, dtype = _check_same(bufs, "reduce_scatter")
    _check_op(op, dtype)
    _check_algorithm(algorithm)
    n = len(bufs)
    if len(shape) == 0 or shape[0] % n:
        raise ShapeError(
            f"reduce_scatter: axis 0 of shape {shape} does not split into {n} equal chunks; "
            f"pad axis 0 to a multiple of {n}"
        )
    out_shape = (shape[0] // n,) + shape[1:]
    total = math.prod(shape)
    chunk_bytes, m = _chunk_nbytes(total, n, dtype.itemsize)
    X = _stack(bufs, n, m, total)
    static = None
    if algorithm == "ring":
        gen = _ring_reduce_scatter(X, op, chunk_bytes)
        static = _ring_messages(n, "reduce-scatter", chunk_bytes)
    elif algorithm == "tree":
        gen = _chain(_tree_reduce(X, op, chunk_bytes), _tree_scatter(X, chunk_bytes))
    else:
        gen = _chain(_naive_reduce(X, op, chunk_bytes), _naive_scatter(X, chunk_bytes))

    def results():
        out = _finish_mean(_diagonal(X).copy(), op, n)
        return [out[r].reshape(out_shape) for r in range(n)]

    return _Plan(gen, results, lambda: list(X.copy()), partial(_reduce_holds, n), static)


def plan_all_gather(bufs, algorithm="ring"):
    shape, dtype = _check_same(bufs, "all_gather")
    _check_algorithm(algorithm)
    if len(shape) == 0:
        raise ShapeError("all_gather: got a 0-d array; pass an array with at least one dim")
    n, m = len(bufs), math.prod(shape)
    chunk_bytes = (m * dtype.itemsize,) * n
    out_shape = (n * shape[0],) + shape[1:]
    X = np.empty((n, n, m), dtype=dtype)
    _diagonal(X)[:] = np.stack([np.asarray(b).reshape(-1) for b in bufs])
    static = None
    if algorithm == "ring":
        gen = _ring_all_gather(X, chunk_bytes)
        static = _ring_messages(n, "all-gather", chunk_bytes)
    elif algorithm == "tree":
        gen = _chain(_tree_gather(X, chunk_bytes), _tree_broadcast(X, chunk_bytes))
    else:
        gen = _chain(_naive_gather(X, chunk_bytes), _naive_broadcast(X, chunk_bytes))
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
        gen = _naive_broadcast(X, nbytes, root=src)
    else:
        gen = _tree_broadcast(X, nbytes, root=src)
    return _Plan(gen, lambda: [X[r, 0].reshape(shape) for r in range(n)], lambda: list(X.copy()), partial(_broadcast_holds, n, src))


def _natural_results(X, total, shape, op, copy=True):
    """Rank r's result is row r of X (its padding cut off). ``copy=False`` hands out views
    of X itself, which the ring may do because X is private to this collective."""
    n = X.shape[0]
    out = X.reshape(n, -1)[:, :total]
    out = _finish_mean(out.copy() if copy else out, op, n)
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
    if plan.messages is not None:
        for _ in plan.gen:
            pass
        return plan.results(), plan.messages
    steps = list(plan.gen)
    return plan.results(), steps


def steps_of(plan):
    """Yield a :class:`Step` after every communication step; return the results."""
    holds = plan.holds0()
    n_chunks = holds.shape[1]
    for i, msg in enumerate(plan.gen):
        mask = msg.chunk_mask(n_chunks)
        new = holds.copy()
        for j in range(len(msg.src)):
            s, d, cs = msg.src[j], msg.dst[j], mask[j]
            new[d, cs] = (new[d, cs] | holds[s, cs]) if msg.reduce else holds[s, cs]
        holds = new
        chunk_lists = [tuple(int(c) for c in np.flatnonzero(row)) for row in mask]
        yield Step(i, msg.phase, msg.src, msg.dst, chunk_lists, msg.nbytes, holds.copy(), plan.snapshot())
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
