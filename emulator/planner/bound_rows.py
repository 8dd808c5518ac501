"""What the step and memory bounds (:mod:`.bounds`) read of a pipeline schedule, in layer
counts: each rank's layers per chunk, what it holds and keeps before its first backward,
the chains of stages its first forward waits for, and which ranks end on a backward of
chunk 0. Functions of the schedule's name, p, m, v and the number of blocks, cached."""

from functools import lru_cache

from ..parallel.pipeline.actions import stage_of
from .layers import split_names
from .memory import _actions, walked_micro_batches


@lru_cache(maxsize=4096)
def chunk_counts(n_layers, p, v):
    """``[rank][chunk] -> (embeds, blocks, heads)``: the layers of each of a rank's chunks."""
    names = split_names(n_layers, p * v)
    out = []
    for r in range(p):
        row = []
        for c in range(v):
            stage = names[stage_of(p, r, c)]
            e, h = stage.count("embed"), stage.count("head")
            row.append((e, len(stage) - e - h, h))
        out.append(tuple(row))
    return tuple(out)


@lru_cache(maxsize=4096)
def _memory_rows(name, p, m, v, n_layers):
    """For the memory bound of every rank: ``(layers held, layers' activations kept)`` as
    3-vectors of (embeds, blocks, heads), the second summed over the forwards a rank runs
    before its first backward (the walk :func:`~emulator.planner.memory.stage_peaks`
    takes: GPipe all m, the others their first ``walked_micro_batches(p)``); rows that
    another row bounds in both are dropped."""
    counts = chunk_counts(n_layers, p, v)
    if name == "gpipe":
        before = [[m] * v for _ in range(p)]
    else:
        acts = _actions(name, p, min(m, walked_micro_batches(p)), v)
        before = []
        for r in range(p):
            row = [0] * v
            for kind, c in acts[r]:
                if kind != "F":
                    break
                row[c] += 1
            before.append(row)
    rows = set()
    for r in range(p):
        held = tuple(sum(counts[r][c][k] for c in range(v)) for k in range(3))
        kept = tuple(sum(before[r][c] * counts[r][c][k] for c in range(v)) for k in range(3))
        rows.add(held + kept)
    return tuple(x for x in rows if not any(y != x and all(a <= b for a, b in zip(x, y)) for y in rows))


@lru_cache(maxsize=4096)
def _time_rows(p, v, n_layers):
    """Per rank: (its layers over every chunk, the layers of stages 0..r-1 of chunk 0 that
    its first forward waits for, the layers of its chunk-0 stage) as 3-vectors."""
    counts = chunk_counts(n_layers, p, v)
    out, chain = [], (0, 0, 0)
    for r in range(p):
        held = tuple(sum(counts[r][c][k] for c in range(v)) for k in range(3))
        out.append((held, chain, counts[r][0]))
        chain = tuple(a + b for a, b in zip(chain, counts[r][0]))
    return tuple(out)


@lru_cache(maxsize=4096)
def _time_classes(p, v, n_layers):
    """:func:`_time_rows` for stages timed alike: per distinct set of layers a rank holds,
    the longest chain of its ranks (the last: chains only grow with r); and (rank 0's
    layers, the last rank's, the chain of stages 0..p-2)."""
    rows = _time_rows(p, v, n_layers)
    last = {}
    for held, chain, _ in rows:
        last[held] = chain
    return tuple(last.items()), (rows[0][0], rows[-1][0], rows[-1][1])


@lru_cache(maxsize=4096)
def _last_rank_of(p, v, n_layers):
    """Per distinct set of layers a rank holds, the last rank holding it (whose chain
    :func:`_time_classes` gives)."""
    return {held: r for r, (held, _, _) in enumerate(_time_rows(p, v, n_layers))}


@lru_cache(maxsize=4096)
def _backward_classes(name, p, v, n_layers):
    """Rule 2 for every rank: per distinct set of layers held by a rank whose last action
    is a backward of chunk 0, the longest chain of stages 0..r-1 of chunk 0 among those
    ranks. Each rank's last action does not depend on the number of micro-batches
    (``tests/test_planner_bounds.py`` holds every schedule to that): it is read from
    ``(v + 1) p`` of them."""
    acts = _actions(name, p, (v + 1) * p, v)
    longest = {}
    for r, (held, chain, _) in enumerate(_time_rows(p, v, n_layers)):
        if acts[r][-1] == ("B", 0):
            longest[held] = chain  # chains only grow with r
    return tuple(longest.items())


@lru_cache(maxsize=64)
def _ends_with_backward(name, p, v):
    """Whether the last rank's last action is a backward (its chain runs back to stage 0)."""
    return _actions(name, p, (v + 1) * p, v)[p - 1][-1][0] == "B"
