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
    """One posted send or recv; matched with its counterpart into a transfer."""

    __slots__ = ("kind", "rank", "peer", "k", "label", "data", "buffer", "issued", "stream", "call",
                 "done", "end", "op", "world")

    def __init__(self, world, kind, rank, peer, k, label, data, buffer, call):
        self.world, self.kind, self.rank, self.peer, self.k, self.label = world, kind, rank, peer, k, label
        self.data, self.buffer, self.call = data, buffer, call
        self.issued = world.clock.compute[rank]
        self.stream = None
        self.done, self.end = False, 0.0
        self.op = f"send->{peer}" if kind == "send" else f"recv<-{peer}"

    def result(self, rank):
        if self.kind == "send":
            return None
        data, self.data = self.data, None  # hand the buffer over once
        if self.buffer is None:
            return data
        self.buffer[...] = data
        return self.buffer

    def describe(self):
        w, peer = self.world, self.peer
        gone = " and has returned" if w._finished[peer] else ""
        if self.kind == "send":
            return (f"waits in send(dst={peer}) #{self.k} on group {self.label}: rank {peer} has not posted "
                    f"the matching recv{gone}")
        return (f"waits in recv(src={peer}) #{self.k} on group {self.label}: rank {peer} has not posted the "
                f"matching send{gone}")


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
        side = _Side(w, kind, me, g_peer, len(mine), self.label, data, buffer, call)
        mine.append(side)
        if len(other) > side.k:
            self._match(*((side, other[side.k]) if kind == "send" else (other[side.k], side)))
        return Handle(w, me, side)

    def _match(self, send, recv):
        w = self._world
        data, buf = send.data, recv.buffer
        if buf is not None and (buf.shape != data.shape or buf.dtype != data.dtype):
            raise CollectiveMismatchError(
                f"rank {recv.rank} posted recv(src={send.rank}) #{recv.k} with a buffer of shape {buf.shape} "
                f"dtype {buf.dtype}, but rank {send.rank} sends shape {data.shape} dtype {data.dtype}; the "
                f"receiver's buffer must match what is sent")
        stream = p2p_stream(send.rank, recv.rank)
        t0 = max(send.issued, recv.issued, w.clock.free(send.rank, stream), w.clock.free(recv.rank, stream))
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
        """Post a send of a copy of ``x``; returns a handle (``wait()`` returns None)."""
        return self._post("send", x, dst)

    def irecv(self, buffer_or_src, src=None):
        """Post a receive: ``irecv(src)`` or ``irecv(buffer, src)``; returns a handle whose
        ``wait()`` returns the received array."""
        if isinstance(buffer_or_src, np.ndarray) or is_shape_only(buffer_or_src):
            if src is None:
                raise PeerError(f"rank {self.global_rank}: irecv(buffer, src) needs the source rank")
            return self._post("recv", buffer_or_src, src)
        if src is not None:
            raise PeerError(f"rank {self.global_rank}: irecv takes (src) or (buffer, src), got two non-arrays")
        return self._post("recv", None, buffer_or_src)

    def batch_isend_irecv(self, ops):
        """Post every :class:`P2POp` in ``ops`` at once; returns their handles, in order."""
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
        return [op.op(op.tensor, op.peer) for op in ops]
