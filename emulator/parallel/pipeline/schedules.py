"""The schedules, each a function of (p, m[, v]) returning one list of actions per rank.

* **GPipe** (Huang et al. 2019): every forward, then every backward. A stage holds the
  activations of all ``m`` micro-batches before its first backward.
* **1F1B** (PipeDream-Flush, Narayanan et al. 2021; Megatron's default): rank ``r`` runs
  ``p - 1 - r`` warm-up forwards, then alternates one forward and one backward, then
  drains the remaining backwards. The bubble is GPipe's; a stage holds at most ``p - r``
  micro-batches.
* **Interleaved 1F1B** (Narayanan et al. 2021): ``v`` chunks per rank; the micro-batches
  run in rounds, each round through every chunk in turn; the bubble shrinks by ``v`` for
  ``v`` times the point-to-point messages. Rounds as torch's ``ScheduleInterleaved1F1B``
  makes them (torch/distributed/pipelining/schedules.py): ``max(1, m // p)`` rounds of
  ``g = m / rounds`` micro-batches, which must divide ``m``. With ``m`` a multiple of
  ``p`` that is Megatron's order (rounds of ``p``); ``m`` need not be a multiple of ``p``,
  and ``m < p`` is one round of ``m``.
* **ZB-H1** (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): 1F1B's order of
  forwards and input-gradient backwards ``B``; rank ``r`` holds back ``r`` weight-gradient
  passes ``W`` and runs them where 1F1B's rank ``r`` would wait for gradients. Rank ``r``
  then holds ``p - r + r = p`` micro-batches at most: the peak of 1F1B's first stage,
  now on every stage. The backward's critical path carries only ``B``, so the bubble
  shrinks from ``(p-1)(t_f+t_b+t_w)`` to ``(p-1)(t_f+t_b-t_w)``.
"""

from ...accounting.pipeline import interleaved_rounds
from ...errors import ConfigError
from .actions import Action

NAMES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1")


def gpipe(p, m):
    return [[Action("F", i) for i in range(m)] + [Action("B", i) for i in range(m)] for _ in range(p)]


def one_f_one_b(p, m):
    out = []
    for r in range(p):
        warmup = min(p - 1 - r, m)
        acts = [Action("F", i) for i in range(warmup)]
        for i in range(m - warmup):  # steady state: one forward, one backward
            acts += [Action("F", warmup + i), Action("B", i)]
        acts += [Action("B", i) for i in range(m - warmup, m)]  # cooldown
        out.append(acts)
    return out


def interleaved_1f1b(p, m, v):
    """Rounds of ``g`` micro-batches (:func:`interleaved_rounds`): the k-th forward of a
    rank is micro-batch ``(k // (g v)) g + k % g`` on chunk ``(k // g) % v``; backwards the
    same with the chunks reversed. Warm-up: ``2 (p - 1 - r) + (v - 1) g`` forwards (with
    ``g = p``, Megatron's order and warm-up)."""
    total = m * v
    _, g = interleaved_rounds(p, m)

    def forward(k):
        return Action("F", (k // (g * v)) * g + k % g, (k // g) % v)

    def backward(k):
        return Action("B", (k // (g * v)) * g + k % g, v - 1 - (k // g) % v)

    out = []
    for r in range(p):
        warmup = min(2 * (p - 1 - r) + (v - 1) * g, total)  # warm-up
        acts = [forward(k) for k in range(warmup)]
        for k in range(total - warmup):  # steady state
            acts += [forward(warmup + k), backward(k)]
        acts += [backward(k) for k in range(total - warmup, total)]  # cooldown
        out.append(acts)
    return out


def zb_h1(p, m):
    """ZB-H1: 1F1B's forwards and input-gradient backwards, with rank ``r`` running the
    weight-gradient pass of micro-batch ``j`` after the ``B`` of micro-batch ``j + r``; the
    ``r`` passes left over run at the end, where 1F1B's rank would wait."""
    out = []
    for r, acts in enumerate(one_f_one_b(p, m)):
        new, placed = [], 0
        for a in acts:
            new.append(a)
            if a.kind == "B" and a.microbatch >= r:
                new.append(Action("W", a.microbatch - r))
                placed += 1
        out.append(new + [Action("W", j) for j in range(placed, m)])
    return out


def schedule(name, p, m, v=1):
    """The schedule ``name`` ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1") for ``p``
    ranks, ``m`` micro-batches and ``v`` chunks per rank: a list (one per rank) of lists
    of :class:`Action`."""
    for arg, x in (("p", p), ("m", m), ("v", v)):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise ConfigError(f"schedule: {arg} must be a positive integer, got {x!r}")
    if name not in NAMES:
        raise ConfigError(f"schedule: unknown schedule {name!r}; choose one of {', '.join(NAMES)}")
    if name == "interleaved_1f1b":
        if v < 2:
            raise ConfigError(f"schedule: interleaved_1f1b needs v >= 2 chunks per rank, got v={v} "
                              f"(with one chunk it is plain 1f1b)")
        return interleaved_1f1b(p, m, v)
    if v != 1:
        raise ConfigError(f"schedule: {name} has one chunk per rank (v=1), got v={v}; "
                          f"interleaving is interleaved_1f1b")
    return {"gpipe": gpipe, "1f1b": one_f_one_b, "zb_h1": zb_h1}[name](p, m)
