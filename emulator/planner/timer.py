"""Times one pipeline stage's declared work on the cluster, as the emulator's clock would.

:class:`Timer` times each declared item (:mod:`.layers`) on the ranks of the stage's
representative (coordinates pp=r, dp=cp=tp=0): a kernel at the device's rates
(:meth:`emulator.machine.device.Device.time`), each blocking collective for its closed-form
time (:mod:`.collective_times`, which agrees with the engine), and a pass's items in order
on the compute stream, a collective pipelined with the GEMM beside it where Transformer
Engine does so (:mod:`emulator.machine.comm_overlap`); the host's seconds to issue them;
and a pipeline transfer between two stages. Its groups (:class:`_Groups`) are built when
first asked for and shifted by whole nodes, so stages laid out alike share one cache entry.
"""

from functools import lru_cache

from ..cost import p2p_time
from ..machine.comm_overlap import pipelined, ring_exchange, sm_slowdown
from ..machine.work import AllToAll, Collective, RingAttention, is_kernel
from ..mesh import DP_CP, EDP, EP
from .collective_times import all_to_all_seconds, collective_seconds, ring_attention_seconds


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
            out = tuple({"cp": flat[:d.cp], "dp": flat[::d.cp], DP_CP: flat, EP: flat[:d.ep],
                         EDP: flat[::d.ep]}[name])
        out = self[name] = Ranks(out)
        return out


class Timer:
    """Times the declared items of one pipeline stage's ranks (its representative's groups)
    on the cluster, as ``stack`` runs them."""

    def __init__(self, cluster, dims, stack):
        self.topology, self.device, self.dims, self.stack = cluster.topology, cluster.device, dims, stack
        self.g = cluster.topology.gpus_per_node
        self._groups, self._ops = {}, {}
        self._kernels = _KERNEL_SECONDS.setdefault((cluster.device, stack.launch), {})

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
        if is_kernel(op):  # the same on every rank, whatever its name: shared by every timer on the device
            t = self._kernels.get(op.timing_key)
            return _kernel_seconds(self._kernels, self.device, self.stack.launch, op) if t is None else t
        key = (op, self.stage_key(r))
        hit = self._ops.get(key)
        if hit is None:
            hit = self._ops[key] = self._time(op, r)
        return hit

    def _time(self, op, r):
        if isinstance(op, tuple):  # ("c", op, nbytes, axis): a data-parallel strategy's collective
            ranks = self.groups(r)[op[-1]]
            return 0.0 if len(ranks) == 1 else collective_seconds(op[1], op[2], ranks, self.topology)
        ranks = self.groups(r)[_role(op.group)]
        if len(ranks) == 1:
            return 0.0
        if isinstance(op, Collective):
            return collective_seconds(op.op, op.nbytes, ranks, self.topology)
        if isinstance(op, AllToAll):
            return all_to_all_seconds(op.bytes_per_peer, ranks, self.topology)
        if isinstance(op, RingAttention):
            return ring_attention_seconds(op, ranks, self.topology)
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

        for step in self._steps(ops):
            tag = step[0]
            if tag == "ring_exchange":
                _, o, g, n = step
                add("gemm", g)
                add(_role(o.group), ring_exchange(g, self.op(o, r), n) - g)
            elif tag == "pipeline":
                _, o, g, splits, sms = step
                add("gemm", g)
                add(_role(o.group), pipelined(g * sm_slowdown(self.device.sms, sms), self.op(o, r), splits) - g)
            elif tag == "op":
                o = step[1]
                t = self.op(o, r)
                if isinstance(o, RingAttention):
                    k = sum(n * self.op(x, r) for kernels, n in o.distinct for x in kernels)
                    add("attention", min(k, t))
                    add(_role(o.group), max(0.0, t - k))
                else:
                    add(_role(o.group), t)
            else:  # a kernel on its own: its kind and seconds
                add(tag, step[1])
        return out

    def _steps(self, ops):
        """``ops`` read once for this device and stack (kept while ``ops``, a tuple, lives):
        each kernel on its own as (kind, seconds); a Transformer Engine pair as
        ("ring_exchange", its all-gather, the GEMM's seconds, chunks) or ("pipeline", its
        reduce-scatter, the GEMM's seconds, splits, SMs taken); anything else as ("op", op),
        timed per rank. The same sums, in the same order, as op by op."""
        key = (id(ops), self.device, self.stack.launch)
        hit = _STEPS.get(key)
        if hit is not None and hit[0] is ops:
            return hit[1]
        steps, i, n = [], 0, len(ops)
        while i < n:
            o = ops[i]
            nxt = ops[i + 1] if i + 1 < n else None
            if is_kernel(o):
                nov = None if nxt is None or is_kernel(nxt) else getattr(nxt, "overlap", None)
                if o.kind == "gemm" and nov and nov[0] == "pipeline":
                    steps.append(("pipeline", nxt, self.op(o, 0), nov[1], nov[2]))
                    i += 2
                else:
                    steps.append((o.kind, self.op(o, 0)))
                    i += 1
                continue
            ov = getattr(o, "overlap", None)
            if ov and ov[0] == "ring_exchange" and getattr(nxt, "kind", None) == "gemm":
                steps.append(("ring_exchange", o, self.op(nxt, 0), ov[1]))
                i += 2
                continue
            steps.append(("op", o))
            i += 1
        if isinstance(ops, tuple):
            if len(_STEPS) > 1 << 14:
                _STEPS.clear()
            _STEPS[key] = (ops, steps)
        return steps

    def bulk_saving(self, layer, r):
        """Seconds an unsplit backward saves by running each part's all-gather of its input
        beside its input-gradient GEMM, and its input gradient's reduce-scatter beside its
        weight-gradient GEMMs (as :class:`emulator.parallel.tensor_parallel.linear.ColumnThenRow` does),
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
        return sum(o.kernel_count if isinstance(o, RingAttention) else 1 for o in ops) * \
            self.stack.dispatch

    def p2p(self, nbytes, r_src, r_dst):
        per_stage = self.dims.dp * self.dims.cp * self.dims.tp
        return p2p_time(nbytes, r_src * per_stage, r_dst * per_stage, self.topology)


_KERNEL_SECONDS = {}  # (device, launch) -> {a kernel's timing_key: its seconds}
_STEPS = {}  # (id of a pass's ops, device, launch) -> (those ops, their steps): Timer._steps


def _kernel_seconds(times, device, launch, kernel):
    """A declared kernel's seconds with a memory-bound kernel's launch gap, kept in ``times``
    (this device's and launch cost's table in ``_KERNEL_SECONDS``) under what they depend on
    (:attr:`timing_key`: not the kernel's name), so the experts of an MoE layer, alike but
    for their names, are timed once."""
    if len(times) > 1 << 18:
        times.clear()
    t = times[kernel.timing_key] = device.time(kernel) + (launch if kernel.kind == "memory" else 0.0)
    return t


def _role(group):
    """The planner's name of a declared group: the MoE token group's ranks are cp's."""
    return "cp" if group == "group" else group
