"""One rank's view of the machine: ``Comm`` (collectives, point to point, groups, compute,
memory) and the handles that ``async_op=True`` returns.

A collective call joins its group's next rendezvous; the last member to arrive runs the
collective once in the global view (:mod:`emulator.collectives`), charges it on the
simulated clock, records its messages and wakes the others. See :mod:`emulator.world`
for the scheduler.
"""

import numpy as np

from . import collectives as C
from .errors import ArgumentError, CollectiveMismatchError, GroupError, PeerError, ShapeError
from .trace import Batch


class _Rendezvous:
    """One collective call of a group, filled in as members arrive."""

    __slots__ = ("op", "sig", "first", "inputs", "ready", "done", "results", "end", "ranks", "label", "seq")

    def __init__(self, op, sig, first, ranks, label, seq):
        self.op, self.sig, self.first, self.ranks, self.label, self.seq = op, sig, first, ranks, label, seq
        self.inputs, self.ready = {}, {}
        self.done, self.results, self.end = False, None, 0.0

    def result(self, rank):
        return self.results[self.ranks.index(rank)]

    def describe(self):
        missing = [r for r in self.ranks if r not in self.ready]
        return (f"waits in {self.op} #{self.seq} on group {self.label} (ranks {list(self.ranks)}); "
                f"arrived: {sorted(self.ready)}, missing: {missing}")


class _Recv:
    """The k-th message from ``src`` to ``dst``."""

    __slots__ = ("world", "src", "dst", "k", "box", "end", "op")

    def __init__(self, world, src, dst, k):
        self.world, self.src, self.dst, self.k = world, src, dst, k
        self.box = world._mail.setdefault((src, dst), [])
        self.end, self.op = 0.0, f"recv<-{src}"

    @property
    def done(self):
        return len(self.box) > self.k

    def result(self, rank):
        data, self.end = self.box[self.k]
        self.box[self.k] = (None, self.end)  # free the buffer once received
        return data

    def describe(self):
        state = "has returned" if self.world._finished[self.src] else "has not sent it yet"
        return f"waits in recv(src={self.src}) for message #{self.k} from rank {self.src}, which {state}"


class Handle:
    """What ``async_op=True`` returns. ``wait()`` blocks this rank until the operation is
    done, moves its compute clock to the operation's end, and returns the result."""

    def __init__(self, world, rank, work):
        self._world, self._rank, self._work = world, rank, work
        self._result, self._waited = None, False

    def is_completed(self):
        return self._work.done

    def wait(self):
        w, r, work = self._world, self._rank, self._work
        if not self._waited:
            while not work.done:
                w._block(r, work.describe)
            self._result = work.result(r)
            self._waited = True
        c = w._clock[r]
        if work.end > c:
            w._event(r, "compute", "idle", f"wait {work.op}", c, work.end)
            w._clock[r] = work.end
        return self._result


class _Sent:
    """A send: done at once (buffered); ``end`` is when the data has left."""

    __slots__ = ("end", "op")
    done = True

    def __init__(self, end, op):
        self.end, self.op = end, op

    def result(self, rank):
        return None

    def describe(self):
        return "is sending"


def _signature(name, x, **extra):
    a = x if isinstance(x, np.ndarray) else np.asarray(x)
    return (name, a.shape, a.dtype, tuple(extra.items()))


def _format_signature(sig):
    if isinstance(sig, str):
        return sig
    name, shape, dtype, extra = sig
    parts = [f"shape={shape}", f"dtype={dtype}"] + [f"{k}={v!r}" for k, v in extra]
    return f"{name}({', '.join(parts)})"


