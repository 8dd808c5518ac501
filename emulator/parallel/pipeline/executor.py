"""One executor for every schedule: each rank runs its program, step by step.

A schedule says what each rank computes; :func:`~.exchange.program` adds when its
messages go: per rank a list of steps, each some actions to compute and then one
``batch_isend_irecv`` (the outputs to send on, and the receives of what the neighbours
send at that moment). For each action the rank waits for the batch that brought its
input (if another rank produces it), computes, and frees a micro-batch's activations once
its backward is done. On NCCL, as here, a batch has one handle and the batches on the
pipeline group run one after the other: :mod:`~.exchange` says why its pairing never
leaves two neighbours waiting on each other (GPipe, 1F1B, ZB-H1 and interleaved 1F1B, for
every m).

``run(world, model, params, schedule, x, y)`` runs one step of ``schedule`` on a world of
``p`` ranks and reports, if the ranks end up waiting on each other, the action each one
is stuck on. :func:`train_step` is one training step, every run's: the program, then the
stage's hooks reduce, clip and apply. ``train_pipeline`` trains with it, adding data
parallelism and the optimizer: a mesh with axes ``dp`` and ``pp``, gradients all-reduced
over ``dp`` once a stage's backwards are done.
"""

from dataclasses import dataclass

import numpy as np

from ...errors import ConfigError, DeadlockError
from ...algorithms.p2p_op import P2POp
from ...nn.module import sub
from ..batches import local_batch, split_batch
from ..data_parallel.flat_layout import reduce_flat
from .actions import shape_of
from .check import ScheduleError, validate
from .exchange import local_program, program
from .partition import ReplicatedParams, chunk_layers
from .stage import PipelineStage


def micro_batches(x, y, m):
    """``m`` equal micro-batches of the batch ``(x, y)``: (their inputs, their targets)."""
    parts = split_batch(x, y, m, "micro-batches")
    return [p[0] for p in parts], [p[1] for p in parts]


def run_actions(comm, stage, steps, micro_x, micro_y, scale=None):
    """This rank's part of one pipeline step: its program ``steps`` (:func:`.exchange.program`
    of the schedule, this rank's list), the loss of each micro-batch scaled by ``scale``
    (default ``1/m``: the step's loss is the micro-batches' mean). Each step computes its
    actions, then posts one batch: its sends and the receives of what arrives then. A
    batch is waited for before the action that reads what it brings, and every one at
    the end. Returns the losses of the micro-batches (on the last stage; else an empty
    dict)."""
    m = len(micro_x)
    scale = 1.0 / m if scale is None else scale
    stage.micro_batches = m
    local, arriving, works = {}, {}, []  # hand-offs between chunks of this rank; action -> (buffer, its batch)
    boundary = None  # shape and dtype of what arrives, once something does
    for step in steps:
        out_of = {}
        for a in step.actions:
            src, dst = stage.source(a), stage.destination(a)
            if src is None:
                inbound = None
            elif src[0] == comm.rank:
                inbound = local.pop((a.kind, a.microbatch, a.chunk))
            else:
                buffer, batch = arriving.pop(a)
                for work in batch:  # the batch that brings it (one handle on NCCL)
                    work.wait()
                inbound = buffer
            out_of[a] = _compute(stage, a, inbound, micro_x, micro_y, scale)
            if dst is not None and dst[0] == comm.rank:
                local[(a.kind, a.microbatch, dst[1])] = out_of[a]
        if step.receives:
            boundary = boundary or stage.boundary(micro_x[0])
        buffers = {a: np.empty_like(micro_x[0], shape=boundary[0], dtype=boundary[1]) for a in step.receives}
        ops = [P2POp(comm.isend, out_of[a], stage.destination(a)[0]) for a in step.sends]
        ops += [P2POp(comm.irecv, buffers[a], stage.source(a)[0]) for a in step.receives]
        if ops:
            batch = comm.batch_isend_irecv(ops)
            works += batch
            arriving.update({a: (buffers[a], batch) for a in step.receives})
    for work in works:
        work.wait()
    return stage.losses


