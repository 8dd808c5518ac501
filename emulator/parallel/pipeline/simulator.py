"""One simulator of a pipeline schedule: when each action starts and ends, without running it.

Each rank runs its actions in order. An action starts once its rank is free and what it
waits for (:func:`~.actions.dependencies`) is done; a message from another rank leaves when
its producer ends (the executor posts the receive in its batch of that time step, ahead of
the action: :mod:`~.exchange`) and takes ``hop(src, dst)`` seconds. ``host[r][i]``: the
host's seconds to issue action i of rank r; the host runs ahead of the GPU, never waiting
for it within a step, and an action ends no earlier than its host has issued all of it.

It serves three readers:

* :func:`simulate`: equal stages on a free network, ``costs = (t_f, t_b, t_w)`` per whole
  stage (a chunk's action takes ``1/v`` of it): what :func:`~.check.validate` plays, the
  grid a schedule is drawn on, and the times :func:`~.exchange.program` pairs messages by;
* the planner (:mod:`emulator.planner.evaluate`): :func:`play` with each action's own
  seconds, from its layers, the link's time for a hop, and the host's;
* the stuck report: when the ranks wait on each other, :class:`ScheduleError` names the
  action each rank is stuck on and what it waits for.
"""

from ...errors import ConfigError
from .actions import dependencies, shape_of


class ScheduleError(ConfigError):
    """A schedule no executor can run: an action missing or repeated, out of order on its
    rank, messages matched in the wrong order, or ranks waiting on each other."""


def simulate(schedule, costs=(1.0, 1.0, 1.0)):
    """Play ``schedule`` with stage costs ``(t_f, t_b, t_w)`` on a free network. Returns
    ``{rank: [(action, start, end), ...]}`` in each rank's order. Raises
    :class:`ScheduleError` if the ranks end up waiting on each other."""
    _, _, v, has_w = shape_of(schedule)
    t_f, t_b, t_w = costs
    dur = {"F": t_f / v, "B": (t_b if has_w else t_b + t_w) / v, "W": t_w / v}
    return play(schedule, [[dur[a.kind] for a in acts] for acts in schedule])


def play(schedule, durations, hop=None, host=None, waits=None):
    """Play each rank's actions, action i of rank r lasting ``durations[r][i]`` seconds, a
    message from rank ``src`` to ``dst`` taking ``hop(src, dst)`` seconds (None: no time),
    ``host[r][i]`` the host's seconds to issue it (None: the host is never behind).
    ``waits``: :func:`waits_of` the schedule, when the caller keeps it. Returns
    ``{rank: [(action, start, end), ...]}``; raises :class:`ScheduleError` if the ranks end
    up waiting on each other."""
    p = len(schedule)
    rows = waits if waits is not None else waits_of(schedule)
    hops = [_Hops(hop, r) for r in range(p)]
    free, nxt = [0.0] * p, [0] * p
    issued = [0.0] * p  # each rank's host: when it has issued its actions so far
    starts = [[] for _ in range(p)]
    ends = [[] for _ in range(p)]
    waiting, ready = [{} for _ in range(p)], list(range(p))  # per rank: action -> the rank blocked on it
    while ready:
        r = ready.pop()
        row, i, t = rows[r], nxt[r], free[r]
        dur, mine, woken_by, seconds = durations[r], ends[r], waiting[r], hops[r]
        hosted = host[r] if host is not None else None
        while i < len(row):
            start = t
            for src, j in row[i]:
                done = ends[src]
                if j >= len(done):
                    waiting[src][j] = r
                    break
                arrives = done[j] + seconds[src]
                if arrives > start:
                    start = arrives
            else:
                starts[r].append(start)
                t = start + dur[i]
                if hosted is not None:
                    issued[r] += hosted[i]
                    t = t if t >= issued[r] else issued[r]
                mine.append(t)
                woken = woken_by.pop(i, None)
                i += 1
                if woken is not None:
                    ready.append(woken)
                continue
            break
        nxt[r], free[r] = i, t
    if any(nxt[r] < len(rows[r]) for r in range(p)):
        raise ScheduleError(_stuck(schedule, nxt))
    return {r: list(zip(schedule[r], starts[r], ends[r])) for r in range(p)}


def rank_end(played):
    """When one rank's played actions (``play(...)[r]``) end: its last one's end, as a rank
    runs its actions one after another (0 where it has none)."""
    return played[-1][2] if played else 0.0


def waits_of(schedule):
    """Per rank, per action: ``((rank, index), ...)``, the actions it waits for
    (:func:`~.actions.dependencies`) as places in the schedule's lists. What it waits for on
    its own rank from earlier in the rank's order is done by the time the rank is free, and
    left out; one that comes later, or nowhere, never comes first (its index is past the end)."""
    p = len(schedule)
    v = 1 + max(a.chunk for acts in schedule for a in acts)
    where = [{} for _ in range(p)]
    for r, acts in enumerate(schedule):
        for i, a in enumerate(acts):
            where[r].setdefault(a, i)
    out = []
    for r, acts in enumerate(schedule):
        row = []
        for i, a in enumerate(acts):
            waits = []
            for src, dep in dependencies(p, v, r, a):
                j = where[src].get(dep, _NEVER)
                if src != r or j > i:
                    waits.append((src, j))
            row.append(tuple(waits))
        out.append(row)
    return out


_NEVER = 1 << 62  # the index of an action a schedule does not hold


class _Hops(dict):
    """Seconds of a message to rank ``dst`` by its sender, worked out on first use (none on one rank)."""

    def __init__(self, hop, dst):
        super().__init__()
        self.hop, self.dst = hop, dst

    def __missing__(self, src):
        seconds = self[src] = 0.0 if (self.hop is None or src == self.dst) else self.hop(src, self.dst)
        return seconds


def _stuck(schedule, nxt):
    p = len(schedule)
    v = 1 + max(a.chunk for acts in schedule for a in acts)
    end = {(r, a) for r in range(p) for a in schedule[r][:nxt[r]]}  # what has run
    lines = ["the ranks wait on each other (a deadlock on a cluster too):"]
    for r in range(p):
        if nxt[r] == len(schedule[r]):
            lines.append(f"  rank {r} has finished")
            continue
        a = schedule[r][nxt[r]]
        waits = [f"{d} on rank {dr}" for dr, d in dependencies(p, v, r, a) if (dr, d) not in end]
        lines.append(f"  rank {r} is stuck on action #{nxt[r]} {a}: it needs {', '.join(waits)}")
    return "\n".join(lines)
