"""The ring: every rank sends one chunk to its right neighbour in every step.

Layout. A collective's buffers are stacked as one array ``X`` of shape (n, n, q): rank,
chunk, element. Chunk j is the part of the buffer that rank j owns after a
reduce-scatter; its elements are cut further into c channel pieces (``bounds[k]`` to
``bounds[k+1]``), each carried by its own ring, as NCCL does (see
:meth:`emulator.machine.topology.Topology.rings`).

A ring visits the ranks in some order; position p sends to position p+1. With both the
rank and the chunk axes in ring order ("position space"), the chunks that move in one step
lie on a wrapped diagonal of X: a strided slice (step n+1) of the rows ``position * n +
chunk``, so a step is three slice operations for all ranks at once, not a loop over
ranks. Channels that share an order move together. A ring whose order is not the ranks'
own (only across nodes) works on a permuted copy of its channels, written back when the
phase ends.
"""

from functools import lru_cache

import numpy as np

from .reduce_ops import UFUNC
from .steps import Messages


def is_identity(order):
    return all(i == r for i, r in enumerate(order))


@lru_cache(maxsize=512)
def messages(n, phase, chunk_bytes, rings):
    """The messages of every step of a ring phase (``"reduce-scatter"`` or
    ``"all-gather"``). ``chunk_bytes[j][k]``: bytes of chunk j's piece on channel k;
    ``rings``: ``((order, first, stop), ...)``. Cached: the world caches their timing by
    identity."""
    cb = np.array(chunk_bytes, dtype=np.int64)
    shifts = np.arange(1, n) if phase == "reduce-scatter" else np.arange(n - 1)
    pos = np.arange(n)
    src, dst, chunk, channel = [], [], [], []
    for order, first, stop in rings:
        o, k = np.asarray(order), stop - first
        src.append(np.tile(o, k))
        dst.append(np.tile(o[(pos + 1) % n], k))
        chunk.append(np.tile(o[(pos[None, :] - shifts[:, None]) % n], (1, k)))  # (steps, k n)
        channel.append(np.repeat(np.arange(first, stop), n))
    src, dst, channel = (np.concatenate(a) for a in (src, dst, channel))
    chunk = np.concatenate(chunk, axis=1)
    nbytes = cb[chunk, channel[None, :]]
    exclusive = len(rings) == 1 and rings[0][2] - rings[0][1] == 1  # one ring, one channel
    reduce = phase == "reduce-scatter"
    return tuple(Messages(phase, src, dst, chunk[s], nbytes[s], reduce, channel, exclusive) for s in range(n - 1))


@lru_cache(maxsize=512)
def all_reduce_messages(n, chunk_bytes, rings):
    return messages(n, "reduce-scatter", chunk_bytes, rings) + messages(n, "all-gather", chunk_bytes, rings)


def single_ring(n, channels=1):
    """One ring in rank order carrying every channel (one node, or the global view)."""
    return ((tuple(range(n)), 0, channels),)


