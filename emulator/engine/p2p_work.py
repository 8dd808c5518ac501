"""What a rank waits on in point to point: one posted send or receive, and a batch of them.

* :class:`Side`: one posted ``send`` or ``recv``, matched with its counterpart on the peer
  (the k-th send from a to b meets the k-th receive on b from a) into a transfer.
* :class:`Group`: one ``batch_isend_irecv``, one NCCL group. torch's NCCL path wraps the
  batch in ``_coalescing_manager`` and returns ``cm.works``, a list holding the single
  ``Work`` of the whole group (``batch_isend_irecv`` and ``_coalescing_manager`` in
  torch/distributed/distributed_c10d.py, pytorch/pytorch at 0034a6dc8d2bbcb381191315ee0ebe30e0e1c768;
  ``ProcessGroupNCCL::pointToPoint`` runs a batched op on the group's own communicator, the
  one its collectives use). So a batch is one kernel on the group's stream: it is launched
  once the batch before it on that stream has completed, its operations then progress
  together, and it completes when every one of them has. Its handle's ``wait()`` returns
  ``True`` (torch's ``Work.wait``); what was received is in the receive buffers passed in,
  filled when this rank waits for the batch or for a later one on the same stream, as a
  GPU's stream order makes them readable.
"""


class Side:
    """One posted send or recv; matched with its counterpart into a transfer.

    ``batch``: the :class:`Group` it belongs to, or None for an op issued separately;
    ``ahead``: for an op issued separately, the ops it is queued behind on its pair's NCCL
    stream (it starts once they have all completed): this rank's previous separate op with
    the same peer."""

    __slots__ = ("kind", "rank", "peer", "k", "label", "data", "buffer", "issued", "stream", "call",
                 "done", "end", "op", "world", "ahead", "behind", "counterpart", "batch")

    def __init__(self, world, kind, rank, peer, k, label, data, buffer, call, ahead=(), batch=None):
        self.world, self.kind, self.rank, self.peer, self.k, self.label = world, kind, rank, peer, k, label
        self.data, self.buffer, self.call, self.batch = data, buffer, call, batch
        self.issued = world.clock.compute[rank]
        self.stream = None
        self.done, self.end = False, 0.0
        self.op = f"send->{peer}" if kind == "send" else f"recv<-{peer}"
        self.ahead, self.behind, self.counterpart = tuple(ahead), [], None
        for side in self.ahead:
            side.behind.append(self)

    @property
    def ready(self):
        """Whether the op may progress: its batch has been launched, or (issued separately)
        what was queued ahead of it on its stream has completed."""
        if self.batch is not None:
            return self.batch.launched
        return all(side.done for side in self.ahead)

    def name(self):
        return f"{'send(dst' if self.kind == 'send' else 'recv(src'}={self.peer}) #{self.k}"

    def result(self, rank):
        if self.kind == "send":
            return None
        data, self.data = self.data, None  # hand the buffer over once
        if self.buffer is None:
            return data
        buffer, self.buffer = self.buffer, None
        buffer[...] = data
        return buffer

    def deliver(self):
        """Write what arrived into the receive buffer (once)."""
        if self.kind == "recv" and self.data is not None:
            self.buffer[...] = self.data
            self.data = self.buffer = None  # the run keeps its sides: not their arrays

    def queued(self):
        """Why this op has not started though it was posted ('' when it may start)."""
        if self.batch is not None:
            return self.batch.queued()
        blocking = next((side for side in self.ahead if not side.done), None)
        if blocking is None:
            return ""
        return (f"it was issued separately after its own {blocking.name()}, which has not completed (separately "
                f"issued isend/irecv between two ranks run one after the other, on one NCCL stream per pair)")

    def where(self):
        """Where the op was posted, for a report on the peer's side."""
        if self.batch is None:
            return f"the matching {self.name()}"
        return f"the matching {self.name()} in its batch #{self.batch.seq}"

    def why_waiting(self):
        """Why this posted op has not completed (its own queue, or its counterpart's)."""
        gone = " and has returned" if self.world._finished[self.peer] else ""
        mine = self.queued()
        if mine:
            return mine
        other = self.counterpart
        theirs = other.queued() if other is not None else ""
        if theirs:
            return f"rank {self.peer} posted {other.where()}, but {theirs}"
        if self.kind == "send":
            return f"rank {self.peer} has not posted the matching recv{gone}"
        return f"rank {self.peer} has not posted the matching send{gone}"

    def describe(self):
        where = f"waits in {self.name()} on group {self.label}"
        why = self.why_waiting()
        if self.queued():
            return f"{where}: {why}; post the sends and receives that must progress together in one batch_isend_irecv"
        return f"{where}: {why}"


