"""A plan's communication, axis by axis: every collective and transfer one rank makes in a
step (op, bytes per call, calls per step, link, seconds, seconds not hidden behind
compute), and the data-parallel work left after the pipeline drains.

Axes are named as the runtime's groups: ``tp``, ``cp``, ``pp``, ``ep``, ``dp,cp`` (dense
gradients reduce over the data- and context-parallel ranks together) and ``edp`` (the
ranks holding the same experts).
"""

from ..machine.work import AllToAll, Collective, RingAttention
from ..mesh import DATA_PARALLEL, REDUCED_OVER
from ..parallel.data_parallel.ladder import uses_distributed_optimizer
from ..parallel.pipeline.actions import destination, source
from ..parallel.pipeline.simulator import rank_end
from ..records.table import Table
from .memory import byte_sizes, unsharded_in_pipeline, zero3_gathers
from .overlap import gather_in_forward, replay
from .timing import action_durations



def link_of(ranks, gpus_per_node):
    nodes = {r // gpus_per_node for r in ranks}
    if len(nodes) == 1:
        return "nvlink"
    return "nic" if len(nodes) == len(ranks) else "nvlink+nic"


def _strategy_calls(layer, dims, m, ctx, groups, gathers):
    """(axis, op, bytes, calls per step) of the data-parallel strategy for one layer
    (``gathers``: how many of its passes gather it under ZeRO-3, :func:`~.memory.zero3_gathers`;
    FSDP2 in a pipeline reduce-scatters once, after the flush)."""
    scatters = 1 if unsharded_in_pipeline(dims, ctx) else m
    sizes = byte_sizes(ctx)
    out = []
    for group, elems in layer.params.items():
        if not elems:
            continue
        axis = REDUCED_OVER[group]
        n = len(groups[axis])
        if n == 1:
            continue
        full = -(-elems // n) * n
        rs, ag = full * sizes["reduce"], full * sizes["gather"]
        z = dims.zero_stage
        if z == 0:
            out.append((axis, "all_reduce", elems * sizes["reduce"], 1))
        if z == 1:
            out += [(axis, "reduce_scatter", rs, 1), (axis, "all_gather", ag, 1)]
        if z == 2:
            out += [(axis, "reduce_scatter", rs, m), (axis, "all_gather", ag, 1)]
        if z == 3:
            out += [(axis, "all_gather", ag, gathers), (axis, "reduce_scatter", rs, scatters)]
    if layer.partial and dims.tp > 1:
        out.append(("tp", "all_reduce", layer.partial * sizes["grads"], m))
    return out


def _layer_calls(layer, dims, m):
    passes = [layer.ops["F"], layer.ops["B"], layer.ops["W"]]
    if dims.recompute == "full":
        passes.append(layer.ops.get("F0", layer.ops["F"]))
    out = []
    for ops in passes:
        for op in ops:
            group = "cp" if getattr(op, "group", None) == "group" else getattr(op, "group", None)
            if isinstance(op, Collective):
                out.append((group, op.op, op.nbytes, m, op))
            elif isinstance(op, AllToAll):
                out.append((group, "all_to_all", op.bytes_per_peer, m, op))
            elif isinstance(op, RingAttention):
                steps = len(op.blocks)
                sends = steps - 1 if op.forward else 2 * steps - 1
                out.append((group, "send/recv (ring)", op.kv_bytes, m * sends, op))
    return out


def dp_tail(est, layers, per_layer, timer, timing, r, ctx, boundary):
    """Seconds rank r spends after its pipeline ends on data-parallel work: DDP's
    all-reduces that outlast backward (and what they delay, :mod:`.overlap`), ZeRO-1's
    reduce-scatters and ZeRO-1/2's all-gathers of the updated parameters."""
    dims = est.dims
    z, v = dims.zero_stage, dims.v
    end = rank_end(timing[r])
    groups = timer.groups(r)
    if z == 0:
        if all(len(groups[a]) == 1 for a in DATA_PARALLEL):
            return 0.0
        actions = [a for a, _, _ in timing[r]]
        host = action_durations(actions, per_layer[r], dims, host=True)
        return replay(timer, r, actions, timing, layers, dims, ctx,
                      lambda rank, a: _hop(timer, dims, boundary, rank, a), host) - end
    sizes = byte_sizes(ctx)
    if z == 1 and uses_distributed_optimizer(ctx.stack, z):
        if all(len(groups[a]) == 1 for a in DATA_PARALLEL):
            return 0.0
        actions = [a for a, _, _ in timing[r]]
        host = action_durations(actions, per_layer[r], dims, host=True)
        rs = replay(timer, r, actions, timing, layers, dims, ctx, lambda rank, a: _hop(timer, dims, boundary, rank, a),
                    host, op="reduce_scatter") - end
        layer_times = [[per_layer[r][c][j] for j in range(len(layers[c][r]))] for c in range(v)]
        return rs + gather_in_forward(timer, r, layers, layer_times, dims, ctx, sizes)
    return closed_form_tail(timer, r, layers, dims, ctx)


def closed_form_tail(timer, r, layers, dims, ctx):
    """Rank r's data-parallel tail where no bucket overlaps it (ZeRO-1 without the
    distributed optimizer: each layer's reduce-scatter and all-gather after backward; ZeRO-2:
    the all-gathers, its reduce-scatters having run in backward; FSDP2 in a pipeline: each
    layer's reduce-scatter, after the flush; 0 otherwise)."""
    z, groups, sizes = dims.zero_stage, timer.groups(r), byte_sizes(ctx)
    total = 0.0
    whole = unsharded_in_pipeline(dims, ctx)
    if z not in (1, 2) and not whole:
        return total
    for c in range(dims.v):
        for x in layers[c][r]:
            for group, elems in x.params.items():
                axis = REDUCED_OVER[group]
                n = len(groups[axis])
                if not elems or n == 1:
                    continue
                full = -(-elems // n) * n
                if z == 1 or whole:
                    total += timer.op(("c", "reduce_scatter", full * sizes["reduce"], axis), r)
                if not whole:
                    total += timer.op(("c", "all_gather", full * sizes["gather"], axis), r)
    return total


def comm_table(est, layers, per_layer, timer, timing, boundary, ctx, m_played):
    """(each pipeline rank's data-parallel tail in seconds, the communication table of the
    rank that finishes last). ``timing`` plays ``m_played`` micro-batches (sends are counted
    there and scaled to the plan's)."""
    dims, p, m = est.dims, est.dims.pp, est.dims.micro_batches
    tails = [dp_tail(est, layers, per_layer, timer, timing, r, ctx, boundary) for r in range(p)]
    pipe_end = [rank_end(timing[r]) for r in range(p)]
    r = max(range(p), key=lambda k: pipe_end[k] + tails[k])
    groups, g = timer.groups(r), timer.g
    overlapped = dims.zero_stage == 0 or uses_distributed_optimizer(ctx.stack, dims.zero_stage)
    rows = {}
    gathers = zero3_gathers(dims.schedule, p, m, dims.v, r, unsharded_in_pipeline(dims, ctx)) \
        if dims.zero_stage == 3 else [0] * dims.v

    def add(axis, op, nbytes, count, seconds, exposed):
        key = (axis, op, int(nbytes))
        row = rows.setdefault(key, {"axis": axis, "op": op, "bytes": int(nbytes), "count": 0,
                                    "link": link_of(groups[axis] if axis in groups else (), g),
                                    "seconds": 0.0, "exposed": 0.0})
        row["count"] += count
        row["seconds"] += seconds
        row["exposed"] += exposed

    for c in range(dims.v):
        for x in layers[c][r]:
            for axis, op, nbytes, count, raw in _layer_calls(x, dims, m):
                if len(groups[axis]) > 1:
                    t = timer.op(raw, r) * m
                    add(axis, op, nbytes, count, t, t)
            for axis, op, nbytes, count in _strategy_calls(x, dims, m, ctx, groups, gathers[c]):
                t = timer.op(("c", op, nbytes, axis), r) * count
                add(axis, op, nbytes, count, t, 0.0 if (axis != "tp" and overlapped) else t)
    if p > 1:
        sends = sum(1 for a, _, _ in timing[r] if a.kind in ("F", "B") and _crosses(a, r, p, dims.v)) * m // m_played
        hop = max(timer.p2p(boundary, r, (r + 1) % p), timer.p2p(boundary, r, (r - 1) % p))
        add("pp", "send/recv", boundary, sends, sends * hop, sends * hop)
    if overlapped:
        for row in rows.values():
            if row["axis"] in DATA_PARALLEL:
                row["exposed"] = tails[r] * row["seconds"] / max(1e-30, sum(
                    x["seconds"] for x in rows.values() if x["axis"] in DATA_PARALLEL))
    table = Table(sorted(rows.values(), key=lambda x: ("tp", "cp", "ep", "pp", *DATA_PARALLEL).index(x["axis"])),
                  byte_columns=["bytes"])
    table.rank = r  # the pipeline rank it describes
    return tails, table


def expose_as_breakdown(table, parts, data_parallel=False):
    """Set the exposed seconds of the layers' model-parallel collectives (``tp``, ``cp``,
    ``ep``) to their axis's part of the step's breakdown (:mod:`.breakdown`), split over the
    axis's rows by their seconds: how much Transformer Engine's overlap or a ring's
    attention blocks hide is the breakdown's account, and the table says the same. With
    ``data_parallel`` (FSDP's prefetch) the data-parallel rows too, from its ``dp`` part."""
    axes = [(axis, (axis,)) for axis in ("tp", "cp", "ep")] + ([("dp", DATA_PARALLEL)] if data_parallel else [])
    for part, names in axes:
        rows = [x for x in table if x["axis"] in names]
        total = sum(x["seconds"] for x in rows)
        for x in rows:
            x["exposed"] = parts.get(part, 0.0) * x["seconds"] / total if total else 0.0


def _hop(timer, dims, boundary, r, action):
    """(seconds, port kinds) of the transfer that brings ``action`` its input, or (0, None)."""
    src = source(dims.pp, dims.v, r, action)
    if src is None:
        return 0.0, None
    src = src[0]
    per = dims.dp * dims.cp * dims.tp
    crosses = (src * per) // timer.g != (r * per) // timer.g
    return timer.p2p(boundary, src, r), frozenset({"nic" if crosses else "nvlink"})


def _crosses(action, r, p, v):
    """Whether ``action``'s output goes to another pipeline rank."""
    dst = destination(p, v, r, action)
    return dst is not None and dst[0] != r
