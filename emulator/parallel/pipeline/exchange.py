"""When a pipeline rank posts its messages: one ``batch_isend_irecv`` per time step.

On NCCL a ``batch_isend_irecv`` is one group with one handle: the batches a rank posts on
the pipeline group run one after the other on the group's stream, and each completes
only when all of its sends and receives have (:mod:`emulator.engine.p2p_work`). So a
rank's k-th batch with a neighbour must meet that neighbour's batch of the same moment,
or each waits for a message the other posts only later. Pairing each receive with the
sends of the action before it (what a rank knows by itself) does that for GPipe, 1F1B
and ZB-H1, but not for interleaved 1F1B, whose messages go around the ring of ranks.

The frameworks pair messages by time step instead:

* Megatron-LM's interleaved schedule (``forward_backward_pipelining_with_interleaving`` in
  megatron/core/pipeline_parallel/schedules.py, NVIDIA/Megatron-LM at
  d98e8a64ddf34856e74b24714e3bedb2f5a39553): every rank runs the same sequence of steps
  (a warm-up forward, a steady-state forward and backward, a cool-down backward), and after
  each step one batch sends what the step produced and receives what the neighbours
  produced in that same step (``send_forward_backward_recv_forward_backward`` in the steady
  state; the first rank, ahead of the last by p - 1 steps, receives what the last one sent
  p - 1 steps before: ``recv_tensor_from_previous_stage``). What arrives waits in a queue
  per chunk until its forward or backward runs. ``overlap_p2p_comm`` waits for a batch only
  when its data is needed.
* torch's ``PipelineScheduleMulti._step_microbatches`` (torch/distributed/pipelining/
  schedules.py, torch 2.13): at each time step of the schedule's table, one batch of the
  rank's sends and of the receives of what its neighbours send at that time step.

:func:`program` does the same for any valid schedule: it plays the schedule
(:func:`~emulator.parallel.pipeline.simulator.simulate`, equal stages) and gives every message
the time its producer ends; each rank then posts one batch per such time, in time order,
holding what it sends then and what it receives then, and waits for a batch only before
the action that reads what it brings (and for all of them at the end). Two neighbours post
the two ends of every message in their batches of the same time, and those are posted in
the same order on both ranks, so no rank ever waits for a batch its neighbour has not
reached (whatever the real costs turn out to be), with or without interleaving, for any
``m`` (Megatron refuses ``m < p``; torch builds it).
"""

from collections import defaultdict
from typing import NamedTuple

from .actions import dependencies, destination, shape_of
from .simulator import simulate


class Step(NamedTuple):
    """One step of a rank's program: compute ``actions`` in order, then post one batch
    that sends the outputs of ``sends`` (actions of this step) and receives the inputs of
    ``receives`` (actions of this rank that run later). No batch when both are empty."""

    actions: tuple = ()
    sends: tuple = ()
    receives: tuple = ()

    def __str__(self):
        done = " ".join(map(str, self.actions))
        moved = [f"send {' '.join(map(str, self.sends))}"] if self.sends else []
        moved += [f"recv for {' '.join(map(str, self.receives))}"] if self.receives else []
        return " ".join(filter(None, [done, f"[{', '.join(moved)}]" if moved else ""]))


def program(schedule, costs=None):
    """Each rank's :class:`Step` s for ``schedule`` (a list per rank of them). ``costs``
    (t_f, t_b, t_w): the stage costs the schedule is played with to find the time of each
    message (default: equal forward, input-gradient and weight-gradient passes); any
    costs give a program that runs, the real ones one that waits least."""
    p, _, v, _ = shape_of(schedule)
    if costs is None or min(costs[:2]) <= 0:
        costs = (1.0, 1.0, 1.0)
    timing = simulate(schedule, costs)
    end = {(r, a): e for r, acts in timing.items() for a, _, e in acts}
    out = []
    for r, acts in timing.items():
        arrivals = defaultdict(list)  # time a neighbour sends -> this rank's actions whose input it is
        for a, _, _ in acts:
            for dep in dependencies(p, v, r, a):
                if dep[0] != r:
                    arrivals[end[dep]].append(a)
        times, j, steps, labels = sorted(arrivals), 0, [], []
        for a, _, e in acts:
            while j < len(times) and times[j] < e:  # what arrives before this action ends: posted before it
                t = times[j]
                if labels and labels[-1] == t:  # at the moment the previous action ends: in its batch
                    steps[-1] = steps[-1]._replace(receives=tuple(arrivals[t]))
                else:
                    steps.append(Step(receives=tuple(arrivals[t])))
                    labels.append(t)
                j += 1
            sends = tuple(x for x in (a,) if _sends(p, v, r, x))
            steps.append(Step((a,), sends))
            labels.append(e)
        steps += [Step(receives=tuple(arrivals[t])) for t in times[j:]]
        out.append(steps)
    return out


def local_program(schedule):
    """The pairing a rank can make alone, from its own actions: each receive in one batch
    with the sends of the action before it (Megatron's ``send_forward_recv_backward`` and
    ``send_backward_recv_forward`` without interleaving). Runs GPipe, 1F1B and ZB-H1, whose
    neighbours exchange in step; interleaved 1F1B can leave two neighbours each waiting
    for the other's later batch. Needs no timing, so it also runs (and lets the emulator
    report) a schedule :func:`program` cannot play."""
    p, _, v, _ = shape_of(schedule)
    out = []
    for r, acts in enumerate(schedule):
        needs = [a for a in acts if any(dep[0] != r for dep in dependencies(p, v, r, a))]
        steps = [Step(receives=(acts[0],))] if acts and acts[0] in needs else []
        for a, nxt in zip(acts, list(acts[1:]) + [None]):
            steps.append(Step((a,), tuple(x for x in (a,) if _sends(p, v, r, x)),
                              (nxt,) if nxt is not None and nxt in needs else ()))
        out.append(steps)
    return out


def _sends(p, v, rank, action):
    """Whether ``action``'s output goes to another rank."""
    dst = destination(p, v, rank, action)
    return dst is not None and dst[0] != rank


def format_program(steps):
    """One line per rank: each step's actions and, in brackets, its batch."""
    return "\n".join(f"rank {r}: " + " | ".join(map(str, rank_steps)) for r, rank_steps in enumerate(steps))
