"""What a run leaves behind: every message, per-rank statistics and a timeline.

The world records messages in batches (one batch per collective, all its steps at once,
as arrays) so that recording costs little; ``world.trace`` turns them into records.
Times are the simulated clocks of :mod:`emulator.world`, never wall time.
"""

import json
from dataclasses import dataclass, field

import numpy as np

from .table import Table


class TraceRecord:
    """One message: ``op, group, step, src, dst, nbytes, start, end`` (attributes or keys)."""

    __slots__ = ("op", "group", "step", "src", "dst", "nbytes", "start", "end")

    def __init__(self, op, group, step, src, dst, nbytes, start, end):
        self.op, self.group, self.step = op, group, step
        self.src, self.dst, self.nbytes = src, dst, nbytes
        self.start, self.end = start, end

    def __getitem__(self, key):
        return getattr(self, key)

    def as_dict(self):
        return {k: getattr(self, k) for k in self.__slots__}

    def __repr__(self):
        return (f"TraceRecord({self.op} {self.group} step={self.step} {self.src}->{self.dst} "
                f"{self.nbytes}B {self.start * 1e6:.2f}-{self.end * 1e6:.2f}us)")


@dataclass
class Batch:
    """The messages of one collective (or one point-to-point send), as arrays."""

    op: str
    group: str
    step: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    nbytes: np.ndarray
    start: np.ndarray
    end: np.ndarray

    def records(self):
        return [
            TraceRecord(self.op, self.group, int(st), int(s), int(d), int(b), float(t0), float(t1))
            for st, s, d, b, t0, t1 in zip(self.step, self.src, self.dst, self.nbytes, self.start, self.end)
        ]


@dataclass
class Stats:
    """Totals of a run. Indexable like a dict too: ``stats["bytes_sent"][rank]``."""

    bytes_sent: list
    bytes_received: list
    bytes_by_op: dict
    messages_by_op: dict
    time: list
    messages: int = 0
    extra: dict = field(default_factory=dict)

    def __getitem__(self, key):
        return getattr(self, key)

    def table(self):
        rows = [{"rank": r, "sent": s, "received": v, "sim_time_us": t * 1e6}
                for r, (s, v, t) in enumerate(zip(self.bytes_sent, self.bytes_received, self.time))]
        return Table(rows, byte_columns=("sent", "received"))


def stats_from(batches, n_ranks, clocks):
    sent = np.zeros(n_ranks, dtype=np.int64)
    received = np.zeros(n_ranks, dtype=np.int64)
    by_op, count_by_op, count = {}, {}, 0
    for b in batches:
        sent += np.bincount(b.src, weights=b.nbytes, minlength=n_ranks).astype(np.int64)
        received += np.bincount(b.dst, weights=b.nbytes, minlength=n_ranks).astype(np.int64)
        by_op[b.op] = by_op.get(b.op, 0) + int(b.nbytes.sum())
        count_by_op[b.op] = count_by_op.get(b.op, 0) + len(b.src)
        count += len(b.src)
    return Stats(sent.tolist(), received.tolist(), by_op, count_by_op, list(map(float, clocks)), count)


@dataclass(frozen=True)
class Event:
    """A span on one rank's stream: kind is ``compute``, ``comm`` or ``idle``."""

    rank: int
    stream: str  # "compute" or "comm"
    kind: str
    name: str
    start: float
    end: float

    @property
    def duration(self):
        return self.end - self.start


class Timeline:
    """Per-rank events from the simulated clocks, ready for a Gantt chart."""

    def __init__(self, events, n_ranks):
        self.events = sorted(events, key=lambda e: (e.rank, e.stream, e.start, e.end))
        self.n_ranks = n_ranks
        self.makespan = max((e.end for e in events), default=0.0)

    def of(self, rank, stream=None, kind=None):
        return [e for e in self.events if e.rank == rank
                and (stream is None or e.stream == stream) and (kind is None or e.kind == kind)]

    def total(self, kind, rank=None, stream="compute"):
        return sum(e.duration for e in self.events if e.kind == kind and e.stream == stream
                   and (rank is None or e.rank == rank))

    def idle_fraction(self):
        """Share of ranks x makespan spent not computing (the pipeline 'bubble')."""
        if self.makespan == 0:
            return 0.0
        busy = self.total("compute")
        return 1.0 - busy / (self.n_ranks * self.makespan)

    def to_chrome(self):
        """Chrome trace-event JSON (open in https://ui.perfetto.dev): one process per rank,
        a compute thread and a comm thread in each."""
        out = []
        for r in range(self.n_ranks):
            out.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
            out.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
            for tid, name in ((0, "compute"), (1, "comm")):
                out.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": name}})
        for e in self.events:
            out.append({"ph": "X", "name": e.name, "cat": e.kind, "pid": e.rank,
                        "tid": 0 if e.stream == "compute" else 1,
                        "ts": e.start * 1e6, "dur": e.duration * 1e6})
        return {"traceEvents": out, "displayTimeUnit": "ns"}

    def save_chrome_trace(self, path):
        with open(path, "w") as f:
            json.dump(self.to_chrome(), f)
        return path
