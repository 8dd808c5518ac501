"""Step time of a plan, as the emulator's clock would give it.

Three parts, each what the emulator does:

1. **A layer's passes** (:func:`layer_times`): its ops (:mod:`.layers`) in order on the
   compute stream, kernels at the device's rates (:meth:`emulator.machine.device.Device.time`),
   each blocking collective for its closed-form time (:func:`emulator.cost.collective_time`,
   which agrees with the engine), all-to-alls pairwise and ring attention step by step;
   plus what the data-parallel strategy does per layer (ZeRO-3 gathers the layer before
   forward and backward, ZeRO-2/3 reduce-scatter its gradient every micro-batch) and the
   tensor-parallel sum of partial gradients under sequence parallelism.
2. **The pipeline** (:func:`simulate`): the schedule's actions per rank, each as long as
   its layers' passes; a micro-batch's activations or gradients cross to the next stage
   point to point once the receiver asks for them (a rank posts its receive when it
   reaches the action that needs it, as the executor does), taking the link's time.
3. **The data-parallel tail**: DDP's bucket all-reduces, each started when its layer's
   last gradient is in and queued on the group's stream behind the previous one; ZeRO-1's
   reduce-scatter and ZeRO-1/2's all-gather of the updated parameters after the pipeline.

What it leaves out: messages of different groups that share a port (a NIC carrying a
pipeline send and a data-parallel all-reduce at once) are timed as if alone; the emulator
books ports and makes one wait.
"""

from functools import lru_cache

import numpy as np

from ..cost import RING_STEPS, all_to_all_time, collective_time, p2p_time
from ..machine.comm_overlap import contention, pipelined, ring_exchange, sm_slowdown
from ..machine.work import AllToAll, Collective, RingAttention, is_kernel
from .memory import byte_sizes, zero3_held


class Ranks(tuple):
    """A group's global ranks; its hash is computed once (groups of thousands of ranks key
    the caches below)."""

    def __hash__(self):
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = tuple.__hash__(self)
        return h

    __eq__ = tuple.__eq__


class _Groups(dict):
    """A stage representative's groups, each built the first time it is asked for."""

    def __init__(self, dims, stage, g):
        super().__init__()
        per_stage = dims.dp * dims.cp * dims.tp
        rep = stage * per_stage
        self.shift = rep - rep % g  # whole nodes: the same layout, one cache entry
        self.base, self.dims = rep - self.shift, dims

    def __missing__(self, name):
        d, base = self.dims, self.base
        if name == "tp":
            out = tuple(range(base, base + d.tp))
        elif name == "pp":
            out = tuple(k * d.dp * d.cp * d.tp - self.shift for k in range(d.pp))
        else:
            flat = range(base, base + d.dp * d.cp * d.tp, d.tp)  # dp x cp, cp fastest
            out = tuple({"cp": flat[:d.cp], "dp": flat[::d.cp], "dp,cp": flat, "ep": flat[:d.ep],
                         "edp": flat[::d.ep]}[name])
        out = self[name] = Ranks(out)
        return out


