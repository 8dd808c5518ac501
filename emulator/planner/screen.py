"""The default search's closed form (:func:`~.ranking.search`): for one setting of a
factorisation, the first recomputation mode and ZeRO stage whose memory fits, screened
without playing the schedule (the training state, plus the schedule's most micro-batches in
flight times a micro-batch's activations), and its step estimated from the layers' times:
the schedule's ramp, the optimizer's update and the data-parallel tail no schedule hides.
It is an estimate, not a bound (the exhaustive search's bounds: :mod:`.bounds`); the search
evaluates the best in full."""

from ..machine import elementwise
from ..parallel.data_parallel.ladder import uses_distributed_optimizer
from ..parallel.dims import ParallelDims
from ..parallel.pipeline.actions import stage_of
from ..parallel.tensor_parallel.op_checkpoint import recompute_modes
from .bound_rows import chunk_counts
from .comm import closed_form_tail
from .layers import rank_layers, split_names
from .memory import byte_sizes, shard_groups, unsharded_in_pipeline, updated_elements
from .overlap import tail_estimate
from .timing import layer_times


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


def _state_bytes(layer, dims, z, sizes, whole=False):
    """(params, optimizer, grads, gathered) bytes of one layer's units on one rank under ZeRO
    ``z`` (``whole``: FSDP2 in a pipeline, its gradients whole, :func:`~.memory.unsharded_in_pipeline`)."""
    groups = shard_groups(dims)
    out = [0, 0, 0, 0]
    for group, elems in layer.params.items():
        n = groups[group]
        mine = -(-elems // n)
        out[0] += (mine if z == 3 else elems) * sizes["params"]
        out[1] += (elems if z == 0 else mine) * sizes["optimizer"]
        out[2] += (elems if z <= 1 else mine * n if (z == 3 and whole) else mine) * sizes["grads"]
        out[3] += mine * n * sizes["gather"] if z == 3 else 0
    return out


def screen(model, timer, kw, seq_len, tokens, hbm, ctx, tails):
    """The setting ``kw`` (a dict of ParallelDims fields) with the first (recompute,
    zero_stage) that fits by the closed form (training state plus the schedule's most
    micro-batches in flight times a micro-batch's activations), or ZeRO-1 in place of ZeRO-0
    where the distributed optimizer makes it faster (:func:`_estimate`), as ``(estimated
    step seconds, memory, dims)``; or None. ``tails``: the factorisation's cache for
    :func:`_tail`."""
    B = tokens // seq_len
    p, v, m = kw["pp"], kw["v"], kw["micro_batches"]
    b = B // (kw["dp"] * m)
    names = split_names(model.n_layers, p * v)
    flight = _in_flight(kw["schedule"], p, m, v)
    compositions = {}  # (embeds, blocks, heads) a rank holds -> the most micro-batches any such rank holds
    deferred = {}  # -> of those, the most whose weight gradient waits (ZB-H1: rank r defers r), each
    for r in range(p):  # also holding its output gradient
        stage = [n for c in range(v) for n in names[stage_of(p, r, c)]]
        comp = (stage.count("embed"), len(stage) - stage.count("embed") - stage.count("head"), stage.count("head"))
        compositions[comp] = max(compositions.get(comp, 0), flight[r])
        if kw["schedule"] == "zb_h1":
            deferred[comp] = max(deferred.get(comp, 0), min(r, m))
    layers = {}
    stages = (0, 1, 2, 3) if kw["dp"] * kw["cp"] > 1 else (0,)
    for recompute in recompute_modes(ctx.stack, kw["cp"], model.n_experts):
        dims = ParallelDims(recompute=recompute, **kw)
        if recompute != "full":
            layers[recompute] = rank_layers(model, dims, b, seq_len, ctx, ["embed", "blocks.0", "head"])
        kinds = layers["none" if recompute == "full" else recompute]
        act = [x.input if recompute == "full" else x.kept for x in kinds]
        # what a deferred W waits with: the output gradient, and what B left for it (the cache rebuilt too)
        for_w = [x.grad_out + x.for_w + (x.kept - x.input if recompute == "full" else 0.0) for x in kinds]
        for z in stages:
            whole = unsharded_in_pipeline(dims.replace(zero_stage=z), ctx)
            state = [_state_bytes(x, dims, z, byte_sizes(ctx), whole) for x in kinds]
            worst = 0.0
            for cnt, held in compositions.items():
                static = sum(k * sum(st[:3]) for k, st in zip(cnt, state))
                gathered = sum(k * st[3] for k, st in zip(cnt, state)) if whole else \
                    max(st[3] for k, st in zip(cnt, state) if k)  # all kept gathered, or one at a time
                waiting = deferred.get(cnt, 0) * sum(k * w for k, w in zip(cnt, for_w))
                worst = max(worst, static + gathered + held * sum(k * a for k, a in zip(cnt, act)) / v + waiting)
            if worst <= hbm:
                tried = [z] + ([1] if z == 0 and len(stages) > 1 and uses_distributed_optimizer(ctx.stack, 1) else [])
                plans = [dims.replace(zero_stage=zz) for zz in tried]
                return min(((_estimate(timer, model.n_layers, kinds, compositions, d, ctx, tails), worst, d)
                            for d in plans), key=lambda found: found[0])
    return None


def _estimate(timer, n_layers, kinds, compositions, dims, ctx, tails):
    """A plan's step in closed form: its pipeline (:func:`_ramp`), the optimizer's update on
    the rank that updates the most elements (as ``evaluate`` charges it), and the
    data-parallel tail (:func:`_tail`)."""
    p, m, v = dims.pp, dims.micro_batches, dims.v
    lt = [layer_times(timer, x, 0, dims, ctx) for x in kinds]  # stages alike on nodes
    updated = [updated_elements(x, shard_groups(dims), dims.zero_stage) for x in kinds]
    worst = max(compositions, key=lambda cnt: sum(k * n for k, n in zip(cnt, updated)))
    n = sum(k * u for k, u in zip(worst, updated))
    update = timer.ops(elementwise.optimizer_update(ctx.stack, n, ctx.precision, ctx.array), 0)
    whole = unsharded_in_pipeline(dims, ctx)
    return _ramp(lt, compositions, dims.schedule, p, m, v, whole) + update + \
        _tail(timer, n_layers, kinds, lt, dims, ctx, tails)


def _tail(timer, n_layers, kinds, lt, dims, ctx, cache):
    """The data-parallel work left after the pipeline on pipeline ranks 0 and 1 (Megatron
    cuts buckets on rank 0 alone), the longer of the two: where the stack reduces in buckets
    during the last micro-batch's backward (DDP, the distributed optimizer),
    :func:`~.overlap.tail_estimate` with that backward (``lt``: its layers' seconds) as the
    window; else (ZeRO-1 without the distributed optimizer, ZeRO-2) every layer's
    collectives, after it, as :func:`~.comm.dp_tail` adds them (and FSDP2's reduce-scatters in a
    pipeline); none under plain ZeRO-3.
    ``cache``: one factorisation's, by ZeRO stage, schedule, recomputation, chunks and layers."""
    z = dims.zero_stage
    if z == 3 and not unsharded_in_pipeline(dims, ctx):
        return 0.0
    p, v = dims.pp, dims.v
    key = (z, dims.schedule, dims.recompute, v, n_layers, tuple(map(id, kinds)))
    if key not in cache:
        counts = chunk_counts(n_layers, p, v)
        out = 0.0
        for r in range(min(p, 2)):
            layers = [[None] * p for _ in range(v)]
            per_layer = []  # per chunk, its layers' seconds
            for c, (e, b, h) in enumerate(counts[r]):
                layers[c][r] = [kinds[0]] * e + [kinds[1]] * b + [kinds[2]] * h
                per_layer.append([lt[0]] * e + [lt[1]] * b + [lt[2]] * h)
            if z == 0 or uses_distributed_optimizer(ctx.stack, z):
                done = ("Bs", "W") if dims.schedule == "zb_h1" else ("B",)
                window = sum(n * sum(x[k] for k in done) for cnt in counts[r] for n, x in zip(cnt, lt))
                op = "all_reduce" if z == 0 else "reduce_scatter"
                out = max(out, tail_estimate(timer, r, layers, per_layer, dims, ctx, op, window))
            else:
                out = max(out, closed_form_tail(timer, r, layers, dims, ctx))
        cache[key] = (out, kinds)  # the kinds kept alive with their ids
    return cache[key][0]


def _ramp(lt, compositions, schedule, p, m, v, whole=False):
    """The closed form of a step's pipeline: the slowest rank's work per micro-batch ``t``
    (its layers' passes, counted as ``compositions`` holds them; ``lt`` per layer kind) over
    ``m v + p - 1`` chunk slots; ZB-H1 as :func:`emulator.accounting.pipeline.pipeline_bubble`
    times it (the weight gradients fill the ramp-down: ``m (F + B + W) + (p - 1)(F + B - W)``,
    B the input gradient alone, or the forward and B chain where too few micro-batches).
    ``whole`` (FSDP2 in a pipeline): each layer gathered once a step, its reduce-scatter
    after the flush (in the tail), not in each backward."""
    steps = []
    for cnt in compositions:
        f, b, w, ag, rs = (sum(k * x[key] for k, x in zip(cnt, lt)) for key in ("F", "Bs", "W", "ag", "rs"))
        gathers, scatters = (ag / m, 0.0) if whole else (2 * ag, rs)  # per micro-batch: once a step, or twice
        if schedule == "zb_h1":
            f += gathers
            w -= rs - scatters
            steps.append(max(m * (f + b + w) + (p - 1) * (f + b - w), (m + p - 1) * (f + b) + w))
        else:
            backward = sum(k * x["B"] for k, x in zip(cnt, lt)) - (rs - scatters)
            steps.append((f + backward + gathers) * (m * v + p - 1) / v)
    return max(steps)
