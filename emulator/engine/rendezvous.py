"""What ranks wait on: a collective's rendezvous, and the handle an async call returns."""

from ..machine.comm_overlap import contention


class Rendezvous:
    """One collective call of a group, filled in as members arrive. The last member to
    arrive runs it; every member's handle then reads its result."""

    __slots__ = ("op", "sig", "first", "inputs", "ready", "done", "results", "start", "end", "ranks", "label", "seq")

    def __init__(self, op, sig, first, ranks, label, seq):
        self.op, self.sig, self.first, self.ranks, self.label, self.seq = op, sig, first, ranks, label, seq
        self.inputs, self.ready = {}, {}
        self.done, self.results, self.start, self.end = False, None, 0.0, 0.0

    def result(self, rank):
        return self.results[self.ranks.index(rank)]

    def describe(self):
        missing = [r for r in self.ranks if r not in self.ready]
        return (f"waits in {self.op} #{self.seq} on group {self.label} (ranks {list(self.ranks)}); "
                f"arrived: {sorted(self.ready)}, missing: {missing}")


class Handle:
    """What an async call returns (``async_op=True``, ``isend``, ``irecv``, the one entry
    of ``batch_isend_irecv``'s list). ``wait()`` blocks this rank until the operation is
    done, moves its compute clock to the operation's end (the stream joins the compute
    stream), and returns the result: the collective's output, the received array of an
    ``irecv``, None for an ``isend``, True for a batch (as torch's ``Work.wait``: the batch's
    receive buffers hold what arrived)."""

    def __init__(self, world, rank, work):
        self._world, self._rank, self._work = world, rank, work
        self._result, self._waited = None, False
        self.contended = True  # its compute beside it is slowed (an NCCL collective), unless TE runs it

    def is_completed(self):
        if not self._work.done and self._world._deferred[self._rank]:
            self._world.run_deferred(self._rank)
        return self._work.done

    def span(self):
        """Block until the operation is done, without joining it: (its start, its end) on the
        simulated clock, and its result (for work that runs beside it: Transformer Engine's
        pipelined GEMMs, :mod:`emulator.machine.comm_overlap`)."""
        w, r, work = self._world, self._rank, self._work
        while not work.done:
            w._block(r, work.describe)
        return work.start, work.end, work.result(r)

    def wait(self):
        w, r, work = self._world, self._rank, self._work
        if not self._waited:
            while not work.done:
                w._block(r, work.describe)
            self._result = work.result(r)
            self._waited = True
            start = getattr(work, "start", None) if isinstance(work, Rendezvous) else None  # (collectives only)
            if self.contended and start is not None and work.end > start:  # compute ran beside it: slower
                lost = contention(w.clock.busy_between(r, start, work.end))
                if lost > 0:
                    w.clock.advance(r, lost, f"compute slowed beside {work.op} on {work.label}")
        w.clock.join(r, work.end, work.op, getattr(work, "label", None))
        return self._result
