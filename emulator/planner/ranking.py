"""``search(model, cluster, seq_len, global_batch_tokens, top=10)``: every way to split the
cluster's GPUs into ``dp x tp x pp x cp`` (and ``ep`` inside ``dp x cp`` for an MoE),
each rejected with its reason or ranked by throughput.

For each factorisation the settings a person would try first: sequence parallelism with
tensor parallelism; one sequence per micro-batch under pipelining (the most micro-batches,
the smallest bubble) with 1F1B, ZB-H1, and the interleaved schedule where it divides; the
lowest ZeRO stage and the least recomputation that fit in HBM, and ZeRO-1 beside ZeRO-0
where the stack runs it as Megatron's distributed optimizer. Each is screened and timed in
closed form (:mod:`.screen`: memory from the training state and the micro-batches in
flight; the step from the schedule's ramp, the optimizer's update and the data-parallel
tail); the factorisations are taken best estimate first and evaluated in full
(:func:`~emulator.planner.evaluate`) until ``top`` (and a margin) fit, and re-ranked. Where
the full account refuses a setting the closed form passed, the same factorisation's next
setting takes its place. It can miss the best plan where that needs a setting it does not
try (several sequences per micro-batch, more chunks per stage):
:func:`~emulator.planner.exhaustive.exhaustive_search` tries them all.
"""

import heapq
from dataclasses import dataclass
from math import gcd

from ..errors import ConfigError
from ..parallel.dims import ParallelDims
from .evaluate import evaluate, structural_problems
from .precision_of import plan_context
from .screen import screen
from .timer import Timer


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


def plan_counts(what, top, full_evaluations):
    """Refuse a ``top`` or ``full_evaluations`` that is not a positive whole number (None:
    the default, for ``full_evaluations``), naming the search and the value."""
    for name, value in (("top", top), ("full_evaluations", full_evaluations)):
        if name == "full_evaluations" and value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{what}: {name} must be a positive whole number of plans, got {value!r}")


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


def search(model, cluster, seq_len, global_batch_tokens, top=10, param_bytes=None, mixed=None, rejected=None,
           full_evaluations=None, stack=None, precision=None):
    """The ``top`` plans, best first: a list of ``(ParallelDims, Estimate)``, as the software
    ``stack`` runs them (None: ``"megatron-core"``; ``precision`` and the shorthands as
    :func:`~emulator.planner.evaluate`'s). Pass a list as ``rejected`` to receive every
    :class:`Rejected` factorisation and setting. ``full_evaluations`` (None: ``top + 4``):
    how many valid plans, one per factorisation, best estimated first, are evaluated in full
    and re-ranked; a setting the full account refuses gives way to its factorisation's next,
    and no more than twice that many are evaluated in all."""
    plan_counts("search", top, full_evaluations)
    ctx = plan_context(stack, precision, param_bytes, mixed)
    model = model.with_seq(seq_len)
    bases, rej = enumerate_plans(model, cluster, seq_len, global_batch_tokens)
    B = global_batch_tokens // seq_len
    hbm = cluster.hbm_bytes
    heap = []  # (estimate, base index, [(estimate, dims)] of the base's settings that fit, best first)
    for i, base in enumerate(bases):
        found, timer, tails = [], None, {}
        for kw in _variants(model, base, B, seq_len):
            if structural_problems(model, cluster, ParallelDims(**kw), seq_len, global_batch_tokens, ctx.stack):
                continue
            timer = timer or Timer(cluster, ParallelDims(**kw), ctx.stack)
            hit = screen(model, timer, kw, seq_len, global_batch_tokens, hbm, ctx, tails)
            if hit:
                found.append(hit)
        if not found:
            rej.append(Rejected(*base, "does not fit in HBM even with ZeRO-3 and full recomputation, or a size "
                                       "does not divide"))
            continue
        found.sort(key=lambda hit: hit[0])
        heapq.heappush(heap, (found[0][0], i, [(t, dims) for t, _, dims in found]))
    n = top + 4 if full_evaluations is None else full_evaluations
    ranked, evaluated = [], 0
    while heap and len(ranked) < n and evaluated < 2 * n:
        _, i, ((_, dims), *others) = heapq.heappop(heap)
        est = evaluate(model, cluster, dims, seq_len, global_batch_tokens, stack=ctx.stack, precision=ctx.precision)
        evaluated += 1
        if est.valid:
            ranked.append((dims, est))
            continue
        rej.append(Rejected.of(dims, "; ".join(est.problems)))
        if others:  # the closed form passed a setting the full account refuses: the factorisation's next one
            heapq.heappush(heap, (others[0][0], i, others))
    return best_first(ranked, rej, rejected, top)
