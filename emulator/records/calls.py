"""The calls a rank makes, in a format both backends write: the emulator and the GPU labs.

Per rank, the ordered list of communication calls it issued: ``Call(op, group, nbytes,
peer)``. ``op`` is torch's name (``all_reduce``, ``reduce_scatter``, ``all_gather``,
``broadcast``, ``all_to_all``, ``all_to_all_single``, ``barrier``; ``send`` and ``recv``
for point to point, whether blocking, ``isend``/``irecv`` or inside
``batch_isend_irecv``); ``group`` names the group (a mesh axis such as ``"dp"``,
``"world"``, or the sorted global ranks of an ad-hoc group); ``nbytes`` is the size of
the array the rank passed in (for all_gather its shard, for reduce_scatter the full
input, for recv the buffer); ``peer`` is the other global rank of a point-to-point call.

``world.calls`` gives the emulator's; ``gpu_labs/call_trace.py`` records the same for
``torch.distributed``; :func:`compare` says where two such traces first differ, so a test
can assert that a lab and its lesson ran one algorithm.
"""

import json

FORMAT = "parallelism-from-scratch calls v1"


class Call:
    __slots__ = ("op", "group", "nbytes", "peer")

    def __init__(self, op, group, nbytes, peer=None):
        self.op, self.group, self.nbytes, self.peer = op, str(group), nbytes, peer

    def as_list(self):
        return [self.op, self.group, self.nbytes, self.peer]

    def __eq__(self, other):
        return isinstance(other, Call) and self.as_list() == other.as_list()

    def __repr__(self):
        peer = f" peer={self.peer}" if self.peer is not None else ""
        return f"{self.op}({self.group}, {self.nbytes} B{peer})"


def group_name(ranks, label):
    """The name a trace uses for a group: its mesh axis (or ``"world"``), else its ranks."""
    return label if label is not None else str(sorted(int(r) for r in ranks))


def to_json(calls, **meta):
    """``calls[rank]`` lists of :class:`Call` -> a JSON-able dict (``meta`` kept as is)."""
    return {"format": FORMAT, **meta, "ranks": [[c.as_list() for c in per_rank] for per_rank in calls]}


def from_json(data):
    if data.get("format") != FORMAT:
        raise ValueError(f"not a calls trace (format {data.get('format')!r}, expected {FORMAT!r})")
    return [[Call(*c) for c in per_rank] for per_rank in data["ranks"]]


def save(path, calls, **meta):
    with open(path, "w") as f:
        json.dump(to_json(calls, **meta), f, indent=None)
    return path


def load(path):
    with open(path) as f:
        return from_json(json.load(f))


def compare(a, b, names=("a", "b")):
    """Where two traces differ: a list of lines (empty when every rank issued the same
    calls in the same order)."""
    out = []
    if len(a) != len(b):
        return [f"{names[0]} has {len(a)} ranks, {names[1]} has {len(b)}"]
    for rank, (x, y) in enumerate(zip(a, b)):
        for i, (cx, cy) in enumerate(zip(x, y)):
            if cx != cy:
                out.append(f"rank {rank}, call #{i}: {names[0]} {cx!r}, {names[1]} {cy!r}")
                break
        else:
            if len(x) != len(y):
                longer, extra = (names[0], x) if len(x) > len(y) else (names[1], y)
                out.append(f"rank {rank}: {longer} made {len(extra) - min(len(x), len(y))} more calls, "
                           f"starting with {extra[min(len(x), len(y))]!r}")
    return out
