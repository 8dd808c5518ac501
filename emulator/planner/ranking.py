"""``search(model, cluster, seq_len, global_batch_tokens, top=10)``: every way to split the
cluster's GPUs into ``dp x tp x pp x cp`` (and ``ep`` inside ``dp x cp`` for an MoE),
each rejected with its reason or ranked by throughput.

For each factorisation the settings a person would try first: sequence parallelism with
tensor parallelism; one sequence per micro-batch under pipelining (the most micro-batches,
the smallest bubble), the interleaved schedule too where it divides; the lowest ZeRO stage
and the least recomputation that fit in HBM. Memory is screened with a closed form (the
training state, plus the schedule's most micro-batches in flight times a micro-batch's
activations); the time of every candidate is estimated from its stages' layer times
(:mod:`.timing`) and the schedule's ramp, and the best ``top`` (and a margin) are
evaluated in full (:func:`~emulator.planner.evaluate`) and re-ranked.
"""

from dataclasses import dataclass
from math import gcd

from ..parallel.dims import ParallelDims
from ..parallel.pipeline.actions import stage_of
from .evaluate import evaluate, structural_problems
from .layers import rank_layers, split_names
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
        scheds = [("1f1b", 1)]
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


def _screen(model, timer, kw, seq_len, tokens, hbm, ctx):
    """The first (recompute, zero_stage) that fits, by the closed form (training state
    plus the schedule's most micro-batches in flight times a micro-batch's activations),
    as ``(estimated step seconds, memory, dims)``; or None."""
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
                dims = dims.replace(zero_stage=z)
                lt = [layer_times(timer, x, 0, dims, ctx) for x in kinds]  # stages alike on nodes
                t = max(sum(k * (x["F"] + x["B"] + 2 * x["ag"]) for k, x in zip(cnt, lt)) for cnt in compositions)
                return t * (m * v + p - 1) / v, worst, dims
    return None


def search(model, cluster, seq_len, global_batch_tokens, top=10, param_bytes=None, mixed=None, rejected=None,
           full_evaluations=None, stack=None, precision=None):
    """The ``top`` plans, best first: a list of ``(ParallelDims, Estimate)``, as the software
    ``stack`` runs them (None: ``"megatron-core"``; ``precision`` and the shorthands as
    :func:`~emulator.planner.evaluate`'s). Pass a list as ``rejected`` to receive every
    :class:`Rejected` factorisation and setting."""
    ctx = plan_context(stack, precision, param_bytes, mixed)
    model = model.with_seq(seq_len)
    bases, rej = enumerate_plans(model, cluster, seq_len, global_batch_tokens)
    B = global_batch_tokens // seq_len
    hbm = cluster.hbm_bytes
    scored = []
    for base in bases:
        best, timer = None, None
        for kw in _variants(model, base, B, seq_len):
            if structural_problems(model, cluster, ParallelDims(**kw), seq_len, global_batch_tokens):
                continue
            timer = timer or Timer(cluster, ParallelDims(**kw), ctx.stack)
            found = _screen(model, timer, kw, seq_len, global_batch_tokens, hbm, ctx)
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
    for _, _, dims in scored[:n]:
        est = evaluate(model, cluster, dims, seq_len, global_batch_tokens, stack=ctx.stack, precision=ctx.precision)
        if est.valid:
            ranked.append((dims, est))
        else:
            rej.append(Rejected.of(dims, "; ".join(est.problems)))
    return best_first(ranked, rej, rejected, top)
