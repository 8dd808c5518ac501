"""Simulated time of one run: every rank's streams, the links' bookings, what happened when.

Each rank has a **compute stream** (its clock: ``comm.compute`` advances it) and one
**communication stream per group** it uses, as ``ProcessGroupNCCL`` has: collectives on a
group run on that group's stream in the order they were issued, and point-to-point
transfers issued separately run on a stream per pair of ranks and direction (torch creates
a communicator, and a stream, per pair for a lone send or recv), while a
``batch_isend_irecv`` is one NCCL group, one kernel on its group's stream (torch runs it on
the group's communicator). An operation starts when every rank taking part is ready (it
has issued it and its stream is free) and every port it needs is free
(:mod:`emulator.machine.links`). ``handle.wait()`` joins a stream into the compute stream: the
rank's clock moves to the operation's end, and the gap shows as idle.

Times are simulated seconds, never wall time.
"""

import math

import numpy as np

from .faults import RankDied
from ..machine.links import PortBook, pattern_of, port_count, port_tables
from ..records.trace import Batch


def port_map(n, topology, representative):
    """Every port of a world of ``n`` ranks -> the same port of its rank's representative."""
    node, nvl_out, nvl_in, nic_out, nic_in = port_tables(n, topology)
    out = np.arange(port_count(n, topology))
    rep = np.asarray(representative)
    for table in (nvl_out, nvl_in, nic_out, nic_in):
        out[table] = table[rep]
    return out


def collective_stream(label):
    return f"comm {label}"


def p2p_stream(src, dst):
    return f"p2p {src}->{dst}"


