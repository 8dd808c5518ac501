"""``run_on_mesh``: an ``nn.GPT`` trained on a mesh described by a
:class:`~emulator.parallel.dims.ParallelDims`, every strategy composed, checked against
:func:`emulator.training.train_single`.

Each rank runs one program, whatever the dims:

1. its groups (``tp``, ``cp``, ``pp``; ``dp x cp`` for dense gradients; ``ep`` and ``edp``
   for experts) and its :class:`~emulator.parallel.mesh_model.RankModel`;
2. its pipeline stage's layers (a run without pipelining is a one-stage pipeline), their
   parameters cut from the full ones by placement;
3. data parallelism as hooks of the stage (:class:`MeshHooks`): the stage's parameters
   split into *units* by the group their gradients are reduced over (a block's dense
   weights over ``dp x cp``, its experts over ``edp``), one strategy per group (DDP or
   ZeRO-1/2/3, on the units of that group), the gradients of parameters that are partial
   over ``tp`` (norms under sequence parallelism) summed over ``tp`` first;
4. per batch: this replica's slice of the batch, its micro-batches, each cut along the
   sequence for ``cp``; the schedule's program (its actions, and a batch of messages per
   time step); the loss scaled once, by ``1/(dp cp m)``
   (the auxiliary losses by ``1/(dp m)``: they are one number per token group); then
   reduce, clip by the global norm (every parameter counted once), apply.

At the end the full parameters are put back together from every rank's (``unshard``), so
``run.params`` compares with the single-device run:
``run_on_mesh(model, params, batches, dims, opt)`` equals
``train_single(model, params, batches, opt, micro_batches=dims.dp * dims.micro_batches)``.

``checkpoint_dir=path`` saves a sharded checkpoint after the last step (or as a
:class:`~emulator.parallel.checkpoint.Checkpointing` says), each save complete on disk as
soon as its last shard is; it refuses a folder holding saves it did not make.
``resume_from=path`` starts from the latest complete one instead of ``params``, on any
valid mesh, and refuses another model, optimizer or precision than the save's unless
``allow_changes`` names the change (:mod:`emulator.parallel.checkpoint`); ``faults=``
are the World's (:mod:`emulator.engine.faults`).

``shape_only=True`` runs the same programs on arrays without values
(:mod:`emulator.arrays.shape_only`): ``params`` may be None, ``batches`` may be
:func:`shape_only_batches`; the trace, the ledgers and the timeline are what the data run
would give (a router routes evenly), and ``run.params`` is None.
"""

import numpy as np

from ..arrays.shape_only import ShapeArray, is_shape_only, shape_only_params
from ..engine.faults import DEFAULT_WATCHDOG_TIMEOUT
from ..engine.world import World
from ..errors import ConfigError, RankFailedError
from ..machine.precision import precision_preset
from ..machine.stack import stack_preset
from ..machine.topology import Topology
from ..mesh import DP_CP, EDP, EP, TP_PP
from ..nn.clip import clip_coefficient
from .batches import split_batch
from .checkpoint import Checkpoint, Restart, Saver, TrainState
from .checkpoint.fit import run_record
from .context_parallel.layout import split_sequence
from .data_parallel.finalize import MeshHooks
from .mesh_model import RankModel, check_model
from .mesh_run import MeshRun
from .pipeline import PipelineStage, schedule, split_layers, train_step
from .pipeline.actions import stage_of
from .pipeline.exchange import program as exchange_program
from .placement import shard, unshard
from .run_inputs import check_batches, check_dims, check_fold, check_optimizer


def groups(comm, dims):
    """This rank's Comm objects: tp, cp, pp, dp, ``dp,cp`` and the expert groups."""
    ranks = dims.groups_of(comm.global_rank, comm.mesh.gpus_per_node)
    out = {a: comm.group(a) for a in ("tp", "cp", "pp", "dp")}
    out[DP_CP], out[TP_PP] = comm.group(*DP_CP.axes), comm.group(*TP_PP.axes)
    out[EP] = comm.new_group(ranks[EP] if dims.ep > 1 else [comm.global_rank], label=EP)
    out[EDP] = comm.new_group(ranks[EDP], label=EDP)
    return out


