"""Bounds on a plan's step time and memory that the planner's ``evaluate`` never goes
below, computed in closed form from its layers, for the exhaustive search
(:mod:`.exhaustive`) to prune with: :func:`step_bound` and :func:`memory_bound`, each with
its argument in its docstring; :class:`Factorisation` holds what one factorisation's settings
share (its layers' kinds and their times)."""

from ..machine import elementwise
from ..mesh import DP_CP, EDP, REDUCED_OVER
from ..parallel.data_parallel.ladder import fsdp_whole_in_pipeline, uses_distributed_optimizer
from ..parallel.dims import ParallelDims
from .bound_rows import (_backward_classes, chunk_counts, _ends_with_backward, _last_rank_of, _memory_rows,
                         _time_classes, _time_rows)
from .memory import byte_sizes, padded, shard_groups, updated_elements
from .overlap import last_bucket_seconds
from .timer import Timer
from .timing import bulk_saving, layer_times

KINDS = ("embed", "blocks.0", "head")  # a stage's layers are these three kinds, counted


def _dot(a, b):
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


class Factorisation:
    """One factorisation's fixed parts: its timer, groups and stages' keys."""

    def __init__(self, model, cluster, base, ctx):
        dp, tp, pp, cp, ep = base
        self.model, self.ctx, self.base = model, ctx, base
        self.dims = ParallelDims(dp=dp, tp=tp, pp=pp, cp=cp, ep=ep, sequence_parallel=tp > 1)
        self.timer = Timer(cluster, self.dims, ctx.stack)
        keys = [self.timer.stage_key(r) for r in range(pp)]
        self.reps = sorted(set(keys))  # one representative rank per key (the key is the rank or 0)
        self.key_of = [self.reps.index(k) for k in keys]
        self.groups = shard_groups(self.dims)
        self.sizes = byte_sizes(ctx)
        self.distributed = uses_distributed_optimizer(ctx.stack, 1)
        self.prefetch = ctx.stack.fsdp_prefetch
        self.whole = fsdp_whole_in_pipeline(ctx.stack, 3, pp > 1)  # ZeRO-3 as FSDP2 in torch's pipelining
        self._opt, self._static, self._floor = {}, {}, {}

    def static(self, kinds, z):
        """Per kind: bytes of parameters and optimizer state a rank holds (``Units``'s sums),
        and the same with its gradients added (once every layer's first backward ran)."""
        key = (z,) + tuple(tuple(x.params.items()) for x in kinds)
        hit = self._static.get(key)
        if hit is None:
            hit = self._static[key] = self._held(kinds, z)
        return hit

    def _held(self, kinds, z):
        s = self.sizes
        out, with_grads = [], []
        for x in kinds:
            t = g = 0
            for group, elems in x.params.items():
                if elems:
                    mine = padded(elems, self.groups[group]) // self.groups[group]
                    t += (mine if z == 3 else elems) * s["params"] + (elems if z == 0 else mine) * s["optimizer"]
                    g += (elems if z <= 1 else mine) * s["grads"]
            out.append(t)
            with_grads.append(t + g)
        return out, with_grads

    def updated(self, kinds, z):
        """Per kind: elements the optimizer updates (``_optimizer_seconds``'s count)."""
        return [updated_elements(x, self.groups, z) for x in kinds]

    def optimizer(self, n, key):
        hit = self._opt.get((n, key))
        if hit is None:
            kernels = elementwise.optimizer_update(self.ctx.stack, n, self.ctx.precision, self.ctx.array)
            hit = self._opt[(n, key)] = self.timer.ops(kernels, self.reps[key])
        return hit

    def times(self, kinds, recompute, m):
        """Per stage key, per kind: layer_times under ZeRO-3 (its gather and reduce-scatter
        priced) and 1F1B, and the bulk overlap's saving (which ZB-H1 does not take)."""
        dims = self.dims.replace(zero_stage=3, recompute=recompute, micro_batches=m)
        out = []
        for r in self.reps:
            g = self.timer.groups(r)
            # what layer_times reads of the plan: the groups that time the layer's ops and its
            # strategy's collectives, tp, the recomputation (the stack and cluster are the search's)
            key = ("bound", self.timer.topology, g["tp"], g["cp"], g["ep"], g[DP_CP], g[EDP], recompute,
                   self.dims.tp)
            row = []
            for x in kinds:
                hit = x.times.get(key)
                if hit is None:
                    t = layer_times(self.timer, x, r, dims, self.ctx)
                    hit = x.times[key] = (t, bulk_saving(self.timer, x, r, recompute == "full"))
                row.append(hit)
            out.append(row)
        return out

    def floor(self, kinds, z, r, v):
        """What rank r's data-parallel tail is at least where :func:`~emulator.planner.comm.dp_tail`
        replays it (DDP's all-reduces; ZeRO-1's reduce-scatters under the distributed
        optimizer): its last bucket's collective (:func:`~.overlap.last_bucket_seconds`)."""
        if z == 0:
            op = "all_reduce"
        elif z == 1 and self.distributed:
            op = "reduce_scatter"
        else:
            return 0.0
        p = self.dims.pp
        counts = chunk_counts(self.model.n_layers, p, v)[r]
        key = (z, v, r > 0, counts, self.timer.stage_key(r), tuple(tuple(x.params.items()) for x in kinds))
        hit = self._floor.get(key)
        if hit is None:
            layers = [[None] * p for _ in range(v)]
            for c, (e, b, h) in enumerate(counts):
                layers[c][r] = [kinds[0]] * e + [kinds[1]] * b + [kinds[2]] * h
            hit = self._floor[key] = last_bucket_seconds(self.timer, r, layers, self.dims, self.ctx, op)
        return hit

    def tails(self, kinds, z, key):
        """Per kind: the data-parallel tail :func:`~emulator.planner.comm.dp_tail` adds in
        closed form (ZeRO-1 without the distributed optimizer, ZeRO-2); 0 where it replays."""
        if z not in (1, 2) or (z == 1 and self.distributed):
            return (0.0, 0.0, 0.0)
        r, s, groups = self.reps[key], self.sizes, self.timer.groups(self.reps[key])
        out = []
        for x in kinds:
            t = 0.0
            for group, elems in x.params.items():
                axis = REDUCED_OVER[group]
                n = len(groups[axis])
                if elems and n > 1:
                    full = padded(elems, n)
                    if z == 1:
                        t += self.timer.op(("c", "reduce_scatter", full * s["reduce"], axis), r)
                    t += self.timer.op(("c", "all_gather", full * s["gather"], axis), r)
            out.append(t)
        return tuple(out)


