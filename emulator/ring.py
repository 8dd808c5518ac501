"""The ring: every rank sends one chunk to its right neighbour in every step.

Buffers are stacked as rows ``rank * n + chunk`` of one array (shape (n, n, m)); the
chunks that move in one step lie on a wrapped diagonal of that array, which is a strided
slice (step n+1) of the rows, so a step is three slice operations for all ranks at once.
"""

from functools import lru_cache

import numpy as np

from .messages import UFUNC, Messages


@lru_cache(maxsize=512)
def messages(n, phase, chunk_bytes):
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
def all_reduce_messages(n, chunk_bytes):
    return messages(n, "reduce-scatter", chunk_bytes) + messages(n, "all-gather", chunk_bytes)


def stack(bufs, n, m, total):
    """Stack flat buffers as (n, n, m): rank, chunk, element (zero-padded at the end)."""
    if total == n * m:
        return np.stack(bufs).reshape(n, n, m)
    X = np.zeros((n, n * m), dtype=np.asarray(bufs[0]).dtype)
    for r, b in enumerate(bufs):
        X[r, :total] = np.asarray(b).reshape(-1)
    return X.reshape(n, n, m)


def ring_pass(X, shift, ufunc=None):
    """Every rank r passes its chunk (r - shift) mod n to rank r+1, which combines it with
    its own copy (``ufunc``) or stores it (``ufunc=None``); all ranks at once.

    In the flat rows F[rank * n + chunk], rank r's chunk sits at r*(n+1) - shift (plus n
    when it wraps) and the receiver's copy n rows later, except for rank n-1 whose
    receiver is rank 0: two strided slices and one row."""
    n = X.shape[0]
    F = X.reshape(n * n, -1)
    for src, dst in ring_slices(n, shift):
        if ufunc is None:
            F[dst] = F[src]
        else:
            d = F[dst]
            ufunc(d, F[src], out=d)


@lru_cache(maxsize=1024)
def ring_slices(n, shift):
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


def diagonal(X):
    """Rows (r, r): the chunk each rank owns. A strided view."""
    n = X.shape[0]
    return X.reshape(n * n, -1)[:: n + 1]


def reduce_scatter(X, op, chunk_bytes):
    """Step s: every rank r sends chunk (r-s-1) mod n to rank r+1, which combines it
    with its own copy. After n-1 steps rank r holds chunk r, reduced over all ranks."""
    ufunc = UFUNC[op]
    for s, msg in enumerate(messages(X.shape[0], "reduce-scatter", chunk_bytes)):
        ring_pass(X, s + 1, ufunc)
        yield msg


def all_gather(X, chunk_bytes):
    """Step s: every rank r passes on chunk (r-s) mod n, the last complete chunk it got.
    Starts from rank r holding complete chunk r; ends with every rank holding all."""
    for s, msg in enumerate(messages(X.shape[0], "all-gather", chunk_bytes)):
        ring_pass(X, s)
        yield msg


@lru_cache(maxsize=64)
def _contributors(n):
    """(rank, chunk) index arrays: the k-th term of chunk c comes from rank (c + 1 + k) mod n."""
    k, c = np.arange(n)[:, None], np.arange(n)[None, :]
    return (c + 1 + k) % n, np.broadcast_to(c, (n, n))


def reduce_scatter_direct(X, op):
    """The same reduce-scatter, chunk-major: step k adds the term that step k of the ring
    adds, to every chunk at once (one ufunc per step). The additions happen in the ring's
    order, so the result is bit for bit the same; only the memory layout differs (one
    extra copy of the buffers), which pays off for small buffers. Returns the reduced
    chunks, shape (n, m)."""
    n = X.shape[0]
    ranks, chunks = _contributors(n)
    terms = X[ranks, chunks]  # terms[k, c]: the k-th contribution to chunk c
    acc = terms[0]
    ufunc = UFUNC[op]
    for k in range(1, n):
        ufunc(acc, terms[k], out=acc)
    return acc
