"""Step time of a plan, as the emulator's clock would give it.

Three parts, each what the emulator does:

1. **A layer's passes** (:func:`layer_times`): its ops (:mod:`.layers`) in order on the
   compute stream, timed by :class:`~.timer.Timer` (kernels at the device's rates, each
   blocking collective for its closed-form time, :mod:`.collective_times`, all-to-alls
   pairwise and ring attention step by step); plus what the data-parallel strategy does
   per layer (ZeRO-3 gathers the layer before forward and backward, ZeRO-2/3 reduce-scatter
   its gradient every micro-batch) and the tensor-parallel sum of partial gradients under
   sequence parallelism. An action lasts its chunk's layers' passes (:func:`action_durations`).
2. **The pipeline**: the schedule's actions per rank, each as long as its layers' passes,
   played by the pipeline's own simulator (:func:`emulator.parallel.pipeline.simulator.play`):
   a micro-batch's activations or gradients cross to the next stage point to point once
   the receiver asks for them (a rank posts its receive when it reaches the action that
   needs it, as the executor does), taking the link's time.
3. **The data-parallel tail** (:mod:`.comm`, :mod:`.overlap`): DDP's bucket all-reduces,
   each started when its layer's last gradient is in and queued on the group's stream
   behind the previous one; ZeRO-1's reduce-scatter and ZeRO-1/2's all-gather of the
   updated parameters after the pipeline.

What it leaves out: messages of different groups that share a port (a NIC carrying a
pipeline send and a data-parallel all-reduce at once) are timed as if alone; the emulator
books ports and makes one wait.
"""

from ..machine.comm_overlap import contention
from ..mesh import REDUCED_OVER
from .collective_times import ring_collective_time  # noqa: F401 -- also importable from here
from .memory import byte_sizes, zero3_held
from .timer import Timer  # noqa: F401 -- also importable from here


def layer_times(timer, layer, r, dims, ctx):
    """Seconds of one layer's passes on pipeline rank r: ``F``, ``B`` (unsplit: input and
    weight gradients), ``Bs`` (a split backward's input gradient), ``W``, with the
    strategy's per-layer collectives; ``ag``: ZeRO-3's gather of the layer, paid before a
    pass unless the layer is still gathered."""
    z = dims.zero_stage
    sizes = byte_sizes(ctx)
    ag = rs = 0.0
    for group, elems in layer.params.items():
        axis = REDUCED_OVER[group]
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
    f, again, b, w, (hf, h_again, hb, hw), bulk = _passes(timer, layer, r, dims.recompute == "full")
    saved = bulk if layer.name == "block" and dims.schedule != "zb_h1" else 0.0
    return {"F": f, "B": again + b + w + partial + rs - saved, "rs": rs, "Bs": again + b, "W": w + partial + rs,
            "ag": ag, "host F": hf, "host B": h_again + hb + hw, "host Bs": h_again + hb, "host W": hw}


def _host(timer, layer, recompute):
    ops = layer.ops
    again = timer.host(ops.get("F0", ops["F"])) if recompute else 0.0
    return timer.host(ops["F"]), again, timer.host(ops["B"]), timer.host(ops["W"])


def _passes(timer, layer, r, recompute):
    """Seconds of the layer's own ops per pass (F, F again under full recomputation, B,
    W), the host's to issue them (:func:`_host`) and the bulk overlap's saving
    (:meth:`~.timer.Timer.bulk_saving`), kept on the layer for the groups that time them."""
    groups = timer.groups(r)
    key = (timer.topology, groups["tp"], groups["cp"], groups["ep"], recompute)
    if key not in layer.times:
        ops = layer.ops
        again = timer.ops(ops.get("F0", ops["F"]), r) if recompute else 0.0
        bulk = timer.bulk_saving(layer, r) if layer.name == "block" else 0.0
        layer.times[key] = (timer.ops(ops["F"], r), again, timer.ops(ops["B"], r), timer.ops(ops["W"], r),
                            _host(timer, layer, recompute), bulk)
    return layer.times[key]