class Timer:
    """Times the declared items of one pipeline stage's ranks (its representative's groups)
    on the cluster, as ``stack`` runs them."""

    def __init__(self, cluster, dims, stack):
        self.topology, self.device, self.dims, self.stack = cluster.topology, cluster.device, dims, stack
        self.g = cluster.topology.gpus_per_node
        self._groups, self._ops = {}, {}

    def stage_key(self, r):
        """Stages whose groups sit alike on nodes share one key (and cached times)."""
        per_stage = self.dims.dp * self.dims.cp * self.dims.tp
        return 0 if per_stage % self.g == 0 else r

    def groups(self, r):
        """The global ranks of each group of pipeline rank r's representative (coordinates
        pp=r, dp=cp=tp=0; axes pp, dp, cp, tp, tp innermost: ``ParallelDims.groups_of``),
        shifted by whole nodes (the same layout); ``pp`` is stage 0's. Built when asked."""
        key = self.stage_key(r)
        if key not in self._groups:
            self._groups[key] = _Groups(self.dims, key, self.g)
        return self._groups[key]

    def op(self, op, r):
        key = (op, self.stage_key(r))
        hit = self._ops.get(key)
        if hit is None:
            hit = self._ops[key] = self._time(op, r)
        return hit

    def _time(self, op, r):
        if is_kernel(op):
            return _kernel_time(self.device, op) + (self.stack.launch if op.kind == "memory" else 0.0)
        if isinstance(op, tuple):  # ("c", op, nbytes, axis): a data-parallel strategy's collective
            ranks = self.groups(r)[op[-1]]
            return 0.0 if len(ranks) == 1 else _collective(op[1], op[2], ranks, self.topology)
        ranks = self.groups(r)[_role(op.group)]
        if len(ranks) == 1:
            return 0.0
        if isinstance(op, Collective):
            return _collective(op.op, op.nbytes, ranks, self.topology)
        if isinstance(op, AllToAll):
            return _all_to_all(op.bytes_per_peer, ranks, self.topology)
        if isinstance(op, RingAttention):
            return _ring(op.forward, op.steps, ranks, self.topology)
        raise ValueError(f"unknown op {op!r}")

    def ops(self, ops, r):
        """GPU seconds of a pass's items in order on the compute stream (each collective
        waited for, or pipelined with the GEMM beside it where Transformer Engine does so:
        :mod:`emulator.machine.comm_overlap`); the host's are :meth:`host`."""
        return sum(self.categories(ops, r).values())

    def categories(self, ops, r):
        """:meth:`ops`'s seconds by where they go: ``gemm``, ``attention``, ``memory`` (the
        kernels' own time) and, per group, the collectives' time no kernel hides (an
        overlapped pair's time beyond its GEMM's; ring attention's beyond its kernels)."""
        out = {}

        def add(key, t):
            out[key] = out.get(key, 0.0) + t

        i, n = 0, len(ops)
        while i < n:
            o = ops[i]
            nxt = ops[i + 1] if i + 1 < n else None
            ov = getattr(o, "overlap", None)
            if ov and ov[0] == "ring_exchange" and getattr(nxt, "kind", None) == "gemm":
                g = self.op(nxt, r)
                add("gemm", g)
                add(_role(o.group), ring_exchange(g, self.op(o, r), ov[1]) - g)
                i += 2
                continue
            nov = getattr(nxt, "overlap", None)
            if getattr(o, "kind", None) == "gemm" and nov and nov[0] == "pipeline":
                g = self.op(o, r)
                add("gemm", g)
                add(_role(nxt.group), pipelined(g * sm_slowdown(self.device.sms, nov[2]), self.op(nxt, r), nov[1]) - g)
                i += 2
                continue
            t = self.op(o, r)
            if is_kernel(o):
                add(o.kind, t)
            elif isinstance(o, RingAttention):
                k = sum(self.op(x, r) for kernels, _ in o.steps for x in kernels)
                add("attention", min(k, t))
                add(_role(o.group), max(0.0, t - k))
            else:
                add(_role(o.group), t)
            i += 1
        return out

    def bulk_saving(self, layer, r):
        """Seconds an unsplit backward saves by running each part's all-gather of its input
        beside its input-gradient GEMM, and its input gradient's reduce-scatter beside its
        weight-gradient GEMMs (as :class:`emulator.parallel.tp_regions.ColumnThenRow` does),
        the GEMMs slowed by the SMs TE's bulk overlap takes."""
        b, w = layer.ops["B"], layer.ops["W"]
        saving = 0.0
        for part in ("attention", "mlp"):
            again = [x for x in w if getattr(x, "overlap", None) and x.overlap[0] == "bulk" and
                     x.name.startswith(part + ":")]
            grad = [x for x in b if getattr(x, "overlap", None) and x.overlap[0] == "bulk" and
                    x.name.startswith(part + ":")]
            if not (again or grad):
                continue
            sms = (again or grad)[0].overlap[1]
            slow = sm_slowdown(self.device.sms, sms)
            dgrad = sum(self.op(x, r) for x in b if getattr(x, "kind", None) == "gemm" and
                        x.name.startswith((f"{part}: qkv dgrad", f"{part}: fc1 dgrad")))
            wgrads = sum(self.op(x, r) for x in w if getattr(x, "kind", None) == "gemm" and x.name.startswith(part))
            for comm, gemm in ((again, dgrad), (grad, wgrads)):
                if comm:
                    c = self.op(comm[0], r)
                    saving += c + gemm - max(gemm * slow, c)
        return saving

    def host(self, ops):
        """Host seconds to issue a pass's items: ``stack.dispatch`` each (the emulator's clock
        starts no kernel before the host issued it: :meth:`emulator.engine.clock.Clock.kernels`)."""
        return sum(sum(len(k) for k, _ in o.steps) if isinstance(o, RingAttention) else 1 for o in ops) * \
            self.stack.dispatch

    def p2p(self, nbytes, r_src, r_dst):
        per_stage = self.dims.dp * self.dims.cp * self.dims.tp
        return p2p_time(nbytes, r_src * per_stage, r_dst * per_stage, self.topology)