# --------------------------------------------------------------------------- data
def layout(total, n, channels):
    """(q, bounds) for a buffer of ``total`` elements on n ranks: q elements per chunk,
    cut into c channel pieces, piece k from ``bounds[k]`` to ``bounds[k+1]`` (c is never
    more than q: every piece holds an element)."""
    q = -(-total // n)
    c = max(1, min(channels, q))
    return q, tuple(k * q // c for k in range(c + 1))


@lru_cache(maxsize=1024)
def chunk_bytes(total, n, q, bounds, itemsize):
    """Bytes of chunk j's piece on channel k, as a tuple of tuples (padding excluded)."""
    valid = np.minimum(np.maximum(total - np.arange(n) * q, 0), q)
    lo, hi = np.array(bounds[:-1]), np.array(bounds[1:])
    piece = np.maximum(np.minimum(valid[:, None], hi[None, :]) - lo[None, :], 0) * itemsize
    return tuple(map(tuple, piece.tolist()))


def stack(bufs, n, q, total):
    """Stack flat buffers as (n, n, q): rank, chunk, element (the last chunks zero-padded)."""
    flat = np.stack(bufs).reshape(n, total)  # the buffers have one shape (plans check it)
    if total < n * q:
        padded = np.empty((n, n * q), dtype=flat.dtype)
        padded[:, :total] = flat
        padded[:, total:] = 0
        flat = padded
    return flat.reshape(n, n, q)


def natural(X, total):
    """Every rank's buffer back in its own layout, shape (n, total), padding dropped."""
    n = X.shape[0]
    return X.reshape(n, -1)[:, :total]


def diagonal(X):
    """Rows (r, r): the chunk each rank owns. A strided view, shape (n, q)."""
    n = X.shape[0]
    return X.reshape(n * n, *X.shape[2:])[:: n + 1]


def enter(X, rings, bounds):
    """Each ring's channels in position space: a view for a ring in rank order, else a
    permuted copy. Returns [(Y, where to write it back or None)]."""
    out = []
    for order, first, stop in rings:
        view = X[:, :, bounds[first]:bounds[stop]]
        if is_identity(order):
            out.append((view, None))
        else:
            idx = np.ix_(order, order)
            out.append((view[idx], (view, idx)))
    return out


def leave(entered):
    for Y, back in entered:
        if back is not None:
            view, idx = back
            view[idx] = Y


# --------------------------------------------------------------------------- steps
def ring_pass(Y, shift, ufunc=None):
    """Every position p passes its chunk (p - shift) mod n to position p+1, which combines
    it with its own copy (``ufunc``) or stores it (``ufunc=None``); all at once.

    In the rows F[position * n + chunk], position p's chunk sits at p*(n+1) - shift (plus
    n when it wraps) and the receiver's copy n rows later, except for position n-1 whose
    receiver is position 0: two strided slices and one row."""
    n = Y.shape[0]
    F = Y.reshape(n * n, *Y.shape[2:])
    for src, dst in ring_slices(n, shift):
        if ufunc is None:
            F[dst] = F[src]
        else:
            d = F[dst]
            ufunc(d, F[src], out=d)


@lru_cache(maxsize=1024)
def ring_slices(n, shift):
    """(source rows, destination rows) of one ring pass, as slices of F[p * n + chunk]."""
    step, pairs = n + 1, []
    for r0, r1, wrap in ((shift, n - 1, 0), (0, min(shift, n - 1), n)):
        if r1 > r0:
            a = r0 * step - shift + wrap
            b = (r1 - 1) * step - shift + wrap + 1
            pairs.append((slice(a, b, step), slice(a + n, b + n, step)))
    c = (n - 1 - shift) % n
    pairs.append((slice((n - 1) * n + c, (n - 1) * n + c + 1), slice(c, c + 1)))
    return tuple(pairs)


def reduce_scatter(X, op, chunk_bytes, rings, bounds):
    """Step s: every position p sends chunk (p-s-1) mod n to p+1, which combines it with
    its own copy. After n-1 steps position p holds chunk p, reduced over all ranks."""
    ufunc = UFUNC[op]
    entered = enter(X, rings, bounds)
    for s, msg in enumerate(messages(X.shape[0], "reduce-scatter", chunk_bytes, rings)):
        for Y, _ in entered:
            ring_pass(Y, s + 1, ufunc)
        yield msg
    leave(entered)


def all_gather(X, chunk_bytes, rings, bounds):
    """Step s: every position p passes on chunk (p-s) mod n, the last complete chunk it
    got. Starts from position p holding chunk p; ends with every position holding all."""
    entered = enter(X, rings, bounds)
    for s, msg in enumerate(messages(X.shape[0], "all-gather", chunk_bytes, rings)):
        for Y, _ in entered:
            ring_pass(Y, s)
        yield msg
    leave(entered)


@lru_cache(maxsize=64)
def _contributors(n):
    """(position, chunk) index arrays: the k-th term of chunk c comes from position
    (c + 1 + k) mod n."""
    k, c = np.arange(n)[:, None], np.arange(n)[None, :]
    return (c + 1 + k) % n, np.broadcast_to(c, (n, n))


def reduce_scatter_direct(Y, op):
    """The same reduce-scatter, chunk-major: step k adds the term that step k of the ring
    adds, to every chunk at once (one ufunc per step). The additions happen in the ring's
    order, so the result is bit for bit the same; only the memory layout differs (one
    extra copy of the buffers), which pays off for small buffers. Returns the reduced
    chunks in position space, shape (n, elements)."""
    n = Y.shape[0]
    pos, chunks = _contributors(n)
    terms = Y[pos, chunks]  # terms[k, c]: the k-th contribution to chunk c
    acc = terms[0]
    ufunc = UFUNC[op]
    for k in range(1, n):
        ufunc(acc, terms[k], out=acc)
    return acc


def direct(X, op, rings, bounds, everyone):
    """Reduce-scatter chunk-major on every ring; with ``everyone`` every position then
    holds every reduced chunk (the all-gather's result) instead of just its own."""
    entered = enter(X, rings, bounds)
    for Y, _ in entered:
        acc = reduce_scatter_direct(Y, op)
        if everyone:
            Y[:] = acc[None]
        else:
            diagonal(Y)[:] = acc
    leave(entered)
