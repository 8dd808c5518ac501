"""Point to point as NCCL does it: a send completes only when the receiver posts its recv.

* ``comm.send(x, dst)`` blocks until rank ``dst`` posts the matching ``recv`` and the data
  has arrived (a rendezvous, as NCCL does for the messages training sends). So a ring in
  which every rank sends first and receives second waits forever: on a cluster and here.
  The emulator reports it as a :class:`~emulator.errors.DeadlockError` that says so.
* ``comm.isend(x, dst)`` and ``comm.irecv(buffer, src)`` (or ``irecv(src)``) post an
  operation and return a :class:`~emulator.engine.rendezvous.Handle`; ``wait()`` on an irecv's
  handle returns the received array (written into ``buffer`` when one was given; the
  buffer fixes the shape and dtype expected).
* ``comm.batch_isend_irecv([P2POp(comm.isend, x, right), P2POp(comm.irecv, buf, left)])``
  posts several at once and returns their handles, as ``torch.distributed`` does.

Peers are ranks *within the comm's group* (``comm.rank`` numbering); traces record global
ranks. The k-th send from a to b matches the k-th recv on b from a (per group, in
order). A transfer starts when both sides have been posted and their streams are free:
each rank has a stream per peer and direction (``"p2p 0->1"``), so a send and a receive
between two ranks progress at once, as they do when NCCL runs them in one group.

Operations issued *separately* (``isend``, ``irecv``, ``send``, ``recv``, not in one
``batch_isend_irecv``) between the same two ranks of a group run one after the other,
in the order each rank issued them, as they do under torch and NCCL:

* ``ProcessGroupNCCL::pointToPoint`` (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp)
  gives a lone send or recv the two-rank communicator of the pair
  (``getKeySendRecv(rank_, peer)``) and that communicator's stream
  (``ncclStreams_.at(key)``): every separate op between two ranks, either way, is queued
  on one CUDA stream, and a kernel on a stream starts only when the one before it ends.
  Inside ``batch_isend_irecv`` (``ncclActiveGroupCounter_ > 0``) the ops form one NCCL
  group on the group's communicator instead.
* NCCL wraps a lone ``ncclSend``/``ncclRecv`` in a group of its own
  (``ncclEnqueueCheck`` in src/enqueue.cc calls ``ncclGroupStartInternal``), and its
  documentation (docs: api/p2p.rst, usage/p2p.rst) says the operation "is blocking for
  the GPU"; sends and receives that must progress concurrently to complete "must be
  fused within a ncclGroupStart()/ncclGroupEnd() section".

So two neighbours that each ``isend`` to the other and then ``irecv`` from it wait
forever on a cluster, each send queued ahead of the receive that would complete the
other's. Here they raise :class:`~emulator.errors.DeadlockError` naming both ranks and
the operation each one's receive is queued behind. Megatron-LM's unbatched path
(``_p2p_ops`` in megatron/core/pipeline_parallel/p2p_communication.py) avoids it by
ordering: even pipeline ranks send first, odd ranks receive first.
"""

import numpy as np

from ..records.calls import Call
from .clock import p2p_stream
from ..errors import CollectiveMismatchError, ConfigError, PeerError
from ..algorithms.steps import Messages
from .rendezvous import Handle
from .shape_only import is_shape_only

DEADLOCK_HINT = (
    "hint: on NCCL, as here, a send completes only once the receiver posts the matching recv, so ranks "
    "that each send before they receive (a ring, or two pipeline stages sending to each other) wait forever. "
    "Post both at once with\n"
    "  comm.batch_isend_irecv([P2POp(comm.isend, x, right), P2POp(comm.irecv, buffer, left)])\n"
    "and wait on the handles, or alternate the order (even ranks send first, odd ranks receive first).")


class P2POp:
    """One entry of :meth:`batch_isend_irecv`: ``P2POp(comm.isend, x, peer)`` or
    ``P2POp(comm.irecv, buffer, peer)`` (torch's names and order of arguments)."""

    def __init__(self, op, tensor, peer):
        comm, name = getattr(op, "__self__", None), getattr(op, "__name__", None)
        if name not in ("isend", "irecv") or not isinstance(comm, PointToPoint):
            raise ConfigError(f"P2POp takes comm.isend or comm.irecv as its op, got {op!r}")
        self.op, self.tensor, self.peer, self.comm = op, tensor, peer, comm

    def __repr__(self):
        return f"P2POp({self.op.__name__}, shape={np.shape(self.tensor)}, peer={self.peer})"


