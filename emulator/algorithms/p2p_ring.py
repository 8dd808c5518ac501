"""The ring all-reduce as a per-rank program from point-to-point calls (lesson 00's
Exercise 0.4), as NCCL needs it written.

Each step every rank sends one chunk to its right neighbour and receives one from its
left. Written as ``send`` then ``recv``, every rank would wait in its send for a receive
nobody has posted yet (NCCL's send completes only when the matching recv is posted): the
emulator reports that deadlock. Posting both together with ``batch_isend_irecv`` lets
them progress at once. ``gpu_labs/00_collectives.py`` runs the same calls on
``torch.distributed``, and a test compares their traces.
"""

import numpy as np

from .p2p_op import P2POp


def exchange(comm, chunk, right, left):
    """Send ``chunk`` to ``right`` while receiving a chunk of the same shape from ``left``."""
    buf = np.empty_like(chunk)
    handles = comm.batch_isend_irecv([P2POp(comm.isend, chunk, right), P2POp(comm.irecv, buf, left)])
    for h in handles:
        h.wait()
    return buf


def ring_all_reduce_p2p(comm, x):
    """Sum of ``x`` (1-D, length divisible by ``comm.size``) over the group: reduce-scatter
    then all-gather, 2(n-1) steps of S/n bytes to the right neighbour."""
    n, r = comm.size, comm.rank
    chunks = np.split(np.array(x, copy=True), n)
    right, left = (r + 1) % n, (r - 1) % n
    for s in range(n - 1):  # reduce-scatter: pass chunk r-s-1, add what arrives into chunk r-s-2
        c = (r - s - 2) % n
        chunks[c] = chunks[c] + exchange(comm, chunks[(r - s - 1) % n], right, left)
    for s in range(n - 1):  # all-gather: pass the newest complete chunk
        chunks[(r - s - 1) % n] = exchange(comm, chunks[(r - s) % n], right, left)
    return np.concatenate(chunks)
