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
  posts several at once as one NCCL group and returns a list holding **one** handle for
  the whole batch, as torch's NCCL path does (:mod:`emulator.engine.p2p_work` cites it):
  ``for work in comm.batch_isend_irecv(ops): work.wait()`` waits for every operation, and
  the received arrays are then in ``buf``. The batches a rank posts on a group run one
  after the other on the group's stream (``"comm pp"``, the stream its collectives use),
  each one a single kernel there on the timeline.

Peers are ranks *within the comm's group* (``comm.rank`` numbering); traces record global
ranks. The k-th send from a to b matches the k-th recv on b from a (per group, in
order), whichever batch or call posted them. A transfer starts when both of its ends may
progress: for an op of a batch, once the batch has been launched (the batch before it on
the stream has completed); for an op issued separately, once it is posted and its pair's
stream (``"p2p 0->1"``) is free. A batch completes when all its transfers have, and only
then is the next one on its stream launched. So a batch whose receive is sent from the
peer's later batch, while the peer's earlier batch waits for a receive that only this
rank's later batch posts, waits forever, on NCCL as here: pair the batches so that each
rank's k-th exchange with a neighbour meets the neighbour's (Megatron posts one batch per
step, ``send_forward_recv_backward`` and friends in
megatron/core/pipeline_parallel/p2p_communication.py).

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
from .clock import collective_stream, p2p_stream
from ..errors import CollectiveMismatchError, ConfigError, PeerError
from ..algorithms.p2p_op import P2POp
from ..algorithms.steps import Messages
from .p2p_work import Group, Side
from .rendezvous import Handle
from ..arrays.shape_only import is_shape_only

DEADLOCK_HINT = (
    "hint: on NCCL, as here, a send completes only once the receiver posts the matching recv, so ranks "
    "that each send before they receive (a ring, or two pipeline stages sending to each other) wait forever. "
    "Post both at once with\n"
    "  comm.batch_isend_irecv([P2POp(comm.isend, x, right), P2POp(comm.irecv, buffer, left)])\n"
    "and wait on its handle, or alternate the order (even ranks send first, odd ranks receive first).")

