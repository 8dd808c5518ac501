"""The exhaustive search: every setting of every factorisation, pruned only by proven
bounds, so that no plan it leaves out is faster than the ones it returns.

:func:`~emulator.planner.ranking.search` (the default, fast) tries for each factorisation
the settings a person would try first and screens them with a closed form; it can miss
the best plan. :func:`exhaustive_search` tries, for each factorisation
(:func:`~emulator.planner.ranking.enumerate_plans`), every setting (:func:`_variants`):
each micro-batch size that divides a replica's batch, each schedule (interleaved with
v = 2 and more), each ZeRO stage and each recomputation mode, sequence parallelism with
tensor parallelism. Each gets two bounds in closed form from its layers (:mod:`.layers`,
:mod:`.timing`): memory (:func:`~.bounds.memory_bound`), which discards it if even that does not
fit, and step time (:func:`~.bounds.step_bound`), which ``evaluate`` never goes below. The rest are
taken in the order of their time bound; each one's memory is found as ``evaluate`` finds
it, one that fits is evaluated in full (:func:`~emulator.planner.evaluate`), and the search
stops when the next bound is no shorter than the ``top``-th best step; a plan whose
layers are those of one already evaluated, recomputing selectively where nothing is
recomputed, takes its verdict. It is exact and slower than :func:`~.ranking.search`:
seconds for 16,384 GPUs (``python -m benchmarks.search_speed``);
``tests/test_planner_search_brute_force.py`` holds it to a brute force over the same
settings.
"""

from bisect import insort
from dataclasses import replace
from ..accounting.pipeline import interleaved_rounds
from ..errors import ConfigError
from ..machine.stack import stack_preset
from ..parallel.dims import ParallelDims
from ..parallel.tensor_parallel.op_checkpoint import recompute_modes
from ..parallel.pipeline.actions import stage_of
from .bounds import KINDS, Factorisation, step_bound, memory_bound
from .evaluate import evaluate, structural_problems
from .layers import rank_layers, split_names
from .memory import stage_peaks
from .precision_of import plan_context
from .ranking import Rejected, best_first, divisors, enumerate_plans, plan_counts


SCHEDULES = ("1f1b", "interleaved_1f1b", "zb_h1", "gpipe")


