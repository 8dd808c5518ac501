"""Does a schedule make sense, and how long would it take? Answered without running it.

``validate(schedule)`` checks what any executor needs: every micro-batch goes forward and
backward exactly once through every chunk (and through ``W`` once, when the schedule
splits the backward); on a rank, a micro-batch's ``F`` comes before its ``B``, and ``B``
before ``W``; messages between two ranks are sent in the order they are received (NCCL
matches the k-th send from a to b with the k-th receive on b from a: there are no tags);
and the ranks cannot all end up waiting on each other. It raises :class:`ScheduleError`
saying what is wrong.

``simulate(schedule, costs)`` (:mod:`.simulator`) plays the schedule on a free network with
every stage equally fast (``costs = (t_f, t_b, t_w)`` per whole stage, so a chunk's action
takes ``1/v`` of it) and returns when each action starts and ends: :func:`format_grid`
draws it, :func:`bubble_of` reads the bubble its formula predicts.
:func:`emulator.parallel.pipeline.run` measures the same on the emulator, with real models,
FLOPs and messages.
"""

from collections import defaultdict

from .actions import Action, dependencies, destination, shape_of
from .simulator import ScheduleError, simulate


def _check_complete(schedule, p, m, v, has_w):
    kinds = ("F", "B", "W") if has_w else ("F", "B")
    for r, acts in enumerate(schedule):
        seen = defaultdict(int)
        for a in acts:
            seen[a] += 1
        want = {Action(k, mb, c) for k in kinds for mb in range(m) for c in range(v)}
        twice = sorted(str(a) for a, n in seen.items() if n > 1)
        missing = sorted(str(a) for a in want - set(seen))
        extra = sorted(str(a) for a in set(seen) - want)
        if twice or missing or extra:
            parts = [f"{what}: {' '.join(xs[:8])}{' ...' if len(xs) > 8 else ''}"
                     for what, xs in (("repeated", twice), ("missing", missing), ("unexpected", extra)) if xs]
            raise ScheduleError(f"rank {r}: every micro-batch 0..{m - 1} needs {'/'.join(kinds)} exactly once on "
                                f"each of its {v} chunk(s); " + "; ".join(parts))
        pos = {a: i for i, a in enumerate(acts)}
        for a in acts:
            before = {"B": "F", "W": "B"}.get(a.kind)
            if before and pos[Action(before, a.microbatch, a.chunk)] > pos[a]:
                raise ScheduleError(f"rank {r}: {a} comes before {before}{a.microbatch}"
                                    f"{'.' + str(a.chunk) if a.chunk else ''}, which it needs")


def _messages(schedule, p, v):
    """Per (src, dst): the messages in the order src sends them and dst receives them."""
    sent, received = defaultdict(list), defaultdict(list)
    for r, acts in enumerate(schedule):
        for a in acts:
            for src, dep in dependencies(p, v, r, a):
                if src != r:  # a message from src, made by its action dep
                    received[(src, r)].append(dep)
    for r, acts in enumerate(schedule):
        for a in acts:
            dst = destination(p, v, r, a)
            if dst is not None and dst[0] != r:
                sent[(r, dst[0])].append(a)
    return sent, received


def _check_message_order(schedule, p, v):
    sent, received = _messages(schedule, p, v)
    for (src, dst), out in sent.items():
        inn = received.get((src, dst), [])
        for k, (a, b) in enumerate(zip(out, inn)):
            if a != b:
                raise ScheduleError(
                    f"messages from rank {src} to rank {dst} are matched in order (NCCL has no tags: the k-th send "
                    f"meets the k-th receive), but message #{k} is sent after {a} on rank {src} and received for "
                    f"the action that needs {b}'s output on rank {dst}. Reorder one of the two ranks so that both "
                    f"handle their messages in the same order.")


def validate(schedule, p=None, m=None, v=None):
    """Raise :class:`ScheduleError` unless ``schedule`` can run (see the module docstring).
    ``p``, ``m``, ``v``, when given, must be what the schedule holds. Returns
    ``(p, m, v, has_w)``."""
    if not isinstance(schedule, (list, tuple)) or not all(isinstance(r, (list, tuple)) for r in schedule):
        raise ScheduleError(f"a schedule is a list (one per rank) of lists of Action, got {type(schedule).__name__}")
    shape = shape_of(schedule)
    for name, want, got in (("p (ranks)", p, shape[0]), ("m (micro-batches)", m, shape[1]),
                            ("v (chunks)", v, shape[2])):
        if want is not None and want != got:
            raise ScheduleError(f"expected a schedule with {name} = {want}, this one has {got}")
    sp, sm, sv, has_w = shape
    _check_complete(schedule, sp, sm, sv, has_w)
    _check_message_order(schedule, sp, sv)
    simulate(schedule)
    return shape


def bubble_of(timing):
    """Idle share of ``simulate``'s result: 1 - busy / (ranks x makespan)."""
    makespan = max(e for acts in timing.values() for _, _, e in acts)
    busy = sum(e - s for acts in timing.values() for _, s, e in acts)
    return 1 - busy / (len(timing) * makespan)


def in_flight(schedule):
    """Per rank, the most (micro-batch, chunk) pairs whose forward has run and whose
    backward (its ``W``, when the schedule splits it) has not: what it holds at its peak."""
    has_w = shape_of(schedule)[3]
    done = "W" if has_w else "B"
    out = []
    for acts in schedule:
        held = peak = 0
        for a in acts:
            held += (a.kind == "F") - (a.kind == done)
            peak = max(peak, held)
        out.append(peak)
    return out


def format_grid(schedule, costs=(1, 1, 1)):
    """The schedule as text, one row per rank and one column per time slot (a slot is the
    shortest action under ``costs``; equal stages, a free network); ``.`` is idle."""
    timing = simulate(schedule, costs)
    slot = min(e - s for acts in timing.values() for _, s, e in acts)
    width = max(len(str(a)) for acts in schedule for a in acts)
    end = max(e for acts in timing.values() for _, _, e in acts)
    n = int(round(end / slot))
    rows = []
    for r, acts in timing.items():
        cells = ["." * width] * n
        for a, s, e in acts:
            for k in range(int(round(s / slot)), int(round(e / slot))):
                cells[k] = str(a).ljust(width)
        rows.append(f"rank {r}: " + " ".join(cells))
    return "\n".join(rows)
