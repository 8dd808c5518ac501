"""The declaration of an MoE layer's work on a rank (:class:`~emulator.machine.work.Work`):
the router, the count exchange, the all-to-alls each way and each local expert's kernels."""

from ...machine import elementwise
from ...machine.work import AllToAll, Collective, Gemm, Memory, Work, dtype_bytes
from ..tensor_parallel.regions_work import region_gather, region_gather_back, region_reduce, region_reduce_back, wgrad


def expert_kernels(s, ctx, counts, backward=False):
    """The GEMMs and activations of this rank's experts on ``counts`` rows each (the
    declaration's even share, or, in a run, the rows routing sent them)."""
    st, c, w = ctx.stack, ctx.dtype("compute"), s.widen
    out = ()
    for e, n in enumerate(counts):
        if not n:
            continue
        name = f"moe: experts{' backward' if backward else ''}: {e}"
        if not backward:
            out += (Gemm(f"{name} fc1", n, w * s.ff, s.d, c),) + \
                elementwise.activation(st, f"{name} activation", n, s.ff, c, s.mlp, s.bias) + \
                (Gemm(f"{name} fc2", n, s.d, s.ff, c),)
        else:
            out += (Gemm(f"{name} fc2 dgrad", n, s.ff, s.d, c),) + \
                elementwise.activation_backward(st, f"{name} activation", n, s.ff, c, s.mlp) + \
                (Gemm(f"{name} fc1 dgrad", n, s.d, w * s.ff, c),) + wgrad(ctx, f"{name} fc2 wgrad", s.ff, s.d, n) + \
                wgrad(ctx, f"{name} fc1 wgrad", s.d, w * s.ff, n)
    return out


def moe_work(s, ctx):
    """The MoE layer's :class:`~emulator.machine.work.Work` on a rank: the router, the count
    exchange and the two all-to-alls each way, and each local expert's GEMMs and activation
    on the rows routed to it (``s.counts``; None: an even router, ``rows x top_k / E``
    each). Its backward computes the weight gradients with the input gradients (B holds
    both; W is empty)."""
    c, e_dt = ctx.dtype("compute"), ctx.dtype("ep")
    E, local, R = s.n_experts, s.n_experts // s.ep, s.rows * s.top_k
    counts = s.counts if s.counts is not None else (R * s.ep // E,) * local  # each expert: its share of R rows
    per_peer = R // s.ep * s.d * dtype_bytes(e_dt)  # an even router: each peer gets its share of the rows
    idx = E // s.ep * 8  # int64 counts per peer
    F = region_gather(s, ctx, "moe") + (Gemm("moe: router", s.rows, E, s.d, c),)
    if s.stats is not None:  # capacity or the load-balancing loss: (keys, counts per run, sums, tokens) of each rank
        size, runs = s.stats
        F += (Collective("moe: token-group statistics", "all_gather", "group", size,
                         size * (runs + runs * E + E + 1) * 8, "fp64"),)
    F += (AllToAll("moe: count exchange", "ep", s.ep, idx, "int64"),
                                        AllToAll("moe: dispatch", "ep", s.ep, per_peer, e_dt))
    F += expert_kernels(s, ctx, counts) + (AllToAll("moe: combine", "ep", s.ep, per_peer, e_dt),
                                           Memory("moe: weighted sum", "moe", R * s.d * dtype_bytes(c),
                                                  s.rows * s.d * dtype_bytes(c)))
    F += region_reduce(s, ctx, "moe")
    B = region_reduce_back(s, ctx, "moe")
    if s.tp > 1:
        t_dt = ctx.dtype("tp")
        B += (Collective("moe: all-reduce routing weights' grads", "all_reduce", "tp", s.tp, R * dtype_bytes(t_dt),
                         t_dt),)
    B += (AllToAll("moe: dispatch grads", "ep", s.ep, per_peer, e_dt),) + expert_kernels(s, ctx, counts, True)
    B += (AllToAll("moe: combine grads", "ep", s.ep, per_peer, e_dt),
          Gemm("moe: router backward", s.rows, E, s.d, c, count=2)) + region_gather_back(s, ctx, "moe")
    return Work("moe", F, B, (), F)
