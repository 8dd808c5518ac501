"""DDP's gradient all-reduces and the work they overlap.

DDP starts a layer's all-reduce as soon as its last micro-batch's gradient is in, on the
data-parallel group's own stream, while backward goes on. The emulator books every
operation on the ports it uses (:mod:`emulator.machine.links`): when the all-reduce and a
blocking collective of the backward (tensor parallelism's, an all-to-all, a pipeline
transfer) need the same kind of port, the later one waits for the earlier to finish.
:func:`replay` plays a rank's actions from the first one that starts an all-reduce to the
end, op by op, with the ports of the two kinds (NVLink, NIC) this rank uses, and returns
when the rank is done.
"""

from bisect import insort

from ..machine.work import dtype_bytes, is_comm
from ..mesh import REDUCED_OVER
from ..parallel.data_parallel.buckets import bucket_layers, bucket_limit
from .memory import byte_sizes


def port_kinds(ranks, gpus_per_node):
    """The ports a collective over ``ranks`` takes on each member: NVLink inside a node,
    the NIC between nodes (rings cross nodes on every GPU's NIC, channel by channel)."""
    nodes = {r // gpus_per_node for r in ranks}
    kinds = set()
    if len(nodes) > 1:
        kinds.add("nic")
    if len(nodes) < len(ranks):
        kinds.add("nvlink")
    return frozenset(kinds)


class Ports:
    """Busy spans of this rank's NVLink and NIC ports; an op takes the earliest time all
    its ports are free for its whole length (earlier gaps used when long enough)."""

    def __init__(self):
        self.spans = {"nvlink": [], "nic": []}
        self.until = {"nvlink": 0.0, "nic": 0.0}

    def place(self, kinds, duration, t0):
        if all(self.until[k] <= t0 for k in kinds):  # nothing booked after t0
            return t0
        t, moved = t0, True
        while moved:
            moved = False
            for k in kinds:
                for s, e in self.spans[k]:
                    if s < t + duration and e > t:
                        t, moved = e, True
        return t

    def book(self, kinds, start, end):
        for k in kinds:
            insort(self.spans[k], (start, end))
            self.until[k] = max(self.until[k], end)


def replay(timer, r, actions, timing, layers, dims, ctx, hop, host_seconds=None, op="all_reduce"):
    """(end of rank r's step, when its pipeline would end without the all-reduces):
    its actions replayed from the first that starts an all-reduce. ``host_seconds``: the
    host's time to issue each action (it never waits within a step, so at the first
    replayed action it has issued everything before). ``op``: what each full bucket starts
    (DDP's all-reduce; Megatron's distributed optimizer's reduce-scatter)."""
    split = dims.schedule == "zb_h1"
    done_kind = "W" if split else "B"
    last = {}
    for i, a in enumerate(actions):
        if a.kind == done_kind:
            last[a.chunk] = i
    sizes = byte_sizes(ctx)
    groups, g = timer.groups(r), timer.g
    kinds = {name: port_kinds(ranks, g) for name, ranks in groups.items()}
    first = min(last.values())
    starts = {i: s for i, (_, s, _) in enumerate(timing[r])}
    t = timing[r][first - 1][2] if first else 0.0
    host = t  # the host's clock: each op waits for its issue (as the emulator's: Timer.host)
    ports, stream, finish = Ports(), {}, 0.0
    buckets, waiting = _buckets(layers, r, dims, ctx, op)  # per (chunk, layer): its bucket; layers each waits for

    def blocking(op):
        run_steps([(timer.op(op, r), kinds[op[-1]], 0.0)])

    def run_steps(steps):
        nonlocal t, host
        for sec, k, issue in steps:
            host += issue
            t = t if t >= host else host
            if k:
                t = ports.place(k, sec, t)
                ports.book(k, t, t + sec)
            t += sec

    def steps_of(x, name):  # the pass's ops as (seconds, ports or None, host seconds); kept on the layer
        key = ("steps", name, timer.topology, groups["tp"], groups["cp"], groups["ep"])
        if key not in x.times:
            out = []
            for op in x.ops.get(name, x.ops["F"]):
                sec = timer.op(op, r)
                ports_of = kinds["cp" if op.group == "group" else op.group] if (is_comm(op) and sec) else None
                out.append((sec, ports_of, timer.host((op,))))
            x.times[key] = tuple(out)
        return x.times[key]

    for i in range(first, len(actions)):
        a = actions[i]
        sec, hop_kinds = hop(r, a)
        if sec:  # its input crosses from another rank, once both sides are ready
            t = ports.place(hop_kinds, sec, max(t, starts[i] - sec))
            ports.book(hop_kinds, t, t + sec)
            t += sec
        if i == first:
            t = max(t, starts[i])
            host = sum(host_seconds[:first]) if host_seconds is not None else t
        chunk = layers[a.chunk][r]
        order = range(len(chunk)) if a.kind == "F" else reversed(range(len(chunk)))
        for j in order:
            x = chunk[j]
            passes = {"F": ["F"], "W": ["W"], "B": (["F0"] if dims.recompute == "full" else []) +
                      (["B"] if split else ["B", "W"])}[a.kind]
            for name in passes:
                run_steps(steps_of(x, name))
            if a.kind == done_kind and x.partial and dims.tp > 1:
                blocking(("c", "all_reduce", x.partial * sizes["grads"], "tp"))
            if a.kind == done_kind and i == last[a.chunk]:  # the layer's last gradient: its bucket may be full
                b = buckets[(a.chunk, j)]
                waiting[b] -= 1
                if waiting[b]:
                    continue
                for axis, sec in bucket_seconds(timer, r, b, buckets, sizes, op).items():
                    start = ports.place(kinds[axis], sec, max(t, stream.get(axis, 0.0)))
                    ports.book(kinds[axis], start, start + sec)
                    stream[axis] = start + sec
                    finish = max(finish, start + sec)
    return max(t, finish, timing[r][-1][2])


def _buckets(layers, r, dims, ctx, op="all_reduce"):
    """The buckets of rank r's layers (:mod:`emulator.parallel.data_parallel.buckets`; DDP's by the
    weights' bytes, the distributed optimizer's by parameters): {(chunk, layer): bucket},
    and how many layers each bucket waits for."""
    v = len(layers)
    order = [(c, j) for c in reversed(range(v)) for j in reversed(range(len(layers[c][r])))]
    per = dtype_bytes(ctx.dtype("params")) if op == "all_reduce" else 1
    limit, first = bucket_limit(ctx.stack, dims.dp * dims.cp, r, per)
    nbytes = [sum(layers[c][r][j].params.values()) * per for c, j in order]
    out, waiting = {}, {}
    for b, members in enumerate(bucket_layers(nbytes, limit, first)):
        for k in members:
            out[order[k]] = b
        waiting[b] = len(members)
    out["_layers"] = {order[k]: layers[order[k][0]][r][order[k][1]] for k in range(len(order))}
    return out, waiting


def _bucket_bytes(b, buckets, sizes, op, groups):
    """{group axis: bytes} bucket ``b`` reduces (a reduce-scatter's padded to its group)."""
    out = {}
    for key, x in buckets["_layers"].items():
        if buckets[key] == b:
            for group, elems in x.params.items():
                axis = REDUCED_OVER[group]
                n = len(groups[axis])
                count = elems if op == "all_reduce" else -(-elems // n) * n
                out[axis] = out.get(axis, 0) + count * sizes["reduce"]
    return out


def bucket_seconds(timer, r, b, buckets, sizes, op):
    """{group axis: seconds} of bucket ``b``'s collective ``op`` on rank r, over each
    data-parallel axis of more than one rank."""
    groups = timer.groups(r)
    return {axis: timer.op(("c", op, nbytes, axis), r)
            for axis, nbytes in _bucket_bytes(b, buckets, sizes, op, groups).items()
            if nbytes and len(groups[axis]) > 1}


def bucket_gathers(timer, r, buckets, sizes):
    """Seconds of each bucket's parameter all-gathers on rank r (one per layer and group)."""
    groups = timer.groups(r)
    gather = [0.0] * (1 + max(v for k, v in buckets.items() if k != "_layers"))
    for (c, j), x in buckets["_layers"].items():
        for group, elems in x.params.items():
            axis = REDUCED_OVER[group]
            n = len(groups[axis])
            if elems and n > 1:
                gather[buckets[(c, j)]] += timer.op(("c", "all_gather", -(-elems // n) * n * sizes["gather"], axis), r)
    return gather


def last_bucket_seconds(timer, r, layers, dims, ctx, op):
    """What no schedule hides of rank r's data-parallel tail (a lower bound on
    :func:`~emulator.planner.comm.dp_tail` where it replays, for the exhaustive search):
    the last bucket (the one holding chunk 0's first layer, whose last gradient comes with
    the rank's last action) starts its ``op`` no earlier than the pipeline ends, so its
    longest axis is exposed; under the distributed optimizer its parameter all-gather
    also comes whole before the next forward (:func:`gather_in_forward`)."""
    buckets, _ = _buckets(layers, r, dims, ctx, op)
    sizes = byte_sizes(ctx)
    last = buckets[(0, 0)]
    out = max(bucket_seconds(timer, r, last, buckets, sizes, op).values(), default=0.0)
    return out + (bucket_gathers(timer, r, buckets, sizes)[last] if op == "reduce_scatter" else 0.0)


def tail_estimate(timer, r, layers, per_layer, dims, ctx, op, window):
    """An estimate of rank r's data-parallel tail (not a bound: :func:`~.ranking.search`'s
    closed form): the buckets' ``op``, one after another on each axis, issued during the
    ``window`` seconds of the last micro-batch's backward, so what outlasts it shows (at
    least the last bucket's); under the distributed optimizer (``op="reduce_scatter"``) the
    parameter all-gathers the next forward waits for (:func:`gather_in_forward`;
    ``per_layer[c][j]``: layer j of chunk c's seconds, as ``dp_tail`` reads them)."""
    buckets, _ = _buckets(layers, r, dims, ctx, op)
    sizes = byte_sizes(ctx)
    per_axis = {}
    for b in set(v for k, v in buckets.items() if k != "_layers"):
        for axis, sec in bucket_seconds(timer, r, b, buckets, sizes, op).items():
            per_axis[axis] = per_axis.get(axis, 0.0) + sec
    last = max(bucket_seconds(timer, r, buckets[(0, 0)], buckets, sizes, op).values(), default=0.0)
    out = max(last, max(per_axis.values(), default=0.0) - window)
    if op == "reduce_scatter":
        out += gather_in_forward(timer, r, layers, per_layer, dims, ctx, sizes)
    return out


def gather_in_forward(timer, r, layers, per_layer, dims, ctx, sizes):
    """Seconds a distributed optimizer's parameter all-gathers add to rank r's first
    forward: each bucket's is waited for before its first layer, the next one then issued
    (:class:`emulator.parallel.data_parallel.distributed_optimizer.DistributedOptimizer`): the first
    bucket's whole, each next one's beyond the forward of the bucket before."""
    buckets, _ = _buckets(layers, r, dims, ctx, "reduce_scatter")
    gather = bucket_gathers(timer, r, buckets, sizes)
    n_buckets = len(gather)
    forward = [0.0] * n_buckets
    for (c, j), x in buckets["_layers"].items():
        forward[buckets[(c, j)]] += per_layer[c][j]["F"]
    order = list(reversed(range(n_buckets)))  # forward meets the last bucket (the first layers) first
    exposed = gather[order[0]]
    for a, b in zip(order, order[1:]):
        exposed += max(0.0, gather[b] - forward[a])
    return exposed