class Group:
    """One ``batch_isend_irecv`` of one rank: one NCCL group on the group's stream.

    ``seq`` numbers the rank's batches on the group; ``ahead`` is the batch before it on
    the stream while that one has not completed (this one is launched when it does);
    ``earlier`` the previous batch while its buffers have not been handed over."""

    __slots__ = ("world", "rank", "label", "stream", "seq", "sides", "issued", "ahead", "behind", "earlier",
                 "launched", "start", "done", "end", "op", "delivered")

    def __init__(self, world, rank, label, stream, seq, last):
        self.world, self.rank, self.label, self.stream, self.seq = world, rank, label, stream, seq
        self.sides = []
        self.issued = world.clock.compute[rank]
        self.ahead = last if last is not None and not last.done else None
        self.earlier = last if last is not None and not last.delivered else None
        self.behind = None
        if self.ahead is not None:
            self.ahead.behind = self
        self.launched, self.start, self.done, self.end, self.op, self.delivered = False, 0.0, False, 0.0, "", False

    def launch(self):
        """The batch reaches the head of its stream: its operations may progress."""
        self.op = " ".join(s.op for s in self.sides)
        self.launched = True
        self.start = max(self.issued, self.world.clock.free(self.rank, self.stream))

    def side_done(self):
        """One of its operations has completed; if it was the last, the batch completes
        and the next one on the stream is launched. Returns the ops that may now start."""
        if not all(s.done for s in self.sides):
            return []
        self.done = True
        self.end = max([self.start] + [s.end for s in self.sides])
        self.world.clock.kernel(self.rank, self.stream, self.op, self.start, self.end, self.label)
        self.world._wake(self.rank)
        nxt, self.behind = self.behind, None
        if nxt is None:
            return []
        nxt.ahead = None
        nxt.launch()
        return nxt.sides

    def result(self, rank):
        """What ``wait()`` returns, as torch's ``Work.wait``: True. Every receive of this
        batch and of the batches before it on the stream is now in its buffer."""
        chain, batch = [], self
        while batch is not None and not batch.delivered:
            chain.append(batch)
            batch = batch.earlier
        for batch in reversed(chain):
            for side in batch.sides:
                side.deliver()
            batch.delivered, batch.earlier = True, None
        return True

    def queued(self):
        if self.launched:
            return ""
        return (f"that batch is queued behind rank {self.rank}'s batch #{self.ahead.seq} on group {self.label}, "
                f"which has not completed (the batches of a group run one after the other, as NCCL groups on one "
                f"communicator do)")

    def describe(self):
        where = (f"waits in batch_isend_irecv #{self.seq} on group {self.label} "
                 f"({', '.join(s.name() for s in self.sides)})")
        head = self
        while not head.launched:  # the batch at the head of the stream holds up the rest
            head = head.ahead
        side = next(s for s in head.sides if not s.done)
        if head is self:
            return f"{where}: its {side.name()} waits: {side.why_waiting()}"
        return (f"{where}: it is queued behind its batch #{head.seq}, which has not completed: that batch's "
                f"{side.name()} waits: {side.why_waiting()}")
