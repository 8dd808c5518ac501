"""``search(model, cluster, seq_len, global_batch_tokens, top=10)``: every way to split the
cluster's GPUs into ``dp x tp x pp x cp`` (and ``ep`` inside ``dp x cp`` for an MoE),
each rejected with its reason or ranked by throughput.

For each factorisation the settings a person would try first: sequence parallelism with
tensor parallelism; one sequence per micro-batch under pipelining (the most micro-batches,
the smallest bubble) with 1F1B, ZB-H1, and the interleaved schedule where it divides; the
lowest ZeRO stage and the least recomputation that fit in HBM, and ZeRO-1 beside ZeRO-0
where the stack runs it as Megatron's distributed optimizer. Memory is screened with a
closed form (the training state, plus the schedule's most micro-batches in flight times a
micro-batch's activations); the time of every candidate is estimated in closed form from
its stages' layer times (:mod:`.timing`): the schedule's ramp, the optimizer's update and
the data-parallel tail no schedule hides; the best ``top`` (and a margin) that fit are evaluated in
full (:func:`~emulator.planner.evaluate`) and re-ranked. It can miss the best plan where
that needs a setting it does not try (several sequences per micro-batch, more chunks per
stage): :func:`~emulator.planner.exhaustive.exhaustive_search` tries them all.
"""

from dataclasses import dataclass
from math import gcd

from ..machine import elementwise
from ..parallel.data_parallel.ladder import uses_distributed_optimizer
from ..parallel.dims import ParallelDims
from ..parallel.pipeline.actions import stage_of
from .evaluate import evaluate, structural_problems
from .bound_rows import _chunk_counts
from .layers import rank_layers, split_names
from .overlap import last_bucket_seconds
from .memory import byte_sizes
from .precision_of import plan_context
from .timer import Timer
from .timing import layer_times


@dataclass(frozen=True)
class Rejected:
    """A factorisation that cannot run, and why."""

    dp: int
    tp: int
    pp: int
    cp: int
    ep: int
    reason: str

    def __str__(self):
        return f"dp={self.dp} tp={self.tp} pp={self.pp} cp={self.cp} ep={self.ep}: {self.reason}"

    @classmethod
    def of(cls, dims, reason):
        """The rejection of plan ``dims`` (a ParallelDims) for ``reason``."""
        return cls(dims.dp, dims.tp, dims.pp, dims.cp, dims.ep, reason)


def best_first(ranked, rej, rejected, top):
    """The ``top`` of ``ranked`` ((dims, Estimate) pairs) by throughput, best first; the
    rejections ``rej`` go to the caller's list ``rejected`` where one was passed."""
    ranked.sort(key=lambda de: -de[1].tokens_per_s_per_gpu)
    if rejected is not None:
        rejected.extend(rej)
    return ranked[:top]


def divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_plans(model, cluster, seq_len, global_batch_tokens):
    """(candidate ``(dp, tp, pp, cp, ep)`` tuples, :class:`Rejected` ones): every
    factorisation of the cluster's GPUs, rejected where a size does not divide or a rule
    of the mesh is broken."""
    G, g = cluster.gpus, cluster.gpus_per_node
    B = global_batch_tokens // seq_len
    ok, rejected = [], []
    for tp in divisors(G):
        why = _tp_problem(model, tp, g)
        for pp in divisors(G // tp):
            why_pp = why or (f"pp={pp} exceeds the {model.n_layers} layers" if pp > model.n_layers else None)
            for cp in divisors(G // (tp * pp)):
                dp = G // (tp * pp * cp)
                reason = why_pp
                if not reason and cp > 1 and seq_len % (2 * cp):
                    reason = f"the sequence ({seq_len}) does not cut into 2 x cp = {2 * cp} zigzag pieces"
                if not reason and B % dp:
                    reason = f"the batch of {B} sequences does not split over dp={dp}"
                eps = [e for e in divisors(gcd(model.n_experts, dp * cp))] if model.n_experts else [1]
                for ep in eps:
                    if reason:
                        rejected.append(Rejected(dp, tp, pp, cp, ep, reason))
                    else:
                        ok.append((dp, tp, pp, cp, ep))
    return ok, rejected


def _tp_problem(model, tp, g):
    if tp > g:
        return f"tp={tp} crosses a node of {g} GPUs (its collectives would run on the NICs)"
    for name, n in (("heads", model.n_heads), ("K/V heads", model.n_kv_heads), ("d_ff", model.d_ff),
                    ("vocabulary", model.vocab)):
        if n % tp:
            return f"tp={tp} does not divide the {n} {name}"
    return None


def _variants(model, base, B, seq_len):
    """The settings tried for one factorisation, least memory-hungry last within each."""
    dp, tp, pp, cp, ep = base
    per_replica = B // dp
    shapes = [(per_replica, 1)] if pp > 1 else sorted({(1, per_replica), (per_replica, 1)})
    out = []
    for m, v in shapes:
        scheds = [("1f1b", 1)] + ([("zb_h1", 1)] if pp > 1 else [])
        if pp > 1 and m % pp == 0 and model.n_layers >= 2 * pp:
            scheds.append(("interleaved_1f1b", 2))
        for sched, vv in scheds:
            out.append(dict(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, micro_batches=m, schedule=sched, v=vv,
                            sequence_parallel=tp > 1))
    return out


def _in_flight(name, p, m, v):
    """Per rank, the most chunk-micro-batches it holds at once (what
    :func:`emulator.parallel.pipeline.check.in_flight` counts, in closed form): GPipe all
    m; 1F1B its warm-up plus one, p - r; interleaved Megatron's warm-up
    2 (p - 1 - r) + (v - 1) p plus one; ZB-H1 p (1F1B's, plus r waiting for their W)."""
    if name == "gpipe":
        return [m] * p
    if name == "zb_h1":
        return [min(p, m)] * p
    if name == "interleaved_1f1b":
        return [min(2 * (p - 1 - r) + (v - 1) * p + 1, m * v) for r in range(p)]
    return [min(p - r, m) for r in range(p)]


def _state_bytes(layer, dims, z, sizes):
    """(params, optimizer, grads, gathered) bytes of one layer's units on one rank under ZeRO ``z``."""
    groups = {"dense": dims.dp * dims.cp, "experts": dims.dp * dims.cp // dims.ep}
    out = [0, 0, 0, 0]
    for group, elems in layer.params.items():
        n = groups[group]
        mine = -(-elems // n)
        out[0] += (mine if z == 3 else elems) * sizes["params"]
        out[1] += (elems if z == 0 else mine) * sizes["optimizer"]
        out[2] += (elems if z <= 1 else mine) * sizes["grads"]
        out[3] += mine * n * sizes["gather"] if z == 3 else 0
    return out


def _screen(model, timer, kw, seq_len, tokens, hbm, ctx, tails):
    """The first (recompute, zero_stage) that fits, by the closed form (training state
    plus the schedule's most micro-batches in flight times a micro-batch's activations),
    or ZeRO-1 in place of ZeRO-0 where the distributed optimizer makes it faster (:func:`_estimate`),
    as ``(estimated step seconds, memory, dims)``; or None. ``tails``: the factorisation's
    cache for :func:`_tail`."""
    B = tokens // seq_len
    p, v, m = kw["pp"], kw["v"], kw["micro_batches"]
    b = B // (kw["dp"] * m)
    names = split_names(model.n_layers, p * v)
    flight = _in_flight(kw["schedule"], p, m, v)
    compositions = {}  # (embeds, blocks, heads) a rank holds -> the most micro-batches any such rank holds
    for r in range(p):
        stage = [n for c in range(v) for n in names[stage_of(p, r, c)]]
        comp = (stage.count("embed"), len(stage) - stage.count("embed") - stage.count("head"), stage.count("head"))
        compositions[comp] = max(compositions.get(comp, 0), flight[r])
    layers = {}
    stages = (0, 1, 2, 3) if kw["dp"] * kw["cp"] > 1 else (0,)
    for recompute in ("none", "selective", "full"):
        dims = ParallelDims(recompute=recompute, **kw)
        if recompute != "full":
            layers[recompute] = rank_layers(model, dims, b, seq_len, ctx, ["embed", "blocks.0", "head"])
        kinds = layers["none" if recompute == "full" else recompute]
        act = [x.input if recompute == "full" else x.kept for x in kinds]
        for z in stages:
            state = [_state_bytes(x, dims, z, byte_sizes(ctx)) for x in kinds]
            worst = 0.0
            for cnt, held in compositions.items():
                static = sum(k * sum(st[:3]) for k, st in zip(cnt, state))
                gathered = max(st[3] for k, st in zip(cnt, state) if k)
                worst = max(worst, static + gathered + held * sum(k * a for k, a in zip(cnt, act)) / v)
            if worst <= hbm:
                tried = [z] + ([1] if z == 0 and uses_distributed_optimizer(ctx.stack, 1) else [])
                plans = [dims.replace(zero_stage=zz) for zz in tried]
                return min(((_estimate(timer, model.n_layers, kinds, compositions, d, ctx, tails), worst, d)
                            for d in plans), key=lambda found: found[0])
    return None


def _estimate(timer, n_layers, kinds, compositions, dims, ctx, tails):
    """A plan's step in closed form: its pipeline (:func:`_ramp`), the optimizer's update of
    what the rank holding most updates (as ``evaluate`` charges it), and the data-parallel
    tail (:func:`_tail`)."""
    p, m, v = dims.pp, dims.micro_batches, dims.v
    lt = [layer_times(timer, x, 0, dims, ctx) for x in kinds]  # stages alike on nodes
    groups = {"dense": dims.dp * dims.cp, "experts": dims.dp * dims.cp // dims.ep}
    updated = [sum(e if dims.zero_stage == 0 or groups[g] == 1 else -(-e // groups[g]) for g, e in x.params.items())
               for x in kinds]
    worst = max(compositions, key=lambda cnt: sum(k * n for k, n in zip(cnt, updated)))
    n = sum(k * u for k, u in zip(worst, updated))
    update = timer.ops(elementwise.optimizer_update(ctx.stack, n, ctx.precision, ctx.array), 0)
    return _ramp(lt, compositions, dims.schedule, p, m, v) + update + _tail(timer, n_layers, kinds, dims, ctx, tails)


def _tail(timer, n_layers, kinds, dims, ctx, cache):
    """What no schedule hides of the data-parallel gradient reduction, on pipeline ranks 0
    and 1 (Megatron cuts buckets on rank 0 alone): the last bucket's collective
    (:func:`~.overlap.last_bucket_seconds`); 0 where the tail has no such bucket. ``cache``:
    one factorisation's, by ZeRO stage, chunks and layers."""
    z = dims.zero_stage
    if z == 0:
        op = "all_reduce"
    elif z == 1 and uses_distributed_optimizer(ctx.stack, 1):
        op = "reduce_scatter"
    else:
        return 0.0
    p, v = dims.pp, dims.v
    key = (z, v, n_layers, tuple(map(id, kinds)))
    if key not in cache:
        counts = _chunk_counts(n_layers, p, v)
        out = 0.0
        for r in range(min(p, 2)):
            layers = [[None] * p for _ in range(v)]
            for c, (e, b, h) in enumerate(counts[r]):
                layers[c][r] = [kinds[0]] * e + [kinds[1]] * b + [kinds[2]] * h
            out = max(out, last_bucket_seconds(timer, r, layers, dims, ctx, op))
        cache[key] = (out, kinds)  # the kinds kept alive with their ids
    return cache[key][0]


def _ramp(lt, compositions, schedule, p, m, v):
    """The closed form of a step's pipeline: the slowest rank's work per micro-batch ``t``
    (its layers' passes, counted as ``compositions`` holds them; ``lt`` per layer kind) over
    ``m v + p - 1`` chunk slots; ZB-H1 as :func:`emulator.accounting.pipeline.pipeline_bubble`
    times it (the weight gradients fill the ramp-down: ``m (F + B + W) + (p - 1)(F + B - W)``,
    B the input gradient alone, or the forward and B chain where too few micro-batches)."""
    steps = []
    for cnt in compositions:
        f, b, w, ag = (sum(k * x[key] for k, x in zip(cnt, lt)) for key in ("F", "Bs", "W", "ag"))
        if schedule == "zb_h1":
            f += 2 * ag
            steps.append(max(m * (f + b + w) + (p - 1) * (f + b - w), (m + p - 1) * (f + b) + w))
        else:
            steps.append((f + sum(k * x["B"] for k, x in zip(cnt, lt)) + 2 * ag) * (m * v + p - 1) / v)
    return max(steps)


def search(model, cluster, seq_len, global_batch_tokens, top=10, param_bytes=None, mixed=None, rejected=None,
           full_evaluations=None, stack=None, precision=None):
    """The ``top`` plans, best first: a list of ``(ParallelDims, Estimate)``, as the software
    ``stack`` runs them (None: ``"megatron-core"``; ``precision`` and the shorthands as
    :func:`~emulator.planner.evaluate`'s). Pass a list as ``rejected`` to receive every
    :class:`Rejected` factorisation and setting. ``full_evaluations`` (None: ``top + 4``):
    how many valid plans, best estimated first, are evaluated in full and re-ranked (a plan
    the full account rejects is replaced by the next)."""
    ctx = plan_context(stack, precision, param_bytes, mixed)
    model = model.with_seq(seq_len)
    bases, rej = enumerate_plans(model, cluster, seq_len, global_batch_tokens)
    B = global_batch_tokens // seq_len
    hbm = cluster.hbm_bytes
    scored = []
    for base in bases:
        best, timer, tails = None, None, {}
        for kw in _variants(model, base, B, seq_len):
            if structural_problems(model, cluster, ParallelDims(**kw), seq_len, global_batch_tokens):
                continue
            timer = timer or Timer(cluster, ParallelDims(**kw), ctx.stack)
            found = _screen(model, timer, kw, seq_len, global_batch_tokens, hbm, ctx, tails)
            if found and (best is None or found[0] < best[0]):
                best = found
        if best is None:
            rej.append(Rejected(*base, "does not fit in HBM even with ZeRO-3 and full recomputation, or a size "
                                       "does not divide"))
        else:
            scored.append(best)
    scored.sort(key=lambda s: s[0])
    n = full_evaluations or top + 4
    ranked = []
    for _, _, dims in scored:  # the closed form can pass a plan the full account finds too big: the next one then
        if len(ranked) >= n:
            break
        est = evaluate(model, cluster, dims, seq_len, global_batch_tokens, stack=ctx.stack, precision=ctx.precision)
        if est.valid:
            ranked.append((dims, est))
        else:
            rej.append(Rejected.of(dims, "; ".join(est.problems)))
    return best_first(ranked, rej, rejected, top)