def _schedules(model, p, m):
    """The schedules tried for ``p`` ranks and ``m`` micro-batches, as ``(name, v)``: 1F1B,
    GPipe and ZB-H1 (one chunk), and interleaved 1F1B with v = 2 and every larger v whose
    p x v stages divide the layers, where torch's rounds divide the micro-batches."""
    out = [("1f1b", 1), ("zb_h1", 1), ("gpipe", 1)]
    if p == 1:
        return out
    try:
        interleaved_rounds(p, m)
    except ConfigError:
        return out
    vs = [v for v in range(2, model.n_layers // p + 1) if v == 2 or model.n_layers % (p * v) == 0]
    return out + [("interleaved_1f1b", v) for v in vs]


def _micro_batch_sizes(per_replica):
    """Sequences per micro-batch tried: every size that divides a replica's batch."""
    return divisors(per_replica)


def _variants(model, base, B, seq_len, stack=None):
    """Every setting searched for one factorisation ``base``: each micro-batch of b
    sequences that divides the replica's batch (1, 2, 4 and more), each schedule
    (:func:`_schedules`), each ZeRO stage and each recomputation mode; sequence
    parallelism with tensor parallelism. A list of keyword dicts of ParallelDims."""
    dp, tp, pp, cp, ep = base
    per_replica = B // dp
    out = []
    for b in _micro_batch_sizes(per_replica):
        m = per_replica // b
        for sched, v in _schedules(model, pp, m):
            for recompute in recompute_modes(stack_preset(stack), cp, model.n_experts):
                for z in range(4):
                    out.append(dict(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, micro_batches=m, schedule=sched, v=v,
                                    recompute=recompute, zero_stage=z, sequence_parallel=tp > 1))
    return out


def _peak(model, dims, seq_len, batch, ctx):
    """The worst rank's memory, as :func:`~emulator.planner.evaluate` finds it."""
    p, v = dims.pp, dims.v
    b = batch // (dims.dp * dims.micro_batches)
    names = split_names(model.n_layers, p * v)
    layers = [[rank_layers(model, dims, b, seq_len, ctx, names[stage_of(p, r, c)]) for r in range(p)]
              for c in range(v)]
    return max(peak for peak, _ in stage_peaks(layers, dims, ctx))


def _twin_key(dims):
    """Plans that differ only in recomputing nothing or selectively share a key."""
    return dims.replace(recompute="none") if dims.recompute in ("none", "selective") else dims


def _twin(model, dims, seq_len, batch, ctx, seen):
    """The Estimate of the plan evaluated in full that differs from ``dims`` only in
    recomputing nothing or selectively, where that changes none of the rank's layers
    (a fused attention kernel recomputes its scores anyway): ``evaluate`` reads the
    recomputation only through the layers and ``recompute == "full"``. Else None."""
    hit = seen.get(_twin_key(dims))
    if hit is None or hit[0].recompute == dims.recompute:
        return None
    b = batch // (dims.dp * dims.micro_batches)
    same = rank_layers(model, dims, b, seq_len, ctx, KINDS) == rank_layers(model, hit[0], b, seq_len, ctx, KINDS)
    return hit[1] if same else None


def candidates(model, cluster, seq_len, global_batch_tokens, ctx, rejected):
    """Every setting of every factorisation (:func:`_variants`) whose memory bound fits in
    HBM, as ``(step bound, ParallelDims keywords)``, unsorted; a factorisation none of whose
    settings fits is added to ``rejected``. ``model`` has its sequence set."""
    bases, rej = enumerate_plans(model, cluster, seq_len, global_batch_tokens)
    rejected.extend(rej)
    B = global_batch_tokens // seq_len
    hbm = cluster.hbm_bytes
    out = []
    for base in bases:
        part = Factorisation(model, cluster, base, ctx)
        dp, tp, pp, cp, ep = base
        per_replica = B // dp
        fits = False
        for b in _micro_batch_sizes(per_replica):
            m = per_replica // b
            scheds = _schedules(model, pp, m)
            for recompute in recompute_modes(ctx.stack, cp, model.n_experts):
                kinds = rank_layers(model, part.dims.replace(recompute=recompute), b, seq_len, ctx, KINDS)
                times = None
                for z in range(4):
                    for sched, v in scheds:
                        if memory_bound(part, kinds, z, sched, v, m, recompute == "full") > hbm:
                            continue
                        fits = True
                        if times is None:
                            times = part.times(kinds, recompute, m)
                        out.append((step_bound(part, kinds, times, z, sched, v, m),
                                    dict(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, micro_batches=m, schedule=sched, v=v,
                                         recompute=recompute, zero_stage=z, sequence_parallel=tp > 1)))
        if not fits:
            rejected.append(Rejected(*base, "does not fit in HBM with any ZeRO stage, recomputation, micro-batch "
                                            "or schedule"))
    return out


def exhaustive_search(model, cluster, seq_len, global_batch_tokens, top=10, param_bytes=None, mixed=None, rejected=None,
           full_evaluations=None, stack=None, precision=None):
    """The ``top`` plans, best first: a list of ``(ParallelDims, Estimate)``, as the software
    ``stack`` runs them (None: ``"megatron-core"``; ``precision`` and the shorthands as
    :func:`~emulator.planner.evaluate`'s). Pass a list as ``rejected`` to receive every
    :class:`Rejected` factorisation and setting.

    Branch and bound over every setting (:func:`candidates`): in the order of their
    proven bounds (:func:`~.bounds.step_bound`), each plan's memory is found as ``evaluate`` finds
    it and a plan that fits is evaluated in full; the search stops when the next bound is
    no shorter than the ``top``-th best step found, so no plan left out is faster than
    one returned. ``full_evaluations``: at most this many full evaluations (None: as many
    as the proof needs; fewer may miss the best)."""
    plan_counts("exhaustive_search", top, full_evaluations)
    ctx = plan_context(stack, precision, param_bytes, mixed)
    model = model.with_seq(seq_len)
    rej = []
    cands = candidates(model, cluster, seq_len, global_batch_tokens, ctx, rej)
    cands.sort(key=lambda c: c[0])
    batch = global_batch_tokens // seq_len
    ranked, steps, evaluated, seen = [], [], 0, {}
    for bound, kw in cands:
        if len(steps) >= top and bound >= steps[top - 1]:
            break
        if full_evaluations is not None and evaluated >= full_evaluations:
            break
        dims = ParallelDims(**kw)
        problems = structural_problems(model, cluster, dims, seq_len, global_batch_tokens, ctx.stack)
        if problems:
            rej.append(Rejected.of(dims, f"{dims}: " + "; ".join(problems)))
            continue
        twin = _twin(model, dims, seq_len, batch, ctx, seen)
        if twin is not None:  # the same layers as a plan already judged: the same verdict
            if twin.valid:
                ranked.append((dims, replace(twin, dims=dims)))
                insort(steps, twin.step_time)
            else:
                rej.append(Rejected.of(dims, "; ".join(twin.problems)))
            continue
        peak = _peak(model, dims, seq_len, batch, ctx)
        if peak > cluster.hbm_bytes:
            rej.append(Rejected.of(dims, f"{dims}: does not fit: needs "
                                f"{peak / 1e9:.1f} GB, HBM has {cluster.hbm_bytes / 1e9:.0f} GB"))
            continue
        est = evaluate(model, cluster, dims, seq_len, global_batch_tokens, stack=ctx.stack, precision=ctx.precision)
        seen[_twin_key(dims)] = (dims, est)
        evaluated += 1
        if est.valid:
            ranked.append((dims, est))
            insort(steps, est.step_time)
        else:
            rej.append(Rejected.of(dims, "; ".join(est.problems)))
    return best_first(ranked, rej, rejected, top)