def _pass_bounds(times, z, sched, prefetch, whole=False):
    """Per kind, ``(F, B, host F, host B, host-bound)``: seconds no action can take less of
    per micro-batch and layer of the kind, for ZeRO stage ``z`` and schedule ``sched``, from
    :meth:`Factorisation.times`; and whether its host issues slower than its GPU computes (as
    ``evaluate`` tests it). The argument, as :func:`~emulator.planner.timing.action_durations`
    builds the actions: a forward takes its layers' ``F``, plus each layer's gather under
    ZeRO-3 without prefetch and with an unsplit backward (whose layers are never still
    gathered); an unsplit backward their ``B`` (holding ``rs`` from ZeRO-2 on) plus the same
    gather; ZB-H1's split ``Bs`` and ``W`` sum to ``B`` without the bulk saving; FSDP's
    prefetch leaves each layer's compute (``F``; ``B`` less ``rs``) and adds what outlasts it;
    FSDP2 in a pipeline (``whole``) gathers once a step and reduce-scatters after the flush
    (its passes: ``F``, and ``B`` less ``rs``)."""
    out = []
    for t, saved in times:
        f, b = t["F"], t["B"] - (t["rs"] if z < 2 else 0.0) + (saved if sched == "zb_h1" else 0.0)
        host_bound = t["host F"] > f or t["host B"] > b
        if z == 3:
            if prefetch or whole:
                b -= t["rs"]
            elif sched != "zb_h1":
                f += t["ag"]
                b += t["ag"]
        out.append((f, b, t["host F"], t["host B"], host_bound))
    return out