class _Side:
    """One posted send or recv; matched with its counterpart into a transfer.

    ``ahead``: the ops it is queued behind on its NCCL stream (it starts once they have
    all completed): for an op issued separately, this rank's previous separate op with
    the same peer; nothing for an op of a ``batch_isend_irecv``."""

    __slots__ = ("kind", "rank", "peer", "k", "label", "data", "buffer", "issued", "stream", "call",
                 "done", "end", "op", "world", "ahead", "behind", "counterpart")

    def __init__(self, world, kind, rank, peer, k, label, data, buffer, call, ahead=()):
        self.world, self.kind, self.rank, self.peer, self.k, self.label = world, kind, rank, peer, k, label
        self.data, self.buffer, self.call = data, buffer, call
        self.issued = world.clock.compute[rank]
        self.stream = None
        self.done, self.end = False, 0.0
        self.op = f"send->{peer}" if kind == "send" else f"recv<-{peer}"
        self.ahead, self.behind, self.counterpart = tuple(ahead), [], None
        for side in self.ahead:
            side.behind.append(self)

    @property
    def ready(self):
        """Whether the op has reached the head of its stream: what was queued ahead of it
        has completed."""
        return all(side.done for side in self.ahead)

    def name(self):
        return f"{'send(dst' if self.kind == 'send' else 'recv(src'}={self.peer}) #{self.k}"

    def result(self, rank):
        if self.kind == "send":
            return None
        data, self.data = self.data, None  # hand the buffer over once
        if self.buffer is None:
            return data
        self.buffer[...] = data
        return self.buffer

    def queued(self):
        """Why this op has not started though it was posted ('' when it may start)."""
        blocking = next((side for side in self.ahead if not side.done), None)
        if blocking is None:
            return ""
        return (f"it was issued separately after its own {blocking.name()}, which has not completed (separately "
                f"issued isend/irecv between two ranks run one after the other, on one NCCL stream per pair)")

    def describe(self):
        w, peer = self.world, self.peer
        gone = " and has returned" if w._finished[peer] else ""
        where = f"waits in {self.name()} on group {self.label}"
        mine = self.queued()
        if mine:
            return (f"{where}: {mine}; post the sends and receives that must progress together in one "
                    f"batch_isend_irecv")
        other = self.counterpart
        theirs = other.queued() if other is not None else ""
        if theirs:
            return f"{where}: rank {peer} posted the matching {other.name()}, but {theirs}"
        if self.kind == "send":
            return f"{where}: rank {peer} has not posted the matching recv{gone}"
        return f"{where}: rank {peer} has not posted the matching send{gone}"