def _compute(stage, a, inbound, micro_x, micro_y, scale):
    """One action on its input; returns what it sends on (None for ``W``)."""
    if a.kind == "F":
        out = stage.forward(a, micro_x[a.microbatch] if stage.is_first(a.chunk) else inbound, micro_y[a.microbatch])
    elif a.kind == "B":
        out = stage.backward(a, inbound, scale=scale)
    else:
        stage.backward_weight(a)
        out = None
    if stage.finishes_backward(a):
        stage.free(a)
    return out


def blocking_loop(comm, stage, steps, micro_x, micro_y):
    """The naive loop lesson 03 provokes a deadlock with: the program's actions in order,
    a blocking ``recv`` before each and a blocking ``send`` right after it. Right for
    GPipe; under 1F1B two neighbours send to each other at once and neither ever receives
    (as on NCCL)."""
    for a in (a for step in steps for a in step.actions):
        src = stage.source(a)
        inbound = comm.recv(src[0]) if src else None
        if a.kind == "F":
            out = stage.forward(a, micro_x[a.microbatch] if stage.is_first(a.chunk) else inbound,
                                micro_y[a.microbatch])
        else:
            out = stage.backward(a, inbound, scale=1 / len(micro_x))
            stage.free(a)
        dst = stage.destination(a)
        if dst:
            comm.send(out, dst[0])  # waits until the neighbour posts its receive
    return stage.losses


@dataclass
class PipelineRun:
    """One step of a schedule on the emulator: the world (its timeline, trace, ledgers),
    each rank's :class:`PipelineStage`, and the step's mean loss."""

    world: object
    stages: list
    loss: float

    @property
    def bubble(self):
        """Measured idle share of the step: 1 - compute / (ranks x makespan)."""
        return self.world.timeline().idle_fraction()

    def peak_activations(self):
        """Peak bytes of activations each rank held."""
        return [led.peak_by_kind["activations"] for led in self.world.memory]

    def peak_micro_batches(self):
        """Each rank's peak of activations in micro-batches (one micro-batch: what the
        forward of micro-batch 0 on chunk 0 held)."""
        return [led.peak_by_kind["activations"] / s.micro_batch_bytes[0]
                for led, s in zip(self.world.memory, self.stages)]

    def grads(self):
        """The gradients of the whole model, gathered from every stage."""
        return {f"{n}.{k}": v for s in self.stages for n, g in s.grads.items() for k, v in g.items()}


def _stuck_report(exc, schedule, stages):
    lines = [str(exc).splitlines()[0], "where each rank is in its schedule:"]
    for r, acts in enumerate(schedule):
        n = len(stages[r].done) if stages[r] is not None else 0
        done = " ".join(map(str, acts[:n])) or "nothing"
        if n == len(acts):
            lines.append(f"  rank {r}: computed all {n} actions, then waits (in a send, or at the end)")
        else:
            lines.append(f"  rank {r}: computed {done}; its next action is #{n} {acts[n]}")
    lines.append("what each rank waits in:")
    lines += str(exc).splitlines()[1:]
    return "\n".join(lines)


