"""What a run leaves behind: every message and per-rank statistics.

The world records messages in batches (one batch per operation, all its steps at once, as
arrays) so that recording costs little; ``world.trace`` turns them into records. Times
are the simulated clocks of :mod:`emulator.engine.clock`, never wall time.
"""

from dataclasses import dataclass, field

import numpy as np

from .table import Table


class TraceRecord:
    """One message: ``op, group, step, src, dst, nbytes, channel, link, start, end``
    (attributes or keys). ``group`` names the group (a mesh axis such as ``"tp"``,
    ``"world"``, or the ranks of an ad-hoc group); ``link`` is ``"nvlink"`` or ``"nic"``."""

    __slots__ = ("op", "group", "step", "src", "dst", "nbytes", "channel", "link", "start", "end")

    def __init__(self, op, group, step, src, dst, nbytes, channel, link, start, end):
        self.op, self.group, self.step = op, group, step
        self.src, self.dst, self.nbytes = src, dst, nbytes
        self.channel, self.link = channel, link
        self.start, self.end = start, end

    def __getitem__(self, key):
        return getattr(self, key)

    def as_dict(self):
        return {k: getattr(self, k) for k in self.__slots__}

    def __repr__(self):
        return (f"TraceRecord({self.op} {self.group} step={self.step} {self.src}->{self.dst} {self.nbytes}B "
                f"ch{self.channel} {self.link} {self.start * 1e6:.2f}-{self.end * 1e6:.2f}us)")


class Batch:
    """The messages of one operation: its op and group, the timing pattern of its messages
    (:class:`~emulator.machine.links.Pattern`, relative times) and when it started. Reads like
    arrays: ``src``, ``dst``, ``nbytes``, ``channel``, ``nic`` (crosses nodes), ``start``,
    ``end`` (absolute)."""

    __slots__ = ("op", "group", "pattern", "t0")

    def __init__(self, op, group, pattern, t0):
        self.op, self.group, self.pattern, self.t0 = op, group, pattern, t0

    def __getattr__(self, name):
        if name in ("step", "src", "dst", "nbytes", "channel", "nic"):
            return getattr(self.pattern, name)
        if name in ("start", "end"):
            return self.t0 + getattr(self.pattern, name)
        raise AttributeError(name)

    def records(self):
        links = np.where(self.nic, "nic", "nvlink")
        return [
            TraceRecord(self.op, self.group, int(st), int(s), int(d), int(b), int(c), str(k), float(t0), float(t1))
            for st, s, d, b, c, k, t0, t1 in zip(self.step, self.src, self.dst, self.nbytes, self.channel, links,
                                                 self.start, self.end)
        ]


@dataclass
class Stats:
    """Totals of a run. Indexable like a dict too: ``stats["bytes_sent"][rank]``.

    ``bytes_sent_by_link[link][rank]``: bytes a rank sent over NVLink and over its NIC;
    ``bytes_sent_by_group[(group, link)][rank]``: the same, per group (a mesh axis such as
    ``"tp"``, or ``"dp,cp"``)."""

    bytes_sent: list
    bytes_received: list
    bytes_by_op: dict
    messages_by_op: dict
    time: list
    messages: int = 0
    bytes_sent_by_link: dict = field(default_factory=dict)
    bytes_sent_by_group: dict = field(default_factory=dict)

    def __getitem__(self, key):
        return getattr(self, key)

    def table(self):
        rows = [{"rank": r, "sent": s, "received": v, "sim_time_us": t * 1e6}
                for r, (s, v, t) in enumerate(zip(self.bytes_sent, self.bytes_received, self.time))]
        return Table(rows, byte_columns=("sent", "received"))


def stats_from(batches, world_size, clocks):
    sent = np.zeros(world_size, dtype=np.int64)
    received = np.zeros(world_size, dtype=np.int64)
    by_link = {"nvlink": np.zeros(world_size, dtype=np.int64), "nic": np.zeros(world_size, dtype=np.int64)}
    by_op, count_by_op, count, by_group = {}, {}, 0, {}
    for b in batches:
        sent += np.bincount(b.src, weights=b.nbytes, minlength=world_size).astype(np.int64)
        received += np.bincount(b.dst, weights=b.nbytes, minlength=world_size).astype(np.int64)
        for link, mask in (("nvlink", ~b.nic), ("nic", b.nic)):
            if mask.any():
                part = np.bincount(b.src[mask], weights=b.nbytes[mask], minlength=world_size).astype(np.int64)
                by_link[link] += part
                key = (b.group, link)
                by_group[key] = by_group[key] + part if key in by_group else part
        by_op[b.op] = by_op.get(b.op, 0) + int(b.nbytes.sum())
        count_by_op[b.op] = count_by_op.get(b.op, 0) + len(b.src)
        count += len(b.src)
    return Stats(sent.tolist(), received.tolist(), by_op, count_by_op, list(map(float, clocks)), count,
                 {k: v.tolist() for k, v in by_link.items()}, {k: v.tolist() for k, v in by_group.items()})