def _micro_inputs(x, y, dims, coords):
    """This rank's micro-batches: its replica's slice, cut into micro-batches, each cut
    along the sequence for its cp rank."""
    xd, yd = split_batch(x, y, dims.dp, "data-parallel replicas")[coords["dp"]]
    parts = split_batch(xd, yd, dims.micro_batches, "micro-batches")
    if dims.cp == 1:
        return [p[0] for p in parts], [p[1] for p in parts]
    if is_shape_only(x):  # the shard's shape: (b, s / cp)
        cut = lambda a: ShapeArray((a.shape[0], a.shape[1] // dims.cp), a.dtype)  # noqa: E731
    else:
        cut = lambda a: split_sequence(a, dims.cp, dims.cp_layout, dim=1)[coords["cp"]]  # noqa: E731
    return [cut(p[0]) for p in parts], [cut(p[1]) for p in parts]


def shape_only_batches(steps, batch, seq):
    """``steps`` global batches of ``batch`` sequences of ``seq`` token ids, without values."""
    x = ShapeArray((batch, seq), np.int64)
    return [(x, x)] * steps


def run_on_mesh(model, params, batches, dims, optimizer, topology=None, clip_grad_norm=None, shape_only=False,
                fold=None, checkpoint_dir=None, resume_from=None, faults=(), watchdog_timeout=DEFAULT_WATCHDOG_TIMEOUT,
                stack=None, precision=None, allow_changes=None):
    """Train ``model`` (an ``nn.GPT``) from ``params`` on ``batches`` with the parallelism
    ``dims``; returns a :class:`MeshRun`. ``fold`` (shape-only runs; default ``("dp",
    "tp")``): mesh axes whose ranks all do the same, run once per set (see
    :class:`~emulator.engine.world.World`); the groups that cross them are charged for
    every rank on the real topology. ``checkpoint_dir``: a folder (or a ``Checkpointing``)
    to save into; ``resume_from``: a checkpoint (or its folder) to start from, with
    ``params=None``; ``allow_changes``: the settings that may differ from the
    checkpoint's (names such as ``{"lr", "precision"}``, :mod:`~emulator.parallel.checkpoint.fit`);
    ``faults``, ``watchdog_timeout``: as ``World``'s. ``stack``: the software stack the step
    is timed as (a name or a Stack; None: ``"megatron-core"``); ``precision``: the policy its
    numbers are kept and sent in (None: the stack's for a bf16 model; a float32 or float64
    model keeps every number as its arrays hold it, so the run stays exact)."""
    check_model(model)
    check_dims(dims)
    check_optimizer(optimizer)
    check_batches(batches, model.vocab)
    fold = check_fold(fold, dims)
    stack, precision = run_precision(model, stack, precision)
    restart = _restart(model, params, optimizer, resume_from, shape_only, allow_changes, precision)
    if shape_only and checkpoint_dir is not None:
        raise ConfigError("checkpoint_dir= needs data: a shape-only run has none to save")
    if shape_only:
        params = shape_only_params(model) if params is None else {k: ShapeArray(v.shape, v.dtype)
                                                                   for k, v in params.items()}
        batches = [tuple(a if is_shape_only(a) else ShapeArray(np.shape(a), np.int64) for a in b) for b in batches]
    elif params is None and restart is None:
        raise ConfigError("run_on_mesh needs the model's params (or shape_only=True, or resume_from=)")
    x0 = batches[0][0]
    dims.validate(model, seq_len=np.shape(x0)[1], batch=np.shape(x0)[0])
    topology = topology or Topology()
    if fold is None:
        fold = ("dp", "tp") if shape_only else ()
    if fold and not shape_only:
        raise ConfigError("fold= needs shape_only=True: folded ranks have no data of their own")
    world = World(mesh=dims.mesh(topology.gpus_per_node), topology=topology, fold=fold, faults=faults,
                  watchdog_timeout=watchdog_timeout, stack=stack, precision=precision)
    first_step = restart.checkpoint.step if restart is not None else 0
    runs = split_layers(model, dims.stages)
    actions = schedule(dims.schedule, dims.pp, dims.micro_batches, dims.v)
    split = any(a.kind == "W" for acts in actions for a in acts)
    steps = exchange_program(actions)  # when each rank's messages go (one batch per time step)
    if clip_grad_norm is not None:
        clip_coefficient(1.0, clip_grad_norm)  # checks it

    saver = None
    if checkpoint_dir is not None:  # last before the ranks run: it may delete saves (overwrite=True)
        dtypes = {k: v.dtype for k, v in (params or shape_only_params(model)).items()}
        saver = Saver(checkpoint_dir, dims.world_size, run_record(model, optimizer, dtypes, precision), first_step,
                      restart.checkpoint.path if restart is not None else None)

    def program(comm):
        comms = groups(comm, dims)
        coords = comm.coords()
        rank_model = RankModel(model, dims, comms)
        mine = [n for c in range(dims.v) for n in runs[stage_of(dims.pp, coords["pp"], c)]]
        placements = rank_model.placements(mine)
        where = (placements, rank_model.coords(), rank_model.sizes())
        local = restart.params(comm, *where) if restart is not None else shard(params, *where)
        hooks = MeshHooks(comms, mine, local, placements, dims, optimizer, comms["tp"], clip_grad_norm)
        if restart is not None:
            restart.optimizer(comm, hooks, *where)
        train = TrainState(restart.checkpoint if restart is not None else None)
        stage = PipelineStage(comms["pp"], rank_model, v=dims.v, split=split, hooks=hooks,
                              recompute="full" if dims.recompute == "full" else "none", aux_factor=dims.cp,
                              release="layer")
        losses = []
        for i, (x, y) in enumerate(batches):
            mx, my = _micro_inputs(x, y, dims, coords)
            step = train_step(comms["pp"], stage, steps[coords["pp"]], mx, my,
                              scale=1.0 / (dims.dp * dims.cp * dims.micro_batches))
            comm.sync_host()  # the step's loss is read on the host
            losses.append([step[k] for k in sorted(step)])
            train.advance()
            if saver is not None:
                saver.after_step(comm, hooks, *where, train, last=i == len(batches) - 1)
        full, slices = hooks.local_params()
        return {"params": full, "slices": slices, "placements": placements, "coords": rank_model.coords(),
                "rank": comm.global_rank,
                "losses": losses, "last": coords["pp"] == dims.pp - 1 and coords["tp"] == 0, "layers": mine,
                "seeds": train.seeds}

    try:
        results = world.run(program)
    except RankFailedError as failed:
        if saver is not None:  # the saves that completed before the failure stay usable
            ends = {**failed.dead, **{r: t.time for r, t in failed.timeouts.items()}}
            failed.checkpoints = saver.after_failure(ends)
        raise
    full = None if shape_only else _assemble(results, rank_sizes(dims))
    return MeshRun(full, _losses([r for r in results if r], len(batches)), world, dims,
                   [r["layers"] if r else None for r in results], first_step, results[world.live[0]]["seeds"],
                   saver.folders() if saver is not None else [])


def run_precision(model, stack=None, precision=None):
    """(the Stack, the policy) of a run of ``model``: ``precision`` if given, else the
    stack's policy for a bf16 model, else None (every number as the arrays hold it)."""
    stack = stack_preset(stack)
    if precision is not None:
        return stack, precision_preset(precision)
    is_bf16 = np.dtype(model.dtype).name == "bfloat16"
    return stack, (stack.precision if is_bf16 else None)


def _restart(model, params, optimizer, resume_from, shape_only, allow_changes, policy=None):
    """The checkpoint a run starts from (None: from ``params``), checked against the model
    and the optimizer."""
    if resume_from is None:
        if allow_changes:
            raise ConfigError("allow_changes= names what may differ from the checkpoint a run resumes from; pass "
                              "resume_from= too, or drop allow_changes=")
        return None
    if params is not None or shape_only:
        raise ConfigError("resume_from= takes the parameters from the checkpoint: pass params=None (and no "
                          "shape_only)")
    shapes = {k: (v.shape, v.dtype) for k, v in shape_only_params(model).items()}
    checkpoint = resume_from if isinstance(resume_from, Checkpoint) else Checkpoint(resume_from)
    checkpoint.check(shapes, optimizer, model, allow_changes, policy)
    return Restart(checkpoint, dtypes={k: d for k, (_, d) in shapes.items()})


def rank_sizes(dims):
    return {"tp": dims.tp, "ep": dims.ep}


def _assemble(results, sizes):
    """The full parameters from every rank's: ZeRO-3's flat slices joined over their group
    first, then every rank's blocks placed (``unshard``)."""
    slices = {}  # (unit, group ranks) -> {global rank: (layout, flat slice)}
    for r in results:
        for _, unit, layout, ranks, flat in r["slices"]:
            slices.setdefault((unit, ranks), {})[r["rank"]] = (layout, flat)
    per_rank = [dict(r["params"]) for r in results]
    for (unit, ranks), pieces in slices.items():
        layout = next(iter(pieces.values()))[0]
        whole = layout.unflatten(np.concatenate([pieces[g][1] for g in ranks]))
        for g in ranks:
            per_rank[g].update({f"{unit.split(':')[0]}.{k}": v for k, v in whole.items()})
    return unshard(per_rank, [r["placements"] for r in results], [r["coords"] for r in results], sizes)


def _losses(results, steps):
    last = [r["losses"] for r in results if r["last"]]
    if not last:
        raise ConfigError("run_on_mesh: no rank of the last pipeline stage reported a loss")
    return [float(np.mean([np.mean(ls[i]) for ls in last])) for i in range(steps)]
