"""Ring attention: each rank keeps its queries and passes its keys and values around.

With the sequence split over ``c`` ranks, rank ``i`` starts with its own K/V block; at step
``t`` it holds the block of rank ``(i - t) mod c``, computes its queries against it (the
online softmax of :mod:`.online_softmax` folds each block in), and meanwhile sends that
block on to rank ``i + 1`` and receives the next from rank ``i - 1``: the transfer runs
while it computes. After ``c - 1`` transfers every rank has seen every block.

Under a causal mask, a query sees only keys at or before it. Blocks whose keys all come
after all the queries are skipped, and the rest are masked by position
(:mod:`.layout`): with the contiguous layout rank ``c - 1`` computes ``c`` blocks and rank
0 one; with the zigzag layout every rank computes the same ``2c + 1`` of its ``4c``
quarter-blocks (half of its queries against half of a block's keys).

Backward: each rank keeps its dQ; dK and dV travel with their K/V block, collecting every
rank's contribution, and after ``c`` transfers arrive home.

Memory: a rank holds two K/V blocks while the ring turns, the one it computes with and the
one arriving (and, in backward, the dK/dV partial sums with theirs); both are in its
ledger as ``buffers``, so the ledger shows what the ring costs beside the all-gather.
"""

import math
from functools import lru_cache

import numpy as np

from ...errors import ConfigError
from ...algorithms.p2p_op import P2POp
from .layout import chunks_of
from ...machine.work import Attention
from .online_softmax import OnlineSoftmax


def blocks(rank, src, size, n_local, causal, layout, masks=True):
    """The score blocks rank ``rank`` computes against the K/V of rank ``src``: a list of
    (query rows, key rows, mask or None) with rows as slices of the local shards
    (``masks=False``: None for every mask, for a caller that needs only the blocks' shapes)."""
    out = []
    q_pieces, k_pieces = chunks_of(rank, size, n_local, layout), chunks_of(src, size, n_local, layout)
    q_off = 0
    for qs, qn in q_pieces:
        k_off = 0
        for ks, kn in k_pieces:
            rows, cols = slice(q_off, q_off + qn), slice(k_off, k_off + kn)
            if not causal or ks + kn - 1 <= qs:
                out.append((rows, cols, None))  # every key at or before every query
            elif ks <= qs + qn - 1:
                out.append((rows, cols, (np.arange(ks, ks + kn)[None, :] <= np.arange(qs, qs + qn)[:, None])
                            if masks else None))
            k_off += kn
        q_off += qn
    return out


@lru_cache(maxsize=4096)
def step_blocks(rank, size, n_local, causal, layout):
    """Per ring step t (K/V of rank ``(rank - t) % size``), the (query rows, key rows) of each
    block :func:`blocks` computes on ``rank``: what ring attention's declared work holds."""
    if not 0 <= rank < size:
        raise ConfigError(f"ring attention over {size} ranks has no rank {rank}: pass a rank in 0..{size - 1}")
    return tuple(tuple((r.stop - r.start, k.stop - k.start) for r, k, _ in
                       blocks(rank, (rank - t) % size, size, n_local, causal, layout, masks=False))
                 for t in range(size))