class Comm:
    """One rank's handle on a group of ranks (the whole world, or a mesh axis).

    ``rank`` and ``size`` are within the group; ``global_rank`` is the rank in the world.
    Collectives return new arrays and never modify their input.
    """

    def __init__(self, world, global_rank, ranks, label):
        self._world = world
        self.global_rank = global_rank
        self.ranks = ranks
        self.label = label
        self.member = global_rank in ranks
        self.rank = ranks.index(global_rank) if self.member else -1
        self.size = len(ranks)

    def __repr__(self):
        return f"Comm(group={self.label!r}, rank={self.rank}, size={self.size}, global_rank={self.global_rank})"

    # ----------------------------------------------------------------- mesh and groups
    @property
    def memory(self):
        """This rank's :class:`~emulator.memory.MemoryLedger`."""
        return self._world.memory[self.global_rank]

    @property
    def now(self):
        """This rank's simulated clock (seconds)."""
        return self._world._clock[self.global_rank]

    def _axes(self, axes):
        mesh = self._world.mesh
        if not mesh:
            raise GroupError(f"rank {self.global_rank}: this World has no mesh axes; "
                             f"create it as World(mesh={{'dp': 2, 'tp': 4}}) to use groups")
        for a in axes:
            if a not in mesh:
                raise GroupError(f"rank {self.global_rank}: no mesh axis {a!r}; axes are {list(mesh)}")
        return mesh

    def coord(self, axis):
        """This rank's index along mesh axis ``axis``."""
        mesh = self._axes([axis])
        coords = np.unravel_index(self.global_rank, tuple(mesh.values()))
        return int(coords[list(mesh).index(axis)])

    def coords(self):
        mesh = self._axes([])
        return dict(zip(mesh, map(int, np.unravel_index(self.global_rank, tuple(mesh.values())))))

    def group(self, *axes):
        """A comm over the ranks that differ from this one only along ``axes``."""
        if not axes:
            raise GroupError(f"rank {self.global_rank}: group() needs at least one axis name")
        mesh = self._axes(axes)
        sizes = tuple(mesh.values())
        mine = np.unravel_index(self.global_rank, sizes)
        grid = np.arange(self._world.size).reshape(sizes)
        index = tuple(slice(None) if a in axes else mine[i] for i, a in enumerate(mesh))
        ranks = tuple(int(r) for r in np.sort(grid[index].reshape(-1)))
        return Comm(self._world, self.global_rank, ranks, ",".join(axes))

    def new_group(self, ranks):
        """A comm over the given global ranks (like ``torch.distributed.new_group``)."""
        ranks = tuple(int(r) for r in ranks)
        bad = [r for r in ranks if not 0 <= r < self._world.size]
        if bad or len(set(ranks)) != len(ranks) or not ranks:
            raise GroupError(f"rank {self.global_rank}: new_group({list(ranks)}) needs distinct ranks "
                             f"in 0..{self._world.size - 1}")
        return Comm(self._world, self.global_rank, ranks, str(list(ranks)))

    # ----------------------------------------------------------------- compute
    def compute(self, flops=None, seconds=None, name="compute"):
        """Advance this rank's compute clock by ``flops / peak`` or by ``seconds``."""
        if (flops is None) == (seconds is None):
            raise ArgumentError(f"rank {self.global_rank}: compute() takes flops= or seconds=, exactly one")
        dur = seconds if seconds is not None else flops / self._world.topology.flops
        if not dur >= 0:
            raise ArgumentError(f"rank {self.global_rank}: compute() got a negative duration ({dur})")
        w, r = self._world, self.global_rank
        w._event(r, "compute", "compute", name, w._clock[r], w._clock[r] + dur)
        w._clock[r] += dur

    # ----------------------------------------------------------------- collectives
    def _check_member(self, op):
        if not self.member:
            raise GroupError(f"rank {self.global_rank} called {op} on group {self.label} "
                             f"(ranks {list(self.ranks)}), which it is not in")

    def _collective(self, op, sig, payload, run, async_op):
        """Join the group's next collective; the last member to arrive runs it."""
        self._check_member(op)
        w, me, key = self._world, self.global_rank, self.ranks
        seq = w._seq.get((key, me), 0)
        w._seq[(key, me)] = seq + 1
        rv = w._pending.get((key, seq))
        if rv is None:
            rv = w._pending[(key, seq)] = _Rendezvous(op, sig, me, key, self.label, seq)
        elif rv.sig != sig:
            raise CollectiveMismatchError(
                f"ranks {rv.first} and {me} of group {self.label} (ranks {list(key)}) disagree at "
                f"their collective #{seq} on that group:\n  rank {rv.first} called {_format_signature(rv.sig)}\n"
                f"  rank {me} called {_format_signature(sig)}\n"
                f"every rank of a group must make the same calls in the same order"
            )
        rv.inputs[self.rank] = payload
        rv.ready[me] = w._clock[me]
        if len(rv.inputs) == self.size:
            del w._pending[(key, seq)]
            self._complete(rv, run)
        handle = Handle(w, me, rv)
        return handle if async_op else handle.wait()

    def _complete(self, rv, run):
        w = self._world
        results, steps = run([rv.inputs[i] for i in range(self.size)])
        t0 = max(max(rv.ready[r], w._comm_free[r]) for r in self.ranks)
        t1, batch = w._charge(steps, self.ranks, t0)
        if batch is not None:
            w._batches.append(Batch(rv.op, self.label, *batch))
        for r in self.ranks:
            w._event(r, "comm", "comm", rv.op, t0, t1)
            w._comm_free[r] = t1
        rv.results, rv.end, rv.done, rv.inputs = results, t1, True, None
        for r in self.ranks:
            if r != self.global_rank:
                w._wake(r)

    def _algorithm(self, algorithm):
        algorithm = algorithm or self._world.algorithm
        C.check_algorithm(algorithm, who=f"rank {self.global_rank}: ")
        return algorithm

    def _check_op(self, op, x):
        C.check_op(op, x.dtype if isinstance(x, np.ndarray) else np.asarray(x).dtype, who=f"rank {self.global_rank}: ")

    def all_reduce(self, x, op="sum", async_op=False, algorithm=None):
        """Every rank gets op(x of every rank), elementwise; same shape as x."""
        self._check_op(op, x)
        alg = self._algorithm(algorithm)
        sig = _signature("all_reduce", x, op=op, algorithm=alg)
        return self._collective("all_reduce", sig, x,
                                lambda b: C.run_plan(C.plan_all_reduce(b, op, alg)), async_op)

    def reduce_scatter(self, x, op="sum", async_op=False, algorithm=None):
        """x is split along axis 0 into ``size`` equal chunks; rank r gets op over ranks of chunk r."""
        self._check_op(op, x)
        alg = self._algorithm(algorithm)
        a = np.asarray(x)
        if a.ndim == 0 or a.shape[0] % self.size:
            raise ShapeError(
                f"rank {self.global_rank}: reduce_scatter on group {self.label} needs axis 0 divisible "
                f"by the group size {self.size}, got shape {a.shape}; pad axis 0 to a multiple of {self.size}"
            )
        sig = _signature("reduce_scatter", x, op=op, algorithm=alg)
        return self._collective("reduce_scatter", sig, x,
                                lambda b: C.run_plan(C.plan_reduce_scatter(b, op, alg)), async_op)

    def all_gather(self, x, async_op=False, algorithm=None):
        """Every rank gets the concatenation along axis 0 of x from every rank, in rank order."""
        alg = self._algorithm(algorithm)
        if np.asarray(x).ndim == 0:
            raise ShapeError(f"rank {self.global_rank}: all_gather needs at least one dim, got a 0-d array")
        sig = _signature("all_gather", x, algorithm=alg)
        return self._collective("all_gather", sig, x, lambda b: C.run_plan(C.plan_all_gather(b, alg)), async_op)

    def broadcast(self, x, src=0, async_op=False, algorithm="tree"):
        """Every rank gets a copy of rank ``src``'s x (every rank passes an x of that shape)."""
        if not (isinstance(src, (int, np.integer)) and 0 <= src < self.size):
            raise PeerError(f"rank {self.global_rank}: broadcast src={src!r} is not a rank of group "
                            f"{self.label} (0..{self.size - 1})")
        if algorithm not in ("tree", "naive"):
            raise ArgumentError(f"rank {self.global_rank}: broadcast algorithm must be 'tree' or 'naive'")
        sig = _signature("broadcast", x, src=int(src), algorithm=algorithm)
        return self._collective("broadcast", sig, x,
                                lambda b: C.run_plan(C.plan_broadcast(b, int(src), algorithm)), async_op)

    def all_to_all(self, chunks, async_op=False):
        """``chunks[i]`` goes to rank i; returns the list received, entry i from rank i."""
        if len(chunks) != self.size:
            raise ShapeError(f"rank {self.global_rank}: all_to_all got {len(chunks)} chunks; "
                             f"pass exactly one per rank of group {self.label} ({self.size})")
        dtypes = {np.asarray(c).dtype for c in chunks}
        if len(dtypes) > 1:
            raise ShapeError(f"rank {self.global_rank}: all_to_all chunks mix dtypes {sorted(map(str, dtypes))}")
        sig = f"all_to_all(n_chunks={len(chunks)}, dtype={dtypes.pop()})"
        return self._collective("all_to_all", sig, list(chunks), C.all_to_all_pairwise, async_op)

    def barrier(self, async_op=False):
        """Wait until every rank of the group arrives (a zero-byte tree all-reduce)."""
        empty = np.zeros(0, dtype=np.int8)
        out = self._collective("barrier", "barrier()", empty,
                               lambda b: C.run_plan(C.plan_all_reduce(b, "sum", "tree")), async_op)
        return out if async_op else None

    # ----------------------------------------------------------------- point to point
    def _peer(self, peer, what):
        self._check_member(what)
        if not isinstance(peer, (int, np.integer)) or not 0 <= peer < self.size:
            raise PeerError(f"rank {self.global_rank}: {what} peer {peer!r} is out of range for group "
                            f"{self.label} of size {self.size} (valid: 0..{self.size - 1})")
        if peer == self.rank:
            raise PeerError(f"rank {self.global_rank}: {what} to itself (peer {peer} of group {self.label}); "
                            f"a rank keeps its own data without a message")
        return self.ranks[peer]

    def send(self, x, dst, async_op=False):
        """Send a copy of x to ``dst`` (buffered: returns without waiting for the recv).
        Synchronous, the rank's clock waits until the data has left; with ``async_op``
        the transfer runs on the communication stream."""
        g_dst = self._peer(dst, "send")
        w, me = self._world, self.global_rank
        data = np.array(x, copy=True)
        start = max(w._clock[me], w._comm_free[me])
        end = start + w.topology.link(me, g_dst).time(data.nbytes)
        w._comm_free[me] = end
        w._batches.append(Batch("send", self.label, np.zeros(1, int), np.array([me]), np.array([g_dst]),
                                np.array([data.nbytes]), np.array([start]), np.array([end])))
        w._event(me, "comm", "comm", f"send->{g_dst}", start, end)
        w._mail.setdefault((me, g_dst), []).append((data, end))
        w._wake(g_dst)
        handle = Handle(w, me, _Sent(end, f"send->{g_dst}"))
        return handle if async_op else handle.wait()

    def recv(self, src, async_op=False):
        """Receive the next array that ``src`` sent to this rank (FIFO per pair)."""
        g_src = self._peer(src, "recv")
        w, me = self._world, self.global_rank
        k = w._taken.get((g_src, me), 0)
        w._taken[(g_src, me)] = k + 1
        handle = Handle(w, me, _Recv(w, g_src, me, k))
        return handle if async_op else handle.wait()