BATCH_HINT = (
    "hint: on NCCL, as here, the batches a rank posts on a group run one after the other, and a batch completes "
    "only when every send and receive in it has. Two ranks whose batches each wait for an operation that the other "
    "posts only in a later batch wait forever. Pair the batches: each one's sends and receives should meet the "
    "neighbour's batch of the same step (as Megatron's send_forward_recv_backward and "
    "send_forward_backward_recv_forward_backward do), or put what must progress together in one batch.")


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
        side = self._enqueue(kind, array, peer)
        self._start([side])
        return Handle(self._world, self.global_rank, side)

    def _enqueue(self, kind, array, peer, batch=None):
        """Post one op (of ``batch``, or issued separately) and match it with its
        counterpart if the peer has posted that already; starts nothing."""
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
        if batch is not None:  # one NCCL group: its ops progress together once it is launched
            side = Side(w, kind, me, g_peer, len(mine), self.label, data, buffer, call, batch=batch)
            batch.sides.append(side)
        else:  # on the pair's stream, behind this rank's last separate op with that peer
            last = w._p2p_separate.setdefault((self.ranks, me, g_peer), [])
            side = Side(w, kind, me, g_peer, len(mine), self.label, data, buffer, call,
                        [s for s in last if not s.done])
            last[:] = [side]
        mine.append(side)
        if len(other) > side.k:
            side.counterpart = other[side.k]
            other[side.k].counterpart = side
        return side

    def _start(self, todo):
        """Run every transfer that can start now: those of the ops in ``todo`` whose two
        ends may progress, then those of the ops that each completion lets go (the next
        op on a pair's stream, or the next batch on a group's)."""
        while todo:
            s = todo.pop()
            other = s.counterpart
            if s.done or other is None or not (s.ready and other.ready):
                continue
            send, recv = (s, other) if s.kind == "send" else (other, s)
            todo += self._match(send, recv)

    def _match(self, send, recv):
        """Charge the transfer of ``send`` into ``recv``; returns the ops it lets go."""
        w = self._world
        data, buf = send.data, recv.buffer
        if buf is not None and (buf.shape != data.shape or buf.dtype != data.dtype):
            raise CollectiveMismatchError(
                f"rank {recv.rank} posted recv(src={send.rank}) #{recv.k} with a buffer of shape {buf.shape} "
                f"dtype {buf.dtype}, but rank {send.rank} sends shape {data.shape} dtype {data.dtype}; the "
                f"receiver's buffer must match what is sent")
        stream = p2p_stream(send.rank, recv.rank)
        t0 = max(self._earliest(send, stream), self._earliest(recv, stream))
        steps = [Messages("p2p", np.array([0]), np.array([1]), np.array([0]), np.array([data.nbytes]), False,
                          exclusive=True)]
        if w.faults.interrupted(w.clock, (send.rank, recv.rank), steps, t0):  # one side dies first: never arrives
            return []
        # an op of a batch shows as its batch's kernel on the group's stream, not on its own
        streams = tuple(None if side.batch is not None else stream for side in (send, recv))
        _, end = w.clock.charge("send", send.label, steps, (send.rank, recv.rank), t0, streams, (send.op, recv.op))
        recv.call.nbytes = data.nbytes
        recv.data, send.data = data, None
        freed = []
        for side in (send, recv):
            side.done, side.end, side.stream = True, end, side.batch.stream if side.batch is not None else stream
            freed += side.batch.side_done() if side.batch is not None else side.behind
            w._wake(side.rank)
        return freed

    def _earliest(self, side, stream):
        """When ``side``'s end of a transfer may start: once its batch was launched, or
        (issued separately) once it was posted and its pair's stream is free."""
        if side.batch is not None:
            return side.batch.start
        return max([side.issued, self._world.clock.free(side.rank, stream)] + [a.end for a in side.ahead])

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
        """Post every :class:`P2POp` in ``ops`` as one NCCL group, as torch does on NCCL
        (:mod:`emulator.engine.p2p_work`): the batch runs on the group's stream after the
        batches this rank posted on the group before it, its operations progress together
        whatever their order in the list, and it waits behind nothing issued separately.
        Returns a list holding one handle for the whole batch: its ``wait()`` waits for
        every operation and returns True; what was received is then in the receive
        buffers given."""
        ops = list(ops)
        if not ops or not all(isinstance(op, P2POp) and isinstance(op.comm, PointToPoint) for op in ops):
            raise ConfigError(f"rank {self.global_rank}: batch_isend_irecv takes a non-empty list of P2POp, "
                              f"got {ops!r}")
        for op in ops:
            if op.comm._world is not self._world or op.comm.global_rank != self.global_rank:
                raise ConfigError(f"rank {self.global_rank}: a P2POp in the batch belongs to another rank's comm")
            if op.comm.ranks != ops[0].comm.ranks:
                raise ConfigError(f"rank {self.global_rank}: all ops of batch_isend_irecv must use one group, "
                                  f"got groups {op.comm.label} and {ops[0].comm.label}")
        group = ops[0].comm  # the ops' group, whichever comm posts them (torch takes the P2POps' group)
        w, me = self._world, self.global_rank
        key = (group.ranks, me)
        seq, last = w._p2p_batches.get(key, (0, None))
        batch = Group(w, me, group.label, collective_stream(group.label), seq, last)
        for op in ops:
            if op.op.__name__ == "isend":
                group._enqueue("send", op.tensor, op.peer, batch)
            else:  # P2POp(comm.irecv, buffer, peer): the buffer is filled, as torch's irecv fills its tensor
                group._enqueue("recv", *group._recv_args(op.tensor, op.peer), batch)
        w._p2p_batches[key] = (seq + 1, batch)
        if batch.ahead is None:
            batch.launch()
            group._start(list(batch.sides))
        return [Handle(w, me, batch)]