def step_bound(part, kinds, times, z, sched, v, m):
    """A lower bound on :func:`~emulator.planner.evaluate`'s ``step_time`` for the plan.

    ``evaluate``'s step is ``max_r (end_r + tail_r + optimizer_r)``: rank r's pipeline end,
    its data-parallel tail (here its closed form where ``dp_tail`` has one, else at least
    its last bucket's collective, :meth:`Factorisation.floor`)
    and its optimizer update (here exactly). :func:`~emulator.parallel.pipeline.simulator.play` runs
    each rank's actions one after another, each no earlier than its input arrives, so:

    1. ``end_r >= Fchain_r + m W_r``: rank r's first action waits for micro-batch 0's
       forward through stages 0..r-1 of chunk 0 (hops >= 0), and its m micro-batches'
       actions take at least ``W_r`` each (:func:`_pass_bounds`, over its layers);
    2. ``end_0 >= Fchain_{p-1} + m W_{p-1} + Bchain_{p-1}`` where the last rank's last
       action is a backward: rank 0's backward of that micro-batch waits for it and for its
       backward through stages p-2..0 of chunk 0 (each at least its ``B``); and so for
       every rank r whose last action is a backward of chunk 0 (:func:`_backward_classes`):
       ``end_0 >= Fchain_r + m W_r + Bchain_r``, its first action waiting for stages
       0..r-1, its last one's micro-batch going back down them;
    3. ``end_r >= m H_r``, the host's seconds to issue them (an action ends no earlier than
       its host has issued it), where ``evaluate`` plays every micro-batch.

    Where ``evaluate`` plays ``cap = (v + 1) p`` and ``cap + p`` micro-batches and extends
    the line (``m > cap + p``, no pass host-bound), its premise is the steady state: each
    micro-batch past the ramp adds the same time T to every rank; in T each rank runs one
    micro-batch's actions, so ``T >= max_r W_r``. 1 and 2 hold for the ``cap`` played, and
    each of the ``m - cap`` added micro-batches adds at least the ``W`` they count."""
    p = part.dims.pp
    passes = [_pass_bounds(row, z, sched, part.prefetch, part.whole) for row in times]
    rows = _time_rows(p, v, part.model.n_layers)
    host_bound = any(passes[part.key_of[r]][k][4] for r, (held, _, _) in enumerate(rows) for k in range(3) if held[k])
    played = m <= (v + 2) * p or host_bound
    upd = part.updated(kinds, z)
    if len(part.reps) == 1:  # every stage timed alike: the ranks that hold alike, the last of them (longest chain)
        ps = passes[0]
        f, b = [x[0] for x in ps], [x[1] for x in ps]
        w, h = [x[0] + x[1] for x in ps], [x[2] + x[3] for x in ps]
        tails = part.tails(kinds, z, 0)
        best = 0.0
        classes, (held_first, _, _) = _time_classes(p, v, part.model.n_layers)
        ranks = _last_rank_of(p, v, part.model.n_layers)
        for held, chain in classes:
            g = _dot(chain, f) + m * _dot(held, w)
            if played:
                g = max(g, m * _dot(held, h))
            best = max(best, g + part.optimizer(_dot(held, upd), 0) + _dot(held, tails) +
                       part.floor(kinds, z, ranks[held], v))
        if p > 1:  # rule 2, for every rank that ends on a backward of chunk 0 (the last rank among them)
            first = part.optimizer(_dot(held_first, upd), 0) + _dot(held_first, tails) + part.floor(kinds, z, 0, v)
            for held, chain in _backward_classes(sched, p, v, part.model.n_layers):
                best = max(best, _dot(chain, w) + m * _dot(held, w) + first)
        return best
    best = f_chain = b_chain = 0.0
    extra = []
    for r, (held, _, first) in enumerate(rows):
        key = part.key_of[r]
        ps = passes[key]
        gpu = f_chain + m * sum(n * (x[0] + x[1]) for n, x in zip(held, ps))
        g = max(gpu, m * sum(n * (x[2] + x[3]) for n, x in zip(held, ps))) if played else gpu
        extra.append(part.optimizer(_dot(held, upd), key) + _dot(held, part.tails(kinds, z, key)) +
                     part.floor(kinds, z, r, v))
        best = max(best, g + extra[-1])
        if r < p - 1:
            f_chain += sum(n * x[0] for n, x in zip(first, ps))
            b_chain += sum(n * x[1] for n, x in zip(first, ps))
    if p > 1 and _ends_with_backward(sched, p, v):
        best = max(best, gpu + b_chain + extra[0])
    return best


def memory_bound(part, kinds, z, sched, v, m, full):
    """A lower bound on :func:`~emulator.planner.memory.stage_peaks`'s worst rank, the larger
    of two moments of its walk: when its first backward starts, its parameters and
    optimizer state (held all step) and what the forwards before it keep (no gradient held
    yet; buffers >= 0); and when its last backward ends, the same state and every layer's
    gradients (each held from its first backward to the update; activations, buffers >= 0;
    DDP's buckets hold their layers' sum)."""
    static, with_grads = part.static(kinds, z)
    kept = [x.input if full else x.kept for x in kinds]
    return max(max(_dot(row[:3], static) + _dot(row[3:], kept), _dot(row[:3], with_grads))
               for row in _memory_rows(sched, part.dims.pp, m, v, part.model.n_layers))
