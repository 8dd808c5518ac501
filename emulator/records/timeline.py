"""The timeline of a run: spans on every rank's streams, for Gantt charts and Perfetto."""

import json
from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    """A span on one rank's stream. ``stream`` is ``"compute"`` or a communication stream
    (``"comm tp"``, ``"p2p 0-1"``); ``kind`` is ``compute``, ``comm`` or ``idle``;
    ``group`` names the group of a communication (a mesh axis, ``"world"``, or ranks)."""

    rank: int
    stream: str
    kind: str
    name: str
    start: float
    end: float
    group: str = None

    @property
    def duration(self):
        return self.end - self.start


class Timeline:
    """Per-rank events from the simulated clocks, ready for a Gantt chart."""

    def __init__(self, events, size, ranks=None):
        self.events = sorted(events, key=lambda e: (e.rank, e.stream != "compute", e.stream, e.start, e.end))
        self.size = size  # ranks in the run
        self.ranks = list(ranks) if ranks is not None else list(range(size))  # their numbers in the world
        self.makespan = max((e.end for e in events), default=0.0)

    def of_ranks(self, ranks):
        """The timeline of some ranks only (for a readable picture of a large world)."""
        ranks = list(ranks)
        index = {r: i for i, r in enumerate(ranks)}
        events = [Event(index[e.rank], e.stream, e.kind, e.name, e.start, e.end, e.group)
                  for e in self.events if e.rank in index]
        out = Timeline(events, len(ranks), [self.ranks[r] for r in ranks])
        out.makespan = self.makespan
        return out

    def of(self, rank, stream=None, kind=None):
        return [e for e in self.events if e.rank == rank
                and (stream is None or e.stream == stream) and (kind is None or e.kind == kind)]

    def streams(self, rank):
        """The rank's streams: ``"compute"`` first, then its communication streams."""
        names = {e.stream for e in self.events if e.rank == rank}
        return ["compute"] + sorted(names - {"compute"})

    def total(self, kind, rank=None, stream="compute"):
        return sum(e.duration for e in self.events if e.kind == kind and e.stream == stream
                   and (rank is None or e.rank == rank))

    def idle_fraction(self):
        """Share of ranks x makespan spent not computing (the pipeline 'bubble')."""
        if self.makespan == 0:
            return 0.0
        busy = self.total("compute")
        return 1.0 - busy / (self.size * self.makespan)

    def to_chrome(self):
        """Chrome trace-event JSON (open in https://ui.perfetto.dev): one process per rank,
        one thread per stream."""
        out = []
        tids = {}
        for r in range(self.size):
            out.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
            out.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
            for tid, name in enumerate(self.streams(r)):
                tids[(r, name)] = tid
                out.append({"ph": "M", "name": "thread_name", "pid": r, "tid": tid, "args": {"name": name}})
        for e in self.events:
            span = {"ph": "X", "name": e.name, "cat": e.kind, "pid": e.rank, "tid": tids[(e.rank, e.stream)],
                    "ts": e.start * 1e6, "dur": e.duration * 1e6}
            if e.group is not None:
                span["args"] = {"group": e.group}
            out.append(span)
        return {"traceEvents": out, "displayTimeUnit": "ns"}

    def save_chrome_trace(self, path):
        with open(path, "w") as f:
            json.dump(self.to_chrome(), f)
        return path