class PointToPoint:
    """The point-to-point half of :class:`~emulator.engine.comm.Comm`."""

    def _peer(self, peer, what):
        self._check_member(what)
        if not isinstance(peer, (int, np.integer)) or not 0 <= peer < self.size:
            raise PeerError(f"rank {self.global_rank}: {what} peer {peer!r} is out of range for group "
                            f"{self.label} of size {self.size} (valid: 0..{self.size - 1})")
        if peer == self.rank:
            raise PeerError(f"rank {self.global_rank}: {what} to itself (peer {peer} of group {self.label}); "
                            f"a rank keeps its own data without a message")
        g_peer = self.ranks[int(peer)]
        rep = self._world.representative
        if rep is not None and rep[g_peer] != g_peer:
            raise PeerError(f"rank {self.global_rank}: {what} to rank {g_peer}, which is folded into rank "
                            f"{int(rep[g_peer])}; point to point may not cross a folded axis (fold only axes whose "
                            f"ranks never talk one to one)")
        return g_peer

    def _post(self, kind, array, peer):
        """Post one send or recv, issued separately; returns its handle."""
        return Handle(self._world, self.global_rank, self._enqueue(kind, array, peer, grouped=False))

    def _enqueue(self, kind, array, peer, grouped):
        g_peer = self._peer(peer, kind)
        w, me = self._world, self.global_rank
        w.clock.check_alive(me)
        src, dst = (me, g_peer) if kind == "send" else (g_peer, me)
        box = w._p2p.setdefault((self.ranks, src, dst), ([], []))
        mine, other = (box[0], box[1]) if kind == "send" else (box[1], box[0])
        data = (array.copy() if is_shape_only(array) else np.array(array, copy=True)) if kind == "send" else None
        buffer = array if kind == "recv" else None
        nbytes = data.nbytes if data is not None else (buffer.nbytes if buffer is not None else None)
        call = Call(kind, self.label, nbytes, g_peer)
        w.calls[me].append(call)
        if grouped:  # one NCCL group: its ops progress together
            side = _Side(w, kind, me, g_peer, len(mine), self.label, data, buffer, call)
        else:  # on the pair's stream, behind this rank's last separate op with that peer
            last = w._p2p_separate.setdefault((self.ranks, me, g_peer), [])
            side = _Side(w, kind, me, g_peer, len(mine), self.label, data, buffer, call,
                         [s for s in last if not s.done])
            last[:] = [side]
        mine.append(side)
        if len(other) > side.k:
            side.counterpart = other[side.k]
            other[side.k].counterpart = side
            self._start(side)
        return side

    def _start(self, side):
        """Run every transfer that can start now: ``side``'s, if both its ends have
        reached the head of their streams, then those of the ops queued behind each op
        that completes."""
        todo = [side]
        while todo:
            s = todo.pop()
            other = s.counterpart
            if s.done or other is None or not (s.ready and other.ready):
                continue
            send, recv = (s, other) if s.kind == "send" else (other, s)
            self._match(send, recv)
            todo += send.behind + recv.behind

    def _match(self, send, recv):
        w = self._world
        data, buf = send.data, recv.buffer
        if buf is not None and (buf.shape != data.shape or buf.dtype != data.dtype):
            raise CollectiveMismatchError(
                f"rank {recv.rank} posted recv(src={send.rank}) #{recv.k} with a buffer of shape {buf.shape} "
                f"dtype {buf.dtype}, but rank {send.rank} sends shape {data.shape} dtype {data.dtype}; the "
                f"receiver's buffer must match what is sent")
        stream = p2p_stream(send.rank, recv.rank)
        queued = [a.end for side in (send, recv) for a in side.ahead]  # what ran before it on its stream
        t0 = max([send.issued, recv.issued, w.clock.free(send.rank, stream), w.clock.free(recv.rank, stream)]
                 + queued)
        steps = [Messages("p2p", np.array([0]), np.array([1]), np.array([0]), np.array([data.nbytes]), False,
                          exclusive=True)]
        if w.faults.interrupted(w.clock, (send.rank, recv.rank), steps, t0):  # one side dies first: never arrives
            return
        _, end = w.clock.charge("send", self.label, steps, (send.rank, recv.rank), t0, (stream, stream),
                                (send.op, recv.op))
        recv.call.nbytes = data.nbytes
        recv.data, send.data = data, None
        for side in (send, recv):
            side.done, side.end, side.stream = True, end, stream
            w._wake(side.rank)

    def send(self, x, dst):
        """Send a copy of ``x`` to group rank ``dst``; returns once it has been received."""
        self._post("send", x, dst).wait()

    def recv(self, buffer_or_src, src=None):
        """Receive the next array that group rank ``src`` sends here: ``recv(src)``, or
        ``recv(buffer, src)`` as torch (the buffer is filled and returned)."""
        return self.irecv(buffer_or_src, src).wait()

    def isend(self, x, dst):
        """Post a send of a copy of ``x``; returns a handle (``wait()`` returns None). It
        starts once this rank's earlier separately issued ops with ``dst`` have completed."""
        return self._post("send", x, dst)

    def irecv(self, buffer_or_src, src=None):
        """Post a receive: ``irecv(src)`` or ``irecv(buffer, src)``; returns a handle whose
        ``wait()`` returns the received array. It starts once this rank's earlier
        separately issued ops with ``src`` have completed."""
        return self._post("recv", *self._recv_args(buffer_or_src, src))

    def _recv_args(self, buffer_or_src, src):
        """(buffer or None, source) of ``irecv(src)`` or ``irecv(buffer, src)``."""
        if isinstance(buffer_or_src, np.ndarray) or is_shape_only(buffer_or_src):
            if src is None:
                raise PeerError(f"rank {self.global_rank}: irecv(buffer, src) needs the source rank")
            return buffer_or_src, src
        if src is not None:
            raise PeerError(f"rank {self.global_rank}: irecv takes (src) or (buffer, src), got two non-arrays")
        return None, buffer_or_src

    def batch_isend_irecv(self, ops):
        """Post every :class:`P2POp` in ``ops`` at once, as one NCCL group: they progress
        together, whatever their order in the list, and wait behind nothing issued
        separately. Returns their handles, in order."""
        ops = list(ops)
        if not ops or not all(isinstance(op, P2POp) for op in ops):
            raise ConfigError(f"rank {self.global_rank}: batch_isend_irecv takes a non-empty list of P2POp, "
                              f"got {ops!r}")
        for op in ops:
            if op.comm._world is not self._world or op.comm.global_rank != self.global_rank:
                raise ConfigError(f"rank {self.global_rank}: a P2POp in the batch belongs to another rank's comm")
            if op.comm.ranks != ops[0].comm.ranks:
                raise ConfigError(f"rank {self.global_rank}: all ops of batch_isend_irecv must use one group, "
                                  f"got groups {op.comm.label} and {ops[0].comm.label}")
        sides = [self._enqueue("send", op.tensor, op.peer, grouped=True) if op.op.__name__ == "isend" else
                 self._enqueue("recv", *self._recv_args(op.tensor, op.peer), grouped=True) for op in ops]
        return [Handle(self._world, self.global_rank, side) for side in sides]
