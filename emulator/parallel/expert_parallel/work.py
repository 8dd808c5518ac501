"""The declaration of an MoE layer's work on a rank (:class:`~emulator.machine.work.Work`):
the router, the count exchange, the all-to-alls each way and each local expert's kernels."""

from functools import lru_cache

from ...machine import elementwise
from ...machine.work import AllToAll, Collective, Gemm, Memory, Work, dtype_bytes
from ..tensor_parallel.regions_work import region_gather, region_gather_back, region_reduce, region_reduce_back, wgrad


def expert_kernels(s, ctx, counts, backward=False):
    """The GEMMs and activations of this rank's experts on ``counts`` rows each (the
    declaration's even share, or, in a run, the rows routing sent them)."""
    shape = (s.d, s.ff, s.widen, s.mlp, s.bias)
    out = ()
    for e, n in enumerate(counts):
        if n:
            out += _expert(ctx, shape, e, n, backward)
    return out


@lru_cache(maxsize=1 << 14)
def _expert(ctx, shape, e, n, backward):
    """Expert ``e``'s kernels on ``n`` rows: built once, the same objects each time asked
    (a search declares the same experts for many plans)."""
    d, ff, w, mlp, bias = shape
    st, c = ctx.stack, ctx.dtype("compute")
    name = f"moe: experts{' backward' if backward else ''}: {e}"
    if not backward:
        return (Gemm(f"{name} fc1", n, w * ff, d, c),) + elementwise.activation(st, f"{name} activation", n, ff, c, mlp,
                                                                                 bias) + \
            (Gemm(f"{name} fc2", n, d, ff, c),)
    return (Gemm(f"{name} fc2 dgrad", n, ff, d, c),) + \
        elementwise.activation_backward(st, f"{name} activation", n, ff, c, mlp) + \
        (Gemm(f"{name} fc1 dgrad", n, d, w * ff, c),) + wgrad(ctx, f"{name} fc2 wgrad", ff, d, n) + \
        wgrad(ctx, f"{name} fc1 wgrad", d, w * ff, n)


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
