"""The root-based algorithms beside the ring: a binomial tree (ceil(log2 n) steps each way,
whole buffers) and the naive one (everything to rank 0 and back, two steps).

The tree here is the textbook *binomial* tree, unpipelined: each level waits for the whole
buffer of the level below. NCCL's tree is different: a *double binary* tree (two trees, so
every rank is a leaf in one of them and both halves of the bandwidth are used) across
nodes, with the buffer pipelined in small pieces down and up the tree, which brings its
bandwidth term close to the ring's. The binomial tree shows the latency side of the
trade-off (log2 n steps instead of 2(n-1)) without that engineering."""

import numpy as np

from .reduce_ops import UFUNC
from .steps import Messages


def _levels(n):
    return max(0, int(np.ceil(np.log2(n)))) if n > 1 else 0


def _whole(n_msgs, n):
    return np.ones((n_msgs, n), dtype=bool)


def tree_reduce(X, op, chunk_bytes, root=0):
    """Binomial tree towards ``root``: at level k, rank v (relative) with bit k set and
    lower bits clear sends its whole buffer to v - 2^k."""
    chunk_bytes = np.asarray(chunk_bytes, dtype=np.int64)
    n = X.shape[0]
    ufunc = UFUNC[op]
    for k in range(_levels(n)):
        v = np.arange(1 << k, n, 1 << (k + 1))
        src, dst = (v + root) % n, (v - (1 << k) + root) % n
        X[dst] = ufunc(X[dst], X[src])
        yield Messages("reduce", src, dst, _whole(len(src), n), np.full(len(src), chunk_bytes.sum()), True,
                       exclusive=True)


def tree_broadcast(X, chunk_bytes, root=0):
    chunk_bytes = np.asarray(chunk_bytes, dtype=np.int64)
    n = X.shape[0]
    for k in reversed(range(_levels(n))):
        v = np.arange(0, n - (1 << k), 1 << (k + 1))
        src, dst = (v + root) % n, (v + (1 << k) + root) % n
        X[dst] = X[src]
        yield Messages("broadcast", src, dst, _whole(len(src), n), np.full(len(src), chunk_bytes.sum()), False,
                       exclusive=True)


def _subtree_mask(v, k, n):
    """Chunks owned by the binomial subtree rooted at relative rank v of level k."""
    mask = np.zeros((len(v), n), dtype=bool)
    for i, a in enumerate(v):
        mask[i, a : min(a + (1 << k), n)] = True
    return mask


def tree_scatter(X, chunk_bytes):
    """Rank 0 holds every chunk; hand chunk c down a binomial tree to rank c."""
    chunk_bytes = np.asarray(chunk_bytes, dtype=np.int64)
    n = X.shape[0]
    for k in reversed(range(_levels(n))):
        src = np.arange(0, n - (1 << k), 1 << (k + 1))
        dst = src + (1 << k)
        mask = _subtree_mask(dst, k, n)
        for i in range(len(src)):
            X[dst[i], mask[i]] = X[src[i], mask[i]]
        yield Messages("scatter", src, dst, mask, (mask * chunk_bytes).sum(1), False, exclusive=True)


def tree_gather(X, chunk_bytes):
    """Rank c holds chunk c; collect every chunk on rank 0 up a binomial tree."""
    chunk_bytes = np.asarray(chunk_bytes, dtype=np.int64)
    n = X.shape[0]
    for k in range(_levels(n)):
        src = np.arange(1 << k, n, 1 << (k + 1))
        dst = src - (1 << k)
        mask = _subtree_mask(src, k, n)
        for i in range(len(src)):
            X[dst[i], mask[i]] = X[src[i], mask[i]]
        yield Messages("gather", src, dst, mask, (mask * chunk_bytes).sum(1), False, exclusive=True)


def naive_reduce(X, op, chunk_bytes):
    chunk_bytes = np.asarray(chunk_bytes, dtype=np.int64)
    n = X.shape[0]
    if n > 1:
        X[0] = UFUNC[op].reduce(X, axis=0)
        src = np.arange(1, n)
        yield Messages("reduce", src, np.zeros(n - 1, int), _whole(n - 1, n), np.full(n - 1, chunk_bytes.sum()), True)


def naive_gather(X, chunk_bytes):
    chunk_bytes = np.asarray(chunk_bytes, dtype=np.int64)
    n = X.shape[0]
    if n > 1:
        src = np.arange(1, n)
        X[0, src] = X[src, src]
        yield Messages("gather", src, np.zeros(n - 1, int), src, chunk_bytes[src], False)


def naive_broadcast(X, chunk_bytes, root=0):
    chunk_bytes = np.asarray(chunk_bytes, dtype=np.int64)
    n = X.shape[0]
    if n > 1:
        dst = np.array([r for r in range(n) if r != root])
        X[dst] = X[root]
        yield Messages("broadcast", np.full(n - 1, root), dst, _whole(n - 1, n), np.full(n - 1, chunk_bytes.sum()), False)


def naive_scatter(X, chunk_bytes):
    chunk_bytes = np.asarray(chunk_bytes, dtype=np.int64)
    n = X.shape[0]
    if n > 1:
        dst = np.arange(1, n)
        X[dst, dst] = X[0, dst]
        yield Messages("scatter", np.zeros(n - 1, int), dst, dst, chunk_bytes[dst], False)