def run(world, model, params, schedule, x, y, costs=None, loop=None, check=True):
    """One step of ``schedule`` (a list per rank of actions) on ``world`` (one rank per
    pipeline stage) for the batch ``(x, y)``. ``costs=(t_f, t_b, t_w)`` charges fixed
    seconds per stage instead of FLOPs; ``loop`` replaces :func:`run_actions` (same
    arguments: each rank gets its part of :func:`.exchange.program`); ``check=False`` runs
    a schedule without validating it first. Returns a :class:`PipelineRun`."""
    p, m, v, split = shape_of(schedule)
    if world.size != p:
        raise ConfigError(f"the schedule has {p} ranks, the world {world.size}")
    if check:
        validate(schedule)
    micro_x, micro_y = micro_batches(x, y, m)
    stages = [None] * p
    loop = loop or run_actions
    try:
        steps = program(schedule, costs)
    except ScheduleError:  # a schedule that cannot be played (check=False): let the emulator say where it stops
        steps = local_program(schedule)

    def rank_program(comm):
        stages[comm.rank] = PipelineStage(comm, model, params, v=v, split=split, costs=costs)
        return loop(comm, stages[comm.rank], steps[comm.rank], micro_x, micro_y)

    try:
        results = world.run(rank_program)
    except DeadlockError as exc:
        raise DeadlockError(_stuck_report(exc, schedule, stages)) from None
    losses = results[stages[-1].rank] if stages[-1] is not None else {}
    return PipelineRun(world, stages, float(np.mean([losses[i] for i in sorted(losses)])) if losses else None)


def sync_dp_grads(dp, grads):
    """Average a stage's gradients (``{"layer.key": array}``) over its data-parallel group
    ``dp``: flattened into one buffer, one all-reduce (one bucket per stage)."""
    reduced = reduce_flat(dp, grads)
    return {k: reduced[k] / dp.size for k in sorted(grads)}


def train_step(comm, stage, steps, micro_x, micro_y, scale=None, loop=None):
    """One training step of this rank, the same in every run (:func:`train_pipeline`,
    :func:`emulator.training.train`, :func:`emulator.parallel.runtime.run_on_mesh`): its
    program of the schedule (``loop``, default :func:`run_actions`, with the losses scaled by
    ``scale``), then the stage's hooks finish the step (``hooks.step()``: reduce the
    gradients, clip them where the run does, apply the optimizer), and the stage is cleared
    for the next batch. Returns the micro-batches' losses (on the last stage)."""
    loop = loop or run_actions
    losses = loop(comm, stage, steps, micro_x, micro_y) if scale is None else \
        loop(comm, stage, steps, micro_x, micro_y, scale=scale)
    stage.hooks.step()
    stage.losses, stage.done = {}, []
    return losses


def train_pipeline(comm, model, params, batches, schedule, opt, costs=None, sync=sync_dp_grads, loop=None):
    """Train on ``batches`` with pipeline parallelism along the mesh axis ``pp`` (or the
    whole world) and, if the mesh has a ``dp`` axis, data parallelism along it: each dp
    replica runs its slice of every batch through ``schedule``; once a stage's last
    backward is done, ``sync(dp_group, grads)`` averages its gradients over its dp group,
    and it steps its own optimizer (:class:`~.partition.ReplicatedParams`, the stage's hooks;
    each step is :func:`train_step`). Returns ``(this stage's parameters, losses per step
    on the last stage, else None)``."""
    axes = comm.mesh.axes if comm.mesh is not None else ()
    pp = comm.group("pp") if "pp" in axes else comm
    dp = comm.group("dp") if "dp" in axes else None
    p, m, v, split = shape_of(schedule)
    if pp.size != p:
        raise ConfigError(f"the schedule has {p} ranks, the pipeline group {pp.size}")
    mine = [n for chunk in chunk_layers(model, p, pp.rank, v) for n in chunk]
    hooks = ReplicatedParams(pp.memory, {n: sub(params, n) for n in mine}, opt, dp, sync, comm=pp)
    stage = PipelineStage(pp, model, v=v, split=split, costs=costs, hooks=hooks)
    steps = program(schedule, costs)[pp.rank]
    losses = []
    for x, y in batches:
        if dp is not None:
            x, y = local_batch(dp, x, y)
        micro_x, micro_y = micro_batches(x, y, m)
        step_losses = train_step(pp, stage, steps, micro_x, micro_y, loop=loop)
        losses.append(float(np.mean(list(step_losses.values()))) if step_losses else None)
    return hooks.flat_params(), losses