@lru_cache(maxsize=1 << 16)
def _kernel_time(device, kernel):
    return device.time(kernel)


def _role(group):
    """The planner's name of a declared group: the MoE token group's ranks are cp's."""
    return "cp" if group == "group" else group


@lru_cache(maxsize=8192)
def _collective(op, nbytes, ranks, topology):
    return ring_collective_time(op, nbytes, ranks, topology)


def ring_collective_time(op, nbytes, ranks, topology):
    """:func:`emulator.cost.ring_time` for a group laid out alike on every node it spans
    (the same GPUs of each node, as mesh groups are), from its per-port loads in closed
    form instead of ring by ring: thousands of ranks cost what eight do. Any other group
    goes to :func:`emulator.cost.collective_time`."""
    loads = _ring_loads(ranks, topology) if op in RING_STEPS else None
    if loads is None:
        return collective_time(op, nbytes, list(ranks), topology)
    n, c = len(ranks), topology.channels
    piece = nbytes / (n * c)
    return RING_STEPS[op](n) * max(link.alpha + count * piece / link.beta for link, count in loads)


@lru_cache(maxsize=4096)
def _ring_loads(ranks, topology):
    """(link, pieces per step) of every port a ring collective over ``ranks`` uses, or None
    for a group laid out unevenly over its nodes."""
    n, c, g = len(ranks), topology.channels, topology.gpus_per_node
    by_node = {}
    for r in sorted(ranks):
        by_node.setdefault(r // g, []).append(r % g)
    layouts = {tuple(v) for v in by_node.values()}
    if n == 1 or len(layouts) != 1:
        return None
    local = layouts.pop()
    k, nodes = len(local), len(by_node)
    nvl, nic = topology.nvlink, topology.nic
    if nodes == 1:  # every channel's ring passes through every member's NVLink
        return ((nvl, c),)
    d = min(c, k)  # rings rotated to leave each node from a different member
    exits, enters = [0] * k, [0] * k
    for j in range(d):
        channels = (j + 1) * c // d - j * c // d
        exits[(j - 1) % k] += channels
        enters[j % k] += channels
    per_nic = g // topology.nics_per_node
    nic_out, nic_in = {}, {}
    for i, pos in enumerate(local):
        nic_out[pos // per_nic] = nic_out.get(pos // per_nic, 0) + exits[i]
        nic_in[pos // per_nic] = nic_in.get(pos // per_nic, 0) + enters[i]
    loads = {(nic, x) for x in list(nic_out.values()) + list(nic_in.values()) if x}
    loads |= {(nvl, c - x) for x in exits + enters if c - x}
    return tuple(loads)


@lru_cache(maxsize=2048)
def _all_to_all(piece, ranks, topology):
    """Every send and receive in flight at once, as NCCL groups them: the busiest port's
    time (:func:`emulator.cost.all_to_all_time`), ``piece`` bytes between every pair."""
    n = len(ranks)
    return all_to_all_time(np.full((n, n), float(piece)), ranks, topology)


@lru_cache(maxsize=2048)
def _ring(forward, steps, ranks, topology):
    """Ring attention: each step computes one K/V block while the next travels; backward
    then sends the block's dK/dV on (:mod:`emulator.parallel.context_parallel.ring`).
    ``steps`` repeat one value after the first, so the sum is taken in closed form."""
    n = len(ranks)
    crosses = len({r // topology.gpus_per_node for r in ranks}) > 1
    hop = (topology.nic if crosses else topology.nvlink).time(steps[0][1])
    back = 0.0 if forward else hop

    def step(kernels, shift):
        return max(sum(topology.device.time(k) for k in kernels), shift) + back

    first = step(steps[0][0], hop if n > 1 else 0.0)
    if n == 1:
        return first
    middle = step(steps[1][0], hop) * (n - 2) if all(f == steps[1][0] for f, _ in steps[1:]) else \
        sum(step(f, hop) for f, _ in steps[1:-1])
    return first + middle + step(steps[-1][0], 0.0)


# ----------------------------------------------------------------- one layer's passes
def layer_times(timer, layer, r, dims, ctx):
    """Seconds of one layer's passes on pipeline rank r: ``F``, ``B`` (unsplit: input and
    weight gradients), ``Bs`` (a split backward's input gradient), ``W``, with the
    strategy's per-layer collectives; ``ag``: ZeRO-3's gather of the layer, paid before a
    pass unless the layer is still gathered."""
    z = dims.zero_stage
    sizes = byte_sizes(ctx)
    ag = rs = 0.0
    for group, elems in layer.params.items():
        axis = "dp,cp" if group == "dense" else "edp"
        n = len(timer.groups(r)[axis])
        if not elems or n == 1:
            continue
        full = -(-elems // n) * n
        if z == 3:
            ag += timer.op(("c", "all_gather", full * sizes["gather"], axis), r)
        if z >= 2:
            rs += timer.op(("c", "reduce_scatter", full * sizes["reduce"], axis), r)
    partial = timer.op(("c", "all_reduce", layer.partial * sizes["grads"], "tp"), r) \
        if layer.partial and dims.tp > 1 else 0.0
    f, again, b, w = _passes(timer, layer, r, dims.recompute == "full")
    hf, h_again, hb, hw = _host(timer, layer, dims.recompute == "full")
    saved = timer.bulk_saving(layer, r) if layer.name == "block" and dims.schedule != "zb_h1" else 0.0
    return {"F": f, "B": again + b + w + partial + rs - saved, "rs": rs, "Bs": again + b, "W": w + partial + rs, "ag": ag,
            "host F": hf, "host B": h_again + hb + hw, "host Bs": h_again + hb, "host W": hw}


def _host(timer, layer, recompute):
    ops = layer.ops
    again = timer.host(ops.get("F0", ops["F"])) if recompute else 0.0
    return timer.host(ops["F"]), again, timer.host(ops["B"]), timer.host(ops["W"])


def _passes(timer, layer, r, recompute):
    """Seconds of the layer's own ops per pass (F, F again under full recomputation, B,
    W), kept on the layer for the groups that time them."""
    groups = timer.groups(r)
    key = (timer.topology, groups["tp"], groups["cp"], groups["ep"], recompute)
    if key not in layer.times:
        ops = layer.ops
        again = timer.ops(ops.get("F0", ops["F"]), r) if recompute else 0.0
        layer.times[key] = (timer.ops(ops["F"], r), again, timer.ops(ops["B"], r), timer.ops(ops["W"], r))
    return layer.times[key]


def action_durations(actions, per_layer, dims, host=False, prefetch=False):
    """Seconds of each of one rank's actions (``per_layer[c]``: its chunks' layer times):
    the GPU's, or (``host=True``) the host's to issue them. ``prefetch`` (ZeRO-3 as FSDP2
    runs it): a layer's all-gather runs while the layer before it computes, its
    reduce-scatter while the layer after it in backward does (:func:`prefetched`)."""
    split = dims.schedule == "zb_h1"
    pairs = [(a.kind, a.chunk) for a in actions]
    held = zero3_held(pairs, split) if dims.zero_stage == 3 else [(False, True)] * len(pairs)
    memo, out = {}, []
    for (kind, c), (h, _) in zip(pairs, held):
        key = (kind, c, h)
        if key not in memo:
            ts = per_layer[c]
            name = "F" if kind == "F" else "W" if kind == "W" else ("Bs" if split else "B")
            if host:
                memo[key] = sum(t["host " + name] for t in ts)
            elif prefetch and dims.zero_stage == 3 and kind != "W":
                memo[key] = prefetched(ts, name, h)
            else:
                gather = 0.0 if (h or kind == "W") else sum(t["ag"] for t in ts)
                memo[key] = sum(t[name] for t in ts) + gather
        out.append(memo[key])
    return out


def prefetched(ts, name, held):
    """A chunk's forward or backward under FSDP2's prefetch (:class:`emulator.parallel.zero3.ZeRO3`
    with ``prefetch``): each layer's gather starts as the layer before it (in the pass's
    order) starts computing, so only what outlasts that layer shows; each layer's
    reduce-scatter runs beside the next layer's backward, the last one after; the compute
    beside them slowed as beside any NCCL kernel (:data:`emulator.machine.comm_overlap.NCCL_CONTENTION`)."""
    order = ts if name == "F" else ts[::-1]
    compute = [t[name] - (t["rs"] if name != "F" else 0.0) for t in order]
    total = sum(compute)
    for i, t in enumerate(order):
        if not held:
            ag = t["ag"]
            before = compute[i - 1] if i else 0.0
            total += max(0.0, ag - before) + contention(min(ag, before))
        if name != "F":
            rs = t["rs"]
            after = compute[i + 1] if i + 1 < len(order) else 0.0
            total += max(0.0, rs - after) + contention(min(rs, after))
    return total
