"""The pipeline bubble: how much of a step the stages spend waiting.

With ``p`` stages, ``m`` micro-batches, a forward taking ``t_f`` and a backward ``t_b`` on
every stage, GPipe and 1F1B both need ``(m + p - 1)(t_f + t_b)`` for a step in which each
stage computes for ``m (t_f + t_b)``: the first micro-batch reaches the last stage only
after ``p - 1`` forwards, and the last gradient reaches the first stage ``p - 1``
backwards after the last stage is done. Two ways to state it, both in common use:

* over the **total** time of the step (the share of GPU-time idle):
  ``(p - 1) / (m + p - 1)``;
* over the **ideal** time (what the step would take without a bubble), the overhead
  on top of the work: ``(p - 1) / m``. Problem 8.2 uses this one.

They agree for m >> p and differ for small m: with p = 4, m = 4 the idle share is 3/7
(43%) while the overhead is 3/4 (75%).

Interleaving ``v`` chunks per rank makes each forward and backward ``1/v`` as long while the
ramp still crosses ``p - 1`` ranks, so ``p - 1`` becomes ``(p - 1) / v`` in units of a
whole stage: ``(p - 1) / (v m + p - 1)`` of the total, when ``m >= p``. With fewer
micro-batches than ranks (one round of ``m``), a micro-batch that comes back to rank 0 for
its next chunk finds it idle since its ``m`` forwards: each of the ``v - 1`` returns costs
``p - m`` more chunk-times, so the idle time is ``(p - 1) + (v - 1)(p - m)`` chunk-times
against ``v m`` of work. :func:`emulator.parallel.pipeline.schedule` builds these
schedules and the tests measure them.

Zero bubble (ZB-H1, Qi et al. 2023) splits the backward into ``B`` (input gradient) and
``W`` (weight gradient) and fills the ramp-down with deferred ``W``: each stage idles for
``(p - 1)(t_f + t_b - t_w)`` instead of ``(p - 1)(t_f + t_b + t_w)``; with ``t_f = t_b =
t_w`` that is a third of 1F1B's bubble (for m >= p; with fewer micro-batches there are too
few W passes to fill the ramp, see :func:`pipeline_bubble`).
"""

from ..errors import ConfigError

SCHEDULES = ("gpipe", "1f1b", "interleaved_1f1b", "zb_h1")


def _positive_int(name, x):
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise ConfigError(f"pipeline_bubble: {name} must be a positive integer, got {x!r}")


def pipeline_bubble(p, m, v=1, of="total", schedule=None, costs=(1, 1, 1)):
    """The idle fraction of a pipeline step with ``p`` stages, ``m`` micro-batches and
    ``v`` chunks per rank (interleaving), stages of equal cost and a network that takes
    no time: ``of="total"`` over the step's time ((p-1)/(v m + p-1)), ``of="ideal"`` over
    the compute time alone ((p-1)/(v m)). With ``v > 1`` and ``m < p`` the idle time is
    ``(p-1) + (v-1)(p-m)`` chunk-times instead of ``p-1``; ``m`` must make rounds of equal
    size (:func:`interleaved_rounds`).

    ``schedule="zb_h1"`` gives the zero-bubble schedule's, which depends on the cost of
    forward, input-gradient and weight-gradient passes, ``costs=(t_f, t_b, t_w)``: each
    stage idles (p-1)(t_f + t_b - t_w) against m (t_f + t_b + t_w) of work when m >= p;
    with fewer micro-batches the step is the forward and ``B`` chain, (m+p-1)(t_f+t_b),
    plus the first stage's last ``W``. Holds for t_w <= t_f and t_w <= t_b (measured on
    every schedule with p <= 7; a longer W delays the forwards queued behind it)."""
    _positive_int("p", p)
    _positive_int("m", m)
    _positive_int("v", v)
    if of not in ("total", "ideal"):
        raise ConfigError(f"pipeline_bubble: of must be 'total' (idle share of the step) or 'ideal' (overhead "
                          f"over the compute time), got {of!r}")
    if schedule is not None and schedule not in SCHEDULES:
        raise ConfigError(f"pipeline_bubble: schedule must be one of {SCHEDULES} (or None), got {schedule!r}")
    if schedule == "zb_h1":
        if v != 1:
            raise ConfigError("pipeline_bubble: zb_h1 has one chunk per rank (v=1)")
        t_f, t_b, t_w = costs
        if not (t_f > 0 and t_b > 0 and 0 <= t_w <= min(t_f, t_b)):
            raise ConfigError(f"pipeline_bubble: the zb_h1 formula needs costs=(t_f, t_b, t_w) with t_f, t_b > 0 "
                              f"and 0 <= t_w <= t_f, t_b (a transformer's W is B's matmuls without attention's, "
                              f"and about a forward's); a W longer than a forward delays the forwards queued "
                              f"behind it and the schedule idles more. Got {costs!r}")
        work = m * (t_f + t_b + t_w)
        # the W passes fill the ramp-down, unless there are too few micro-batches to fill it:
        # then the forward and input-gradient chain, plus the first stage's last W, is the step
        step = max(work + (p - 1) * (t_f + t_b - t_w), (m + p - 1) * (t_f + t_b) + t_w)
        idle = step - work
    else:
        if schedule in ("gpipe", "1f1b") and v != 1:
            raise ConfigError(f"pipeline_bubble: {schedule} has one chunk per rank; use interleaved_1f1b for v > 1")
        if v > 1:
            interleaved_rounds(p, m)  # only the schedules that exist
        idle, work = (p - 1) + (v - 1) * max(0, p - m), v * m  # in chunk-times
    return idle / work if of == "ideal" else idle / (work + idle)


