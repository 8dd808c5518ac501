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

from ..cost import collective_time, p2p_time
from ..parallel.pipeline.actions import place_of, stage_of


class Timer:
    """Times ops for the ranks of one pipeline stage (its representative's groups)."""

    def __init__(self, cluster, dims):
        self.topology, self.device, self.dims = cluster.topology, cluster.device, dims
        self.g = cluster.topology.gpus_per_node
        self._groups = {}

    def groups(self, r):
        """The global ranks of each group of pipeline rank r's representative."""
        if r not in self._groups:
            rep = r * self.dims.dp * self.dims.cp * self.dims.tp
            found = self.dims.groups_of(rep, self.g)
            shift = rep - rep % self.g  # whole nodes: the same layout, one cache entry
            self._groups[r] = {k: tuple(x - shift for x in v) for k, v in found.items()}
        return self._groups[r]

    def op(self, op, r):
        kind = op[0]
        if kind == "k":
            return _kernel_time(self.device, op[1])
        if kind == "ke":
            return sum(_kernel_time(self.device, k) for k in op[1])
        if kind == "flops":
            return op[1] / self.topology.flops
        ranks = self.groups(r)[op[-1]]
        if len(ranks) == 1:
            return 0.0
        if kind == "c":
            return _collective(op[1], op[2], ranks, self.topology)
        if kind == "a2a":
            return _all_to_all(op[1], ranks, self.topology)
        if kind == "ring":
            return _ring(op[1], op[2], ranks, self.topology)
        raise ValueError(f"unknown op {op!r}")

    def ops(self, ops, r):
        return sum(self.op(o, r) for o in ops)

    def p2p(self, nbytes, r_src, r_dst):
        per_stage = self.dims.dp * self.dims.cp * self.dims.tp
        return p2p_time(nbytes, r_src * per_stage, r_dst * per_stage, self.topology)


@lru_cache(maxsize=4096)
def _kernel_time(device, kernel):
    return device.time(kernel)


@lru_cache(maxsize=8192)
def _collective(op, nbytes, ranks, topology):
    return collective_time(op, nbytes, list(ranks), topology)


def _link(a, b, topology):
    return topology.link(a, b)


@lru_cache(maxsize=2048)
def _all_to_all(piece, ranks, topology):
    """Pairwise exchange: n - 1 steps, each as long as its slowest message
    (:mod:`emulator.algorithms.all_to_all`)."""
    n = len(ranks)
    return sum(max(_link(ranks[i], ranks[(i + s) % n], topology).time(piece) for i in range(n))
               for s in range(1, n))


@lru_cache(maxsize=2048)
def _ring(forward, steps, ranks, topology):
    """Ring attention: each step computes one K/V block while the next travels; backward
    then sends the block's dK/dV on (:mod:`emulator.parallel.context_parallel.ring`)."""
    n = len(ranks)
    hop = max(_link(ranks[i], ranks[(i + 1) % n], topology).time(steps[0][1]) for i in range(n))
    total = 0.0
    for t, (flops, _) in enumerate(steps):
        compute = flops / topology.flops
        shift = hop if t < n - 1 else 0.0
        total += max(compute, shift) + (0.0 if forward else hop)
    return total


# ----------------------------------------------------------------- one layer's passes
def layer_times(timer, layer, r, dims, param_bytes):
    """Seconds of one layer's passes on pipeline rank r: ``F``, ``B`` (unsplit: input and
    weight gradients), ``Bs`` (a split backward's input gradient), ``W``, with the
    strategy's per-layer collectives; ``ag``: ZeRO-3's gather of the layer, paid before a
    pass unless the layer is still gathered."""
    z = dims.zero_stage
    ag = rs = 0.0
    for group, elems in layer.params.items():
        axis = "dp,cp" if group == "dense" else "edp"
        n = len(timer.groups(r)[axis])
        if not elems or n == 1:
            continue
        full = -(-elems // n) * n * param_bytes
        if z == 3:
            ag += timer.op(("c", "all_gather", full, axis), r)
        if z >= 2:
            rs += timer.op(("c", "reduce_scatter", full, axis), r)
    partial = timer.op(("c", "all_reduce", layer.partial * param_bytes, "tp"), r) if layer.partial and dims.tp > 1 \
        else 0.0
    f = timer.ops(layer.ops["F"], r)
    again = timer.ops(layer.ops.get("F0", layer.ops["F"]), r) if dims.recompute == "full" else 0.0
    b = timer.ops(layer.ops["B"], r)
    w = timer.ops(layer.ops["W"], r)
    return {"F": f, "B": again + b + w + partial + rs, "Bs": again + b, "W": w + partial + rs, "ag": ag}


def action_durations(actions, per_layer, dims):
    """Seconds of each of one rank's actions (``per_layer[c]``: its chunks' layer times)."""
    from .memory import zero3_held

    split = dims.schedule == "zb_h1"
    out = []
    pairs = [(a.kind, a.chunk) for a in actions]
    for (kind, c), (held, _) in zip(pairs, zero3_held(pairs, split)):
        ts = per_layer[c]
        key = "F" if kind == "F" else "W" if kind == "W" else ("Bs" if split else "B")
        gather = 0.0 if (held or kind == "W") else sum(t["ag"] for t in ts)
        out.append(sum(t[key] for t in ts) + gather)
    return out


# ----------------------------------------------------------------- the pipeline
def simulate(actions, durations, hop):
    """Play each rank's ``actions`` (lists of Action), action i of rank r lasting
    ``durations[r][i]`` seconds; a cross-rank dependency starts its transfer when the receiver reaches the
    action (and the sender has finished), and takes ``hop(src, dst)`` seconds. Returns
    ``{rank: [(action, start, end)]}``."""
    p = len(actions)
    v = 1 + max(a.chunk for acts in actions for a in acts)
    end, free, nxt = {}, [0.0] * p, [0] * p
    out = {r: [] for r in range(p)}
    remaining = sum(len(a) for a in actions)
    last = p * v - 1
    while remaining:
        progressed = False
        for r in range(p):
            acts = actions[r]
            while nxt[r] < len(acts):
                a = acts[nxt[r]]
                s = stage_of(p, r, a.chunk)
                if a.kind == "F":
                    dep = None if s == 0 else place_of(p, s - 1) + ("F",)
                elif a.kind == "B":
                    dep = None if s == last else place_of(p, s + 1) + ("B",)
                else:
                    dep = None
                start = free[r]
                if dep is not None:
                    key = (dep[0], dep[2], a.microbatch, dep[1])
                    if key not in end:
                        break
                    if dep[0] == r:
                        start = max(start, end[key])
                    else:
                        start = max(start, end[key]) + hop(dep[0], r)
                free[r] = start + durations[r][nxt[r]]
                end[(r, a.kind, a.microbatch, a.chunk)] = free[r]
                out[r].append((a, start, free[r]))
                nxt[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("the schedule deadlocks (validate it with emulator.parallel.pipeline.validate)")
    return out
