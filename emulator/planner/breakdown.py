"""Where a plan's step goes: the critical rank's seconds split into GEMMs, attention, the
memory-bound kernels, the host's launch and dispatch, the optimizer, each axis's
collectives that nothing hides (``dp``: the data-parallel work left after the pipeline, the
compute slowed beside it included), and the pipeline's bubble (what is left: waiting for a
neighbour, its transfers included). :func:`measured` splits an emulator run's timeline the
same way (it lives with the records it reads, :mod:`emulator.records.breakdown`)."""

from ..mesh import DATA_PARALLEL, REDUCED_OVER
from ..records.breakdown import KERNELS, ORDER, measured  # noqa: F401 -- part of this module's interface
from .memory import byte_sizes, unsharded_in_pipeline, zero3_gathers
from .timing import action_durations


def breakdown(est, timer, layers, timing, m_played, tails, r, ctx, per_layer=None):
    """{category: seconds} of pipeline rank r's step (they sum to the step's time).
    ``per_layer``: rank r's layer times (:func:`~.timing.layer_times`), which FSDP's
    prefetch needs: what its gathers and reduce-scatters add to each pass, beyond the
    compute they run beside, is what the passes' durations hold over their compute."""
    dims = est.dims
    m, out = dims.micro_batches, dict.fromkeys(ORDER, 0.0)
    sizes = byte_sizes(ctx)
    split = dims.schedule == "zb_h1"
    whole = unsharded_in_pipeline(dims, ctx)  # its reduce-scatters in the tail, after the flush
    gathers = zero3_gathers(dims.schedule, dims.pp, m, dims.v, r, whole) if dims.zero_stage == 3 else [0] * dims.v
    prefetch = dims.zero_stage == 3 and ctx.stack.fsdp_prefetch and per_layer is not None
    for c in range(dims.v):
        for x in layers[c][r]:
            passes = ["F", "B", "W"] + (["F0"] if dims.recompute == "full" else [])
            for name in passes:
                for key, t in timer.categories(x.ops.get(name, ()), r).items():
                    out[KERNELS.get(key, "dp" if key in DATA_PARALLEL else key)] += t * m
            if x.name == "block" and not split:
                out["tp"] -= timer.bulk_saving(x, r) * m
            for group, elems in x.params.items():
                axis = REDUCED_OVER[group]
                n = len(timer.groups(r)[axis])
                if not elems or n == 1:
                    continue
                full = -(-elems // n) * n
                if prefetch:  # beside the compute: what shows is counted below, from the passes
                    continue
                if dims.zero_stage == 3:  # gathered before forward and backward, unless still held for a W
                    out["dp"] += gathers[c] * timer.op(("c", "all_gather", full * sizes["gather"], axis), r)
                if dims.zero_stage >= 2 and not whole:
                    out["dp"] += m * timer.op(("c", "reduce_scatter", full * sizes["reduce"], axis), r)
            if x.partial and dims.tp > 1:
                out["tp"] += m * timer.op(("c", "all_reduce", x.partial * sizes["grads"], "tp"), r)
    scale = m / m_played
    if prefetch:
        actions = [a for a, _, _ in timing[r]]
        bare = [[{**t, "ag": 0.0, "rs": 0.0, "B": t["B"] - t["rs"], "W": t["W"] - t["rs"]} for t in ts]
                for ts in per_layer]
        with_dp = action_durations(actions, per_layer, dims, prefetch=True, whole_step=whole)
        compute = action_durations(actions, bare, dims, prefetch=True, whole_step=whole)
        out["dp"] += (sum(with_dp) - sum(compute)) * scale
    gpu = sum(out.values())
    busy = sum(e - s for _, s, e in timing[r]) * scale
    host = busy - gpu
    out["launch and dispatch"] = host if host > 1e-9 * busy else 0.0  # (none: round-off)
    out["optimizer"] = est.optimizer_time[r]
    out["dp"] += tails[r]
    out["bubble"] = max(0.0, est.step_time - sum(out.values()))
    return out


def lines(parts, total):
    """The breakdown as 'category  seconds  share' lines."""
    return [f"    {k:<22s} {v * 1e3:10.3f} ms  {v / total:6.1%}" for k, v in parts.items() if v > 0]