def interleaved_rounds(p, m):
    """(rounds, micro-batches per round) of interleaved 1F1B, as torch's
    ``ScheduleInterleaved1F1B`` (``number_of_rounds = max(1, m // p)``); raises
    :class:`ConfigError` when the rounds cannot be of equal size."""
    rounds = max(1, m // p)
    if m % rounds:
        near = sorted({k for k in range(max(1, m - p), m + p + 1) if k % max(1, k // p) == 0},
                      key=lambda k: (abs(k - m), k))[:2]
        raise ConfigError(f"interleaved_1f1b runs the micro-batches in max(1, m // p) rounds of equal size, the "
                          f"order torch's ScheduleInterleaved1F1B builds (its warm-up is sized for one round); "
                          f"m={m} with p={p} makes {rounds} rounds, which do not divide {m}: try m = "
                          f"{' or '.join(map(str, sorted(near)))}")
    return rounds, m // rounds


def micro_batches_for_bubble(p, target, of="total"):
    """The fewest micro-batches that keep the bubble of GPipe or 1F1B with ``p`` stages at
    or under ``target`` (a fraction), by either definition (Problem 8.2)."""
    _positive_int("p", p)
    if not 0 < target < 1:
        raise ConfigError(f"micro_batches_for_bubble: target must be a fraction in (0, 1), got {target!r}")
    if of not in ("total", "ideal"):
        raise ConfigError(f"micro_batches_for_bubble: of must be 'total' or 'ideal', got {of!r}")
    # total: (p-1)/(m+p-1) <= target  <=>  m >= (p-1)(1-target)/target; ideal: m >= (p-1)/target
    bound = (p - 1) * (1 - target) / target if of == "total" else (p - 1) / target
    m = max(1, int(bound))
    while pipeline_bubble(p, m, of=of) > target + 1e-12:
        m += 1
    while m > 1 and pipeline_bubble(p, m - 1, of=of) <= target + 1e-12:
        m -= 1
    return m


def peak_in_flight(schedule, p, m, rank):
    """Micro-batches whose activations stage ``rank`` holds at once at its peak: GPipe all
    ``m``; 1F1B ``p - rank``; ZB-H1 ``p`` (1F1B's plus ``rank`` waiting for their W); never
    more than ``m``."""
    if schedule not in ("gpipe", "1f1b", "zb_h1"):
        raise ConfigError(f"peak_in_flight: known for 'gpipe', '1f1b' and 'zb_h1', got {schedule!r}")
    _positive_int("p", p)
    _positive_int("m", m)
    if not (isinstance(rank, int) and 0 <= rank < p):
        raise ConfigError(f"peak_in_flight: rank must be in 0..{p - 1}, got {rank!r}")
    return m if schedule == "gpipe" else min(p - rank if schedule == "1f1b" else p, m)


def bubble_micro_batches(p, target, seqs_per_micro):
    """(the fewest micro-batches for a bubble of ``target`` over the ideal time, the
    sequences they hold at ``seqs_per_micro`` each, the fewest for an idle share of
    ``target`` of the whole step)."""
    m = micro_batches_for_bubble(p, target, of="ideal")
    return m, m * seqs_per_micro, micro_batches_for_bubble(p, target, of="total")


def memory_vs_bubble(p, per_micro_batch, budget, max_m):
    """(m, bubble) for GPipe, then for 1F1B, when the first of ``p`` stages can spend
    ``budget`` bytes on activations, a micro-batch costs it ``per_micro_batch`` and the
    batch allows at most ``max_m``: GPipe holds all m at once, 1F1B at most p (so any m,
    once p fit)."""
    m_gpipe = min(int(budget // per_micro_batch), max_m)
    m_1f1b = max_m if p * per_micro_batch <= budget else m_gpipe
    return (m_gpipe, pipeline_bubble(p, m_gpipe), m_1f1b, pipeline_bubble(p, m_1f1b))