def bulk_saving(timer, layer, r, recompute):
    """:meth:`~.timer.Timer.bulk_saving` of a block (0 for other layers), kept with its passes."""
    return _passes(timer, layer, r, recompute)[-1]


def action_durations(actions, per_layer, dims, host=False, prefetch=False, whole_step=False):
    """Seconds of each of one rank's actions (``per_layer[c]``: its chunks' layer times):
    the GPU's, or (``host=True``) the host's to issue them. ``prefetch`` (ZeRO-3 as FSDP2
    runs it): a layer's all-gather runs while the layer before it computes, its
    reduce-scatter while the layer after it in backward does (:func:`prefetched`).
    ``whole_step`` (FSDP2 in a pipeline, :func:`~.memory.unsharded_in_pipeline`): only a
    chunk's first forward gathers, and no backward reduce-scatters (that comes after the
    flush, in the data-parallel tail)."""
    split = dims.schedule == "zb_h1"
    if dims.zero_stage != 3:  # nothing is gathered per pass: one duration per (kind, chunk)
        table = {}
        for c, ts in enumerate(per_layer):
            for kind in ("F", "B", "W"):
                name = "F" if kind == "F" else "W" if kind == "W" else ("Bs" if split else "B")
                table[kind, c] = sum(t["host " + name] for t in ts) if host else \
                    sum(t[name] for t in ts) + (0.0 if kind == "W" else sum(t["ag"] for t in ts))
        return [table[a.kind, a.chunk] for a in actions]
    pairs = [(a.kind, a.chunk) for a in actions]
    held = zero3_held(pairs, split, whole_step)
    memo, out = {}, []
    for (kind, c), (h, _) in zip(pairs, held):
        key = (kind, c, h)
        if key not in memo:
            ts = per_layer[c]
            name = "F" if kind == "F" else "W" if kind == "W" else ("Bs" if split else "B")
            unreduced = whole_step and name in ("B", "W")  # its reduce-scatter waits for the flush
            if host:
                memo[key] = sum(t["host " + name] for t in ts)
            elif prefetch and dims.zero_stage == 3:
                memo[key] = prefetched(ts, name, h or kind == "W", reduces=not unreduced)
            else:
                gather = 0.0 if (h or kind == "W") else sum(t["ag"] for t in ts)
                memo[key] = sum(t[name] - (t["rs"] if unreduced else 0.0) for t in ts) + gather
        out.append(memo[key])
    return out


def prefetched(ts, name, held, reduces=True):
    """A chunk's pass ``name`` (F, B, a split backward's Bs or W) under FSDP2's prefetch
    (:class:`emulator.parallel.data_parallel.zero3.ZeRO3` with ``prefetch``): each layer's
    gather (unless ``held``) starts as the layer before it (in the pass's order) starts
    computing, so only what outlasts that layer shows; in the pass that hands the gradients
    on (B, or W of a split backward) each layer's reduce-scatter runs beside the next layer's
    compute, the last one after, unless it waits for the flush (``reduces=False``); the
    compute beside them slowed as beside any NCCL kernel
    (:data:`emulator.machine.comm_overlap.NCCL_CONTENTION`)."""
    order = ts if name == "F" else ts[::-1]
    hands_on = name in ("B", "W")  # its layer times include the reduce-scatter
    compute = [t[name] - (t["rs"] if hands_on else 0.0) for t in order]
    total = sum(compute)
    for i, t in enumerate(order):
        if not held:
            ag = t["ag"]
            before = compute[i - 1] if i else 0.0
            total += max(0.0, ag - before) + contention(min(ag, before))
        if hands_on and reduces:
            rs = t["rs"]
            after = compute[i + 1] if i + 1 < len(order) else 0.0
            total += max(0.0, rs - after) + contention(min(rs, after))
    return total