def ring_plan(size, causal=False, layout="contiguous", n_local=2):
    """For every step and rank: (the rank whose K/V it holds, the quarter-blocks it computes
    as (query piece, key piece) indices). What the widget draws and the ring executes."""
    plan = []
    for t in range(size):
        row = []
        for r in range(size):
            src = (r - t) % size
            half = n_local // (1 if layout == "contiguous" else 2)
            row.append((src, [(b[0].start // half, b[1].start // half)
                              for b in blocks(r, src, size, n_local, causal, layout)]))
        plan.append(row)
    return plan


def _array(a):
    return a if hasattr(a, "shape") and hasattr(a, "dtype") else np.asarray(a)


def _check(comm, q, k, v, layout):
    q, k, v = (_array(a) for a in (q, k, v))
    grouped = q.ndim >= 3 and k.ndim == q.ndim and q.shape[-3] != k.shape[-3] and \
        q.shape[-3] % k.shape[-3] == 0 and q.shape[:-3] + q.shape[-2:] == k.shape[:-3] + k.shape[-2:]
    if q.ndim < 2 or (q.shape != k.shape and not grouped) or k.shape != v.shape:
        raise ConfigError(f"rank {comm.global_rank}: ring attention needs q, k, v of one shape (..., s_local, "
                          f"d_head), or k and v with fewer heads that divide q's (grouped-query attention); got "
                          f"{q.shape}, {k.shape}, {v.shape}")
    if layout == "zigzag" and q.shape[-2] % 2:
        raise ConfigError(f"rank {comm.global_rank}: a zigzag shard holds two halves; {q.shape[-2]} local "
                          f"positions do not split in two (the sequence must divide by 2 x {comm.size})")
    chunks_of(comm.rank, comm.size, q.shape[-2], layout)  # checks the layout's name
    return q, k, v


def _kernel(comm, q, n_rows, n_keys, passes):
    """One block's fused attention kernel, the one the run's stack runs: every head's
    (n_rows x n_keys) scores."""
    return Attention("attention: ring block", int(np.prod(q.shape[:-2])), 1, n_rows, n_keys, q.shape[-1], passes,
                     1.0, "bf16", comm.stack.flash_kernel)


def _grouped(q, k, v):
    """Grouped-query attention without copying K/V: q as (..., kv_heads, group, s, d), k and
    v as (..., kv_heads, 1, s, d), so each K/V head broadcasts over its query heads."""
    if q.shape == k.shape:
        return q, k, v, None
    g = q.shape[-3] // k.shape[-3]
    lead = q.shape[:-3]
    return (q.reshape(lead + (k.shape[-3], g) + q.shape[-2:]), k[..., None, :, :], v[..., None, :, :], q.shape)


def _over_group(x, like):
    """Sum a gradient over the query heads that share a K/V head (``like`` has 1 there)."""
    return x.sum(-3, keepdims=True) if x.ndim == like.ndim and like.shape[-3] == 1 != x.shape[-3] else x


def _shift(comm, x, what):
    """Post: send ``x`` to the next rank, receive the previous rank's into a new buffer,
    held in the ledger as ``what`` arriving, in one batch; returns (its works, the buffer)."""
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    buffer = comm.memory.hold(f"{what} arriving", np.empty_like(x), "buffers")
    return comm.batch_isend_irecv([P2POp(comm.isend, x, right), P2POp(comm.irecv, buffer, left)]), buffer


def _arrived(comm, shift, what):
    """Wait for a shift (its one handle, as on NCCL); the arrived block, in the buffer,
    replaces the held one in the ledger."""
    works, buffer = shift
    for work in works:
        work.wait()
    comm.memory.release(f"{what} arriving")
    comm.memory.release(what)
    return comm.memory.hold(what, buffer, "buffers")


def _step_charge(comm, declared, t, kernels, name):
    """Charge one ring step's attention: the declared kernels of the step (a block's pass,
    :mod:`emulator.engine.charging`), or the blocks as computed."""
    if declared:
        comm.charge(f"attention: ring step {t}", optional=not kernels)
    else:
        comm.compute(kernels=kernels, name=name)


def ring_attention(comm, q, k, v, causal=False, layout="contiguous", accumulate=None, payload=None, declared=False):
    """Softmax attention (scale 1/sqrt(d_head)) for this rank's shard of the sequence, K/V
    passed around the ring. Returns ``(out, cache)``; ``out`` has this rank's rows.
    ``accumulate``: the dtype of the running max, sum and output (default: float32, or the
    inputs' dtype if wider). ``payload``: the dtype K/V travel in (the precision policy's
    ``cp``; None: as they are); ``declared``: charge the steps from the open declared pass."""
    q, k, v = _check(comm, q, k, v, layout)
    cache_qkv = {"q": q, "k": k, "v": v}
    q, k, v, q_shape = _grouped(q, k, v)
    accumulate = np.promote_types(q.dtype, np.float32) if accumulate is None else accumulate
    c, n, d = comm.size, q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    state = OnlineSoftmax(q.shape[:-1], d, accumulate, like=q)
    kv = np.stack([k, v])
    kv = comm.memory.hold("K/V block", kv if payload is None else kv.astype(payload), "buffers")
    for t in range(c):
        src = (comm.rank - t) % c
        handles = _shift(comm, kv, "K/V block") if t < c - 1 else None  # the next block travels meanwhile
        kernels = []
        for rows, cols, mask in blocks(comm.rank, src, c, n, causal, layout):
            kb, vb = (a.astype(q.dtype, copy=False) for a in (kv[0][..., cols, :], kv[1][..., cols, :]))
            s = q[..., rows, :] @ kb.swapaxes(-1, -2) * scale
            if mask is not None:
                s = np.where(mask, s, -np.inf)
            state.update(s, vb, rows)
            kernels.append(_kernel(comm, q, rows.stop - rows.start, cols.stop - cols.start, 2))
        _step_charge(comm, declared, t, kernels, f"attention, K/V of rank {src}")
        if handles:
            kv = _arrived(comm, handles, "K/V block")
    comm.memory.release("K/V block")
    out, lse = state.finish(q.dtype)
    if q_shape is not None:
        out, lse = out.reshape(q_shape), lse.reshape(q_shape[:-1])
    return out, dict(cache_qkv, out=out, lse=lse, causal=causal, layout=layout, payload=payload)


def ring_attention_backward(comm, cache, dout, declared=False):
    """(dq, dk, dv) for this rank's shards: dQ computed here, dK/dV travelling home (in the
    forward's payload dtype, as the K/V did)."""
    out, lse, causal, layout = cache["out"], cache["lse"], cache["causal"], cache["layout"]
    dout = _array(dout)
    if dout.shape != out.shape:
        raise ConfigError(f"rank {comm.global_rank}: ring_attention_backward: dout has shape {dout.shape}, the "
                          f"output {out.shape}")
    q, k, v, q_shape = _grouped(cache["q"], cache["k"], cache["v"])
    if q_shape is not None:
        out, lse, dout = out.reshape(q.shape), lse.reshape(q.shape[:-1]), dout.reshape(q.shape)
    c, n, d = comm.size, q.shape[-2], q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    delta = (dout * out).sum(-1)  # rowsum(dO * O) = rowsum(dP * P)
    dq = np.zeros_like(q)
    payload = cache.get("payload")
    kv = np.stack([k, v])
    kv = comm.memory.hold("K/V block", kv if payload is None else kv.astype(payload), "buffers")
    dkv = comm.memory.hold("dK/dV block", np.zeros_like(kv), "buffers")
    for t in range(c):
        src = (comm.rank - t) % c
        handles = _shift(comm, kv, "K/V block") if t < c - 1 else None
        kernels = []
        for rows, cols, mask in blocks(comm.rank, src, c, n, causal, layout):
            kb, vb = (a.astype(q.dtype, copy=False) for a in (kv[0][..., cols, :], kv[1][..., cols, :]))
            do = dout[..., rows, :]
            p = np.exp(q[..., rows, :] @ kb.swapaxes(-1, -2) * scale - lse[..., rows, None])
            if mask is not None:
                p = np.where(mask, p, 0.0)
            ds = p * (do @ vb.swapaxes(-1, -2) - delta[..., rows, None])
            dq[..., rows, :] += scale * ds @ kb
            dkv[0][..., cols, :] += _over_group(scale * ds.swapaxes(-1, -2) @ q[..., rows, :], kb)
            dkv[1][..., cols, :] += _over_group(p.swapaxes(-1, -2) @ do, vb)
            kernels.append(_kernel(comm, q, rows.stop - rows.start, cols.stop - cols.start, 5))  # S again, 4 products
        _step_charge(comm, declared, t, kernels, f"attention backward, K/V of rank {src}")
        if c > 1:  # dK/dV of the block go on with it; after the last step they go home
            dkv = _arrived(comm, _shift(comm, dkv, "dK/dV block"), "dK/dV block")
        if handles:
            kv = _arrived(comm, handles, "K/V block")
    comm.memory.release("K/V block")
    comm.memory.release("dK/dV block")
    dkv = dkv.astype(q.dtype, copy=False)
    if q_shape is not None:
        return dq.reshape(q_shape), dkv[0][..., 0, :, :], dkv[1][..., 0, :, :]
    return dq, dkv[0], dkv[1]