class Clock:
    """The streams, port bookings, trace batches and timeline events of one run."""

    def __init__(self, n, topology, patterns, representative=None, deadline=None):
        self.n, self.topology = n, topology
        self.compute = [0.0] * n
        self.host = [0.0] * n  # when each rank's host has issued what it issued so far
        self.busy = [[] for _ in range(n)]  # per rank, its compute's (start, end), in order
        self.deadline = list(deadline) if deadline is not None else [math.inf] * n  # when a rank dies
        self.streams = {}  # (rank, stream name) -> when that stream is free
        self.events = []  # (rank, stream, kind, name, start, end, group)
        self.batches = []
        self.ports = PortBook(port_count(n, topology))
        # a folded world: a folded rank's ports are busy exactly when its representative's
        # are (it does the same things at the same times), so bookings live on those
        self.port_map = None if representative is None else port_map(n, topology, representative)
        self._patterns = patterns  # timing of fixed message patterns, kept across runs

    def free(self, rank, stream):
        """When ``stream`` of ``rank`` has finished what was issued on it so far."""
        return self.streams.get((rank, stream), 0.0)

    def event(self, rank, stream, kind, name, start, end, group=None):
        if end > start:
            self.events.append((rank, stream, kind, name, start, end, group))

    def advance(self, rank, seconds, name):
        """Compute on ``rank`` for ``seconds`` (a rank that dies meanwhile stops then:
        :class:`~emulator.engine.faults.RankDied`)."""
        t = self.compute[rank]
        end = min(t + seconds, self.deadline[rank])
        self.event(rank, "compute", "compute", name, t, end)
        if end > t:
            self.busy[rank].append((t, end))
        self.compute[rank] = max(t, end)
        if t + seconds > self.deadline[rank]:
            raise RankDied(rank, self.deadline[rank])

    def kernels(self, rank, durations, name, dispatch):
        """Run kernels of ``durations`` seconds on ``rank``'s compute stream, each issued by
        the host ``dispatch`` seconds after the previous one: a kernel starts when both the
        stream is free and the host has issued it (the GPU waits for a slow host)."""
        t, h = self.compute[rank], self.host[rank]
        start = None
        for d in durations:
            h += dispatch
            s = t if t >= h else h
            if start is None:
                start = s
            t = s + d
        self.host[rank] = h
        if start is None:
            return
        if start > self.compute[rank]:
            self.join(rank, start, "the host")
        self.advance(rank, t - start, name)

    def issue(self, rank, dispatch):
        """The host issues a collective: it is ready no earlier than that."""
        self.host[rank] += dispatch
        return self.host[rank]

    def sync_host(self, rank):
        """The host waits for the GPU (it reads a result: the step's loss)."""
        self.host[rank] = max(self.host[rank], self.compute[rank])

    def busy_between(self, rank, start, end):
        """Seconds ``rank`` computed between ``start`` and ``end``."""
        total = 0.0
        for s, e in reversed(self.busy[rank]):
            if e <= start:
                break
            total += max(0.0, min(e, end) - max(s, start))
        return total

    def join(self, rank, end, what, group=None):
        """``rank`` waits for an operation (of ``group``) that ends at ``end``."""
        t = self.compute[rank]
        stop = min(end, self.deadline[rank])
        if stop > t:
            self.event(rank, "compute", "idle", f"wait {what}", t, stop, group)
            self.compute[rank] = stop
        if end > self.deadline[rank]:
            raise RankDied(rank, self.deadline[rank])

    def background(self, rank, stream, seconds, name, kind="io"):
        """Work that runs beside the compute stream (a checkpoint's writer): on ``stream``
        of ``rank``, after what it holds and not before now. Returns when it ends."""
        start = max(self.compute[rank], self.free(rank, stream))
        self.event(rank, stream, kind, name, start, start + seconds)
        self.streams[(rank, stream)] = start + seconds
        return start + seconds

    def check_alive(self, rank):
        """Before ``rank`` issues an operation: it has died if its clock reached its deadline."""
        if self.compute[rank] >= self.deadline[rank]:
            raise RankDied(rank, self.deadline[rank])

    def charge(self, op, label, steps, ranks, t0, streams, names):
        """Place an operation whose ``steps`` (Messages, group-local ranks) run on the
        group ``ranks``, not before ``t0``: book its ports, record its messages, put it on
        each rank's stream (``streams[i]`` for ``ranks[i]``, event named ``names[i]``; None:
        the rank's part runs inside a kernel placed with :meth:`kernel`). Returns its
        (start, end)."""
        pattern = self._pattern(steps, ranks) if steps else None
        duration = pattern.total if pattern else 0.0
        ports = None
        if pattern is not None:
            ports = pattern.ports if self.port_map is None else np.unique(self.port_map[pattern.ports])
        start = self.ports.place(ports, duration, t0) if pattern else t0
        end = start + duration
        if pattern is not None and len(pattern.src):
            self.ports.book(ports, start, end)
            self.batches.append(Batch(op, label, pattern, start))
        if end > start:
            self.events.extend([(r, s, "comm", name, start, end, label) for r, s, name in zip(ranks, streams, names)
                                if s is not None])
        self.streams.update({(r, s): end for r, s in zip(ranks, streams) if s is not None})
        return start, end

    def kernel(self, rank, stream, name, start, end, label):
        """One kernel on ``stream`` of ``rank`` from ``start`` to ``end`` (a batch of point
        to point, one NCCL group: its transfers were charged with ``charge``)."""
        self.event(rank, stream, "comm", name, start, end, label)
        self.streams[(rank, stream)] = max(end, self.free(rank, stream))

    def span(self, steps, ranks, t0):
        """When an operation would run (start, end) if charged now, booking nothing."""
        pattern = self._pattern(steps, ranks) if steps else None
        if pattern is None:
            return t0, t0
        ports = pattern.ports if self.port_map is None else np.unique(self.port_map[pattern.ports])
        start = self.ports.place(ports, pattern.total, t0)
        return start, start + pattern.total

    def _pattern(self, steps, ranks):
        # a fixed pattern (a cached tuple of Messages) is timed once per group; the cache
        # keeps the tuple itself, so its id cannot be reused by another pattern
        if not isinstance(steps, tuple):
            return pattern_of(steps, ranks, self.n, self.topology)
        key = (ranks, id(steps))
        hit = self._patterns.get(key)
        if hit is None or hit[0] is not steps:
            hit = self._patterns[key] = (steps, pattern_of(steps, ranks, self.n, self.topology))
        return hit[1]

    def final(self):
        """Per rank, when its last stream finishes."""
        out = list(self.compute)
        for (r, _), t in self.streams.items():
            out[r] = max(out[r], t)
        return out
