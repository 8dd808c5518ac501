"""All-to-all: every rank sends a (possibly different) piece to every other rank.

Two schedules of the same exchange, side by side:

* ``all_to_all_grouped`` -- what NCCL runs, and what the engine charges. NCCL's all-to-all
  is one ``ncclSend`` and one ``ncclRecv`` per peer inside one group (nccl-tests
  ``src/alltoall.cu``, ``AlltoAllRunColl``; NCCL 2.28's ``ncclAlltoAll`` appends the same
  send/recv pair per rank in ``src/enqueue.cc``, ``taskAppend``). The group is scheduled
  into one kernel plan whose channels run up to 8 peers each at once
  (``scheduleP2pTasksToPlan``, ``NCCL_MAX_DEV_WORK_P2P_PER_BATCH``), so every message is
  in flight together: one step, in which each port carries all of its messages' bytes
  (``alpha + bytes through the port / beta``, :mod:`emulator.machine.links`), and the
  busiest port (a NIC, once the group spans nodes) sets the time.
* ``all_to_all_pairwise`` -- the textbook lock-step exchange: in step s (1..n-1) rank r
  sends its piece for rank r+s and receives from rank r-s; n-1 steps, each as slow as its
  slowest pair. Kept for comparison: it charges n-1 latencies and lets a NIC idle while
  an intra-node pair finishes.

Two forms, as torch has them: ``all_to_all(chunks)`` (a list of arrays per rank) and
``all_to_all_single(x, output_split_sizes, input_split_sizes)`` (one array per rank,
split along dim 0, sizes possibly uneven: the token dispatch of expert parallelism).
"""

import numpy as np

from ..errors import CollectiveMismatchError, ShapeError
from .steps import Messages


def reference_all_to_all(chunks):
    return [[chunks[i][r] for i in range(len(chunks))] for r in range(len(chunks))]


def _copy(a):
    return a.copy() if hasattr(a, "copy") and hasattr(a, "nbytes") else np.array(a, copy=True)


def _received(chunks):
    n = len(chunks)
    for r, row in enumerate(chunks):
        if len(row) != n:
            raise ShapeError(f"all_to_all: rank {r} passed {len(row)} arrays; pass one per rank ({n})")
    received = [[_copy(chunks[i][r]) for i in range(n)] for r in range(n)]
    sizes = np.array([[chunks[i][j].nbytes for j in range(n)] for i in range(n)], dtype=np.int64)
    return received, sizes


def all_to_all_grouped(chunks):
    """``chunks[r][i]`` is what rank r sends to rank i; returns (received, messages) with
    ``received[r][i]`` what rank r got from rank i, and one step holding every message
    (every send and receive posted at once, as NCCL groups them)."""
    received, sizes = _received(chunks)
    n = len(chunks)
    if n < 2:
        return received, []
    src, dst = np.nonzero(~np.eye(n, dtype=bool))
    return received, [Messages("all-to-all", src, dst, dst, sizes[src, dst], False)]


def all_to_all_pairwise(chunks):
    """As :func:`all_to_all_grouped`, in n-1 lock-step pairwise steps."""
    received, sizes = _received(chunks)
    n = len(chunks)
    steps = []
    for s in range(1, n):
        src = np.arange(n)
        dst = (src + s) % n
        steps.append(Messages("all-to-all", src, dst, dst, sizes[src, dst], False, exclusive=True))
    return received, steps


def split_sizes(x, size, sizes, what, rank):
    """Validate ``sizes`` (None: equal) for an array ``x`` split along dim 0 over ``size``
    ranks; returns the list of sizes."""
    rows = x.shape[0] if x.ndim else 0
    if x.ndim == 0:
        raise ShapeError(f"rank {rank}: all_to_all_single needs an array with a dim 0, got a 0-d array")
    if sizes is None:
        if rows % size:
            raise ShapeError(f"rank {rank}: all_to_all_single without {what} splits dim 0 ({rows}) into "
                             f"{size} equal parts; it does not divide: pass {what} (one size per rank)")
        return [rows // size] * size
    sizes = [int(s) for s in sizes]
    if len(sizes) != size or any(s < 0 for s in sizes):
        raise ShapeError(f"rank {rank}: {what} needs {size} non-negative sizes (one per rank), got {sizes}")
    if what == "input_split_sizes" and sum(sizes) != rows:
        raise ShapeError(f"rank {rank}: input_split_sizes {sizes} add up to {sum(sizes)}, but dim 0 of the "
                         f"input is {rows}")
    return sizes


def all_to_all_single(inputs, ranks, label):
    """Global view of ``all_to_all_single``: ``inputs[r] = (x, output_split_sizes or None,
    input_split_sizes)`` per group-local rank r. Returns (results, messages). A rank's
    expected output sizes must match what the others send it."""
    n = len(inputs)
    chunks = []
    for r, (x, _, in_sizes) in enumerate(inputs):
        bounds = np.cumsum([0] + in_sizes)
        chunks.append([x[bounds[i]:bounds[i + 1]] for i in range(n)])
    for r, (_, out_sizes, _) in enumerate(inputs):
        if out_sizes is None:
            continue
        for i in range(n):
            sent = chunks[i][r].shape[0]
            if out_sizes[i] != sent:
                raise CollectiveMismatchError(
                    f"all_to_all_single on group {label}: rank {ranks[r]} expects {out_sizes[i]} rows from rank "
                    f"{ranks[i]} (its output_split_sizes[{i}]), but rank {ranks[i]} sends {sent} (its "
                    f"input_split_sizes[{r}]); exchange the counts first (an all_to_all of the sizes)")
    received, steps = all_to_all_grouped(chunks)
    return [np.concatenate(row, axis=0) for row in received], steps
