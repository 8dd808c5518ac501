"""One rank's view of the machine: its groups (the world, mesh axes, ad-hoc groups), and the
rendezvous every collective joins.

A collective call joins its group's next rendezvous; the last member to arrive runs the
collective once in the global view (:mod:`emulator.algorithms.step_plans`), charges it on the simulated
clock (:mod:`emulator.engine.clock`), records its messages and wakes the others. The calls
themselves, as torch names them, are in :mod:`emulator.engine.collectives`; compute and
declared work in :mod:`emulator.engine.rank_compute`; point to point in
:mod:`emulator.engine.p2p`. See :mod:`emulator.engine.world` for the scheduler.
"""

from ..errors import CollectiveMismatchError, GroupError
from ..records.calls import Call
from .clock import collective_stream
from .collectives import Collectives, format_signature
from .p2p import PointToPoint
from .rank_compute import RankCompute
from .rendezvous import Handle, Rendezvous


class Comm(Collectives, RankCompute, PointToPoint):
    """One rank's handle on a group of ranks (the whole world, or mesh axes).

    ``rank`` and ``size`` are within the group; ``global_rank`` is the rank in the world;
    ``label`` names the group (``"world"``, a mesh axis such as ``"tp"``, or the ranks of
    an ad-hoc group). Collectives return new arrays and never modify their input.
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
        """This rank's :class:`~emulator.records.memory.MemoryLedger`."""
        return self._world.memory[self.global_rank]

    @property
    def now(self):
        """This rank's simulated clock (seconds)."""
        return self._world.clock.compute[self.global_rank]

    @property
    def mesh(self):
        """The world's :class:`~emulator.mesh.Mesh` (None for a plain ``World(n)``)."""
        return self._world.mesh

    def _mesh(self):
        if self._world.mesh is None:
            raise GroupError(f"rank {self.global_rank}: this World has no mesh axes; "
                             f"create it as World(mesh={{'dp': 2, 'tp': 4}}) to use groups")
        return self._world.mesh

    def coord(self, axis):
        """This rank's index along mesh axis ``axis``."""
        return self._mesh().coord(self.global_rank, axis)

    def coords(self):
        return self._mesh().coords(self.global_rank)

    def group(self, *axes):
        """A comm over the ranks that differ from this one only along ``axes``."""
        if not axes:
            raise GroupError(f"rank {self.global_rank}: group() needs at least one axis name")
        try:
            ranks = self._mesh().group_ranks(axes, self.global_rank)
        except GroupError as exc:
            raise GroupError(f"rank {self.global_rank}: {exc}") from None
        return Comm(self._world, self.global_rank, ranks, ",".join(axes))

    def new_group(self, ranks, label=None):
        """A comm over the given global ranks (like ``torch.distributed.new_group``);
        ``label`` names it in the trace (default: its ranks)."""
        ranks = tuple(int(r) for r in ranks)
        bad = [r for r in ranks if not 0 <= r < self._world.size]
        if bad or len(set(ranks)) != len(ranks) or not ranks:
            raise GroupError(f"rank {self.global_rank}: new_group({list(ranks)}) needs distinct ranks "
                             f"in 0..{self._world.size - 1}")
        return Comm(self._world, self.global_rank, ranks, label or str(sorted(ranks)))

    # ----------------------------------------------------------------- the rendezvous of a collective
    def _check_member(self, op):
        if not self.member:
            raise GroupError(f"rank {self.global_rank} called {op} on group {self.label} "
                             f"(ranks {list(self.ranks)}), which it is not in")

    def _collective(self, op, sig, payload, nbytes, run, async_op):
        """Join the group's next collective; the last member to arrive runs it."""
        if not self.member:
            self._check_member(op)
        w, me, key = self._world, self.global_rank, self.ranks
        w.clock.check_alive(me)
        w.calls[me].append(Call(op, self.label, nbytes))
        seq = w._seq.get((key, me), 0)
        w._seq[(key, me)] = seq + 1
        rv = w._pending.get((key, seq))
        if rv is None:
            rv = w._pending[(key, seq)] = Rendezvous(op, sig, me, key, self.label, seq)
        elif rv.sig != sig:
            raise CollectiveMismatchError(
                f"ranks {rv.first} and {me} of group {self.label} (ranks {list(key)}) disagree at "
                f"their collective #{seq} on that group:\n  rank {rv.first} called {format_signature(rv.sig)}\n"
                f"  rank {me} called {format_signature(sig)}\n"
                f"every rank of a group must make the same calls in the same order")
        rv.inputs[self.rank] = payload
        rv.ready[me] = w.clock.compute[me]
        if w._charges[me]:  # inside a declared pass the host issues it: not before the host gets there
            rv.ready[me] = max(rv.ready[me], w.clock.issue(me, w.stack.dispatch))
            early = w._charges[me][-1].ready_at
            if early is not None:  # pipelined behind a GEMM still running (comm_overlap): from its first chunk
                rv.ready[me], w._charges[me][-1].ready_at = early, None
        if len(rv.inputs) == self._live_count():
            del w._pending[(key, seq)]
            if len(rv.inputs) < self.size:  # the others are folded into this rank: as they would arrive
                w._deferred[me].append((self, rv, run))
            else:
                self._complete(rv, run)
        handle = Handle(w, me, rv)
        return handle if async_op else handle.wait()

    def _live_count(self):
        w = self._world
        if w.representative is None:
            return self.size
        n = w._live_counts.get(self.ranks)
        if n is None:
            n = w._live_counts[self.ranks] = len(w.live_members(self.ranks))
        return n

    def _complete(self, rv, run):
        w = self._world
        inputs = rv.inputs
        if len(inputs) < self.size:  # folded members: each as the live rank that stands for it
            inputs = {i: inputs[i] if i in inputs else inputs[w.stand_in(self.ranks, i)] for i in range(self.size)}
        results, steps = run([inputs[i] for i in range(self.size)])
        stream = collective_stream(self.label)
        t0 = max(max(rv.ready[r], w.clock.free(r, stream)) for r in rv.ready)
        if w.faults.interrupted(w.clock, self.ranks, steps, t0):  # a member dies before it ends: never completes
            rv.inputs = None
            w._broken.append(rv)
            return
        rv.start, rv.end = w.clock.charge(rv.op, self.label, steps, self.ranks, t0, [stream] * self.size,
                                          [rv.op] * self.size)
        rv.results, rv.done, rv.inputs = results, True, None
        for r in rv.ready:
            if r != self.global_rank:
                w._wake(r)
