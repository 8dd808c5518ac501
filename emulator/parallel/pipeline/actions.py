"""A pipeline schedule as data: for every rank, the ordered list of what it computes.

An :class:`Action` is ``Action(kind, microbatch, chunk=0)``:

* ``"F"``: the forward of ``microbatch`` through the rank's model chunk ``chunk``;
* ``"B"``: its backward. In a schedule that also has ``"W"`` actions, ``"B"`` computes
  only the input gradient (what the previous stage waits for) and ``"W"`` the weight
  gradient, which can wait (zero-bubble schedules put it in the gaps).

A schedule is a list with one list of actions per rank. With ``v`` chunks per rank,
chunk ``c`` of rank ``r`` is virtual stage ``c * p + r`` of ``p * v`` (Megatron's
interleaving: rank 0 holds stages 0 and p, rank 1 stages 1 and p + 1, ...).

``format_schedule`` prints it compactly (``F0 F1 B0 F2 B1 ...``; ``F3.1`` is micro-batch 3
on chunk 1) and ``parse`` reads that back, so a schedule can be written by hand.

The neighbour rule lives here, once: an ``F`` takes its input from the virtual stage before
(:func:`source`) and sends its output to the stage after (:func:`destination`), a ``B`` the
other way, a ``W`` neither; :func:`dependencies` adds what an action waits for on its own
rank (``B`` its forward, ``W`` its ``B``). Validation, the simulator, each rank's program,
the stage, the executor and the planner all ask these three.
"""

import re
from typing import NamedTuple

from ...errors import ConfigError

KINDS = ("F", "B", "W")


class Action(NamedTuple):
    kind: str
    microbatch: int
    chunk: int = 0

    def __str__(self):
        return f"{self.kind}{self.microbatch}" + (f".{self.chunk}" if self.chunk else "")

    def __repr__(self):
        return str(self)


_TOKEN = re.compile(r"^([FBW])(\d+)(?:\.(\d+))?$")


def parse(text):
    """One rank's actions from ``"F0 F1 B0 B1"`` (``F3.1``: chunk 1), or a schedule from
    several lines (one per rank)."""
    lines = [ln for ln in str(text).strip().splitlines() if ln.strip()]
    if len(lines) > 1:
        return [parse(ln) for ln in lines]
    out = []
    for token in (lines[0].split() if lines else []):
        match = _TOKEN.match(token)
        if not match:
            raise ConfigError(f"parse: {token!r} is not an action; write F, B or W, the micro-batch, and "
                              f"optionally .chunk, e.g. F3 or B2.1")
        out.append(Action(match[1], int(match[2]), int(match[3] or 0)))
    return out


def format_schedule(schedule):
    """One line per rank: ``rank 0: F0 F1 F2 B0 ...``."""
    return "\n".join(f"rank {r}: " + " ".join(map(str, acts)) for r, acts in enumerate(schedule))


def shape_of(schedule):
    """(p, m, v, has_w) of a schedule, read from its actions."""
    p = len(schedule)
    acts = [a for rank in schedule for a in rank]
    if p == 0 or not acts:
        raise ConfigError("a schedule needs at least one rank and one action")
    for a in acts:
        if not isinstance(a, Action) or a.kind not in KINDS or a.microbatch < 0 or a.chunk < 0:
            raise ConfigError(f"a schedule holds Action(kind in F/B/W, microbatch >= 0, chunk >= 0); got {a!r}")
    m = 1 + max(a.microbatch for a in acts)
    v = 1 + max(a.chunk for a in acts)
    return p, m, v, any(a.kind == "W" for a in acts)


def stage_of(p, rank, chunk):
    """The virtual stage of ``chunk`` on ``rank``: ``chunk * p + rank``."""
    return chunk * p + rank


def place_of(p, stage):
    """(rank, chunk) holding virtual stage ``stage``."""
    return stage % p, stage // p


# ----------------------------------------------------------------- the neighbour rule
def source(p, v, rank, action):
    """(rank, chunk) whose output is ``action``'s input: the stage before for ``F``, the
    stage after for ``B``; None for the first stage's forward, the last stage's backward and
    ``W`` (its inputs are its own rank's)."""
    s = stage_of(p, rank, action.chunk)
    if action.kind == "F" and s > 0:
        return place_of(p, s - 1)
    if action.kind == "B" and s < p * v - 1:
        return place_of(p, s + 1)
    return None


def destination(p, v, rank, action):
    """(rank, chunk) that takes ``action``'s output as its input, or None (the last stage's
    forward ends in the loss, the first stage's backward in the embedding, ``W`` sends
    nothing)."""
    s = stage_of(p, rank, action.chunk)
    if action.kind == "F" and s < p * v - 1:
        return place_of(p, s + 1)
    if action.kind == "B" and s > 0:
        return place_of(p, s - 1)
    return None


def dependencies(p, v, rank, action):
    """What ``action`` on ``rank`` waits for from other work: a list of ``(rank, Action)``:
    on its own rank the forward a ``B`` needs (its cached activations) and the ``B`` a ``W``
    needs (its output gradients), and the neighbour's action whose message it needs
    (:func:`source`)."""
    kind, mb, chunk = action
    src = source(p, v, rank, action)
    sent = [] if src is None else [(src[0], Action(kind, mb, src[1]))]
    if kind == "F":
        return sent
    if kind == "B":
        return [(rank, Action("F", mb, chunk))] + sent
    return [(rank, Action("B", mb, chunk))]
