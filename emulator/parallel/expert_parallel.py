"""Expert parallelism: an MoE layer's experts split over the ranks of an ``ep`` group (and,
optionally, each expert's matrices over a ``tp`` group).

Every rank holds the router (replicated) and ``E / ep`` experts (rank r: experts
``r E/ep .. (r+1) E/ep - 1``), and routes its own tokens. Forward:

1. **route** locally; apply **capacity** with the statistics of the tokens' group
   (:mod:`.token_groups`: first come, first served in the group's token order), dropping
   this rank's over-capacity assignments before they are sent, and sort the kept ones by
   expert;
2. **count exchange**: an all-to-all of the per-expert counts, so each rank learns how
   many rows it will receive from every other rank for each of its experts;
3. **dispatch**: one uneven ``all_to_all_single`` sends each row to its expert's rank;
4. the owner regroups the rows by expert and runs its experts on them;
5. **combine**: the reverse ``all_to_all_single`` brings the outputs home, where each
   token sums its experts' outputs, weighted.

Backward runs the same two all-to-alls the other way: output gradients out to the experts,
input gradients back. The router's gradient is this rank's part (the sum over the ranks
that hold copies of the router is the full one, as data parallelism sums it).

With tensor parallelism inside the experts (``tp`` of size t > 1, Megatron's expert tensor
parallelism), each rank holds a 1/t slice of every local expert's hidden units and every
rank of the tp group routes the same tokens: the experts' outputs, and the routing
weights' gradients, are partial sums over tp (the first is reduced where the dense MLP's
is, the second by an all-reduce of (tokens x top_k) numbers), and the router's input
gradient is added on tp rank 0 only.

:class:`ParallelMoE` is the block's MLP; :func:`forward` and :func:`backward` run one
layer on an ep group with each rank's tokens in rank order (lesson 05).
"""

import numpy as np

from ..errors import ConfigError
from ..machine import elementwise
from ..machine.work import AllToAll, Collective, Gemm, Memory, Work, dtype_bytes, np_dtype
from ..nn.moe import (capacity, expert_keys, experts_backward_input, experts_backward_weight, experts_forward,
                      route, route_backward)
from .layer_shape import LayerShape
from .placement import Placement
from .token_groups import TokenGroup
from .tensor_parallel.regions import TPRegions
from .tensor_parallel.regions_work import region_gather, region_gather_back, region_reduce, region_reduce_back, wgrad


def shard_experts(params, size, rank):
    """The parameters rank ``rank`` of ``size`` holds: the router whole, its contiguous
    slice of the stacked experts along dim 0."""
    n_experts = params["router.w"].shape[1]
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 1 or n_experts % size:
        raise ConfigError(f"shard_experts: {n_experts} experts do not split evenly over {size!r} ranks; expert "
                          f"parallelism needs a number of ranks that divides the number of experts")
    if not 0 <= rank < size:
        raise ConfigError(f"shard_experts: rank must be in 0..{size - 1}, got {rank!r}")
    n = n_experts // size
    keys = expert_keys(params)
    return {k: (v[rank * n:(rank + 1) * n].copy() if k in keys else v) for k, v in params.items()}


class ParallelMoE:
    """``moe``: the layer's configuration (an ``nn.MoE``); ``ep``: the expert-parallel
    group; ``regions``: the tp group's operators (:class:`~.tensor_parallel.regions.TPRegions`);
    ``group(batch, seq)``: the :class:`~.token_groups.TokenGroup` of this rank's tokens, a
    (batch, seq) block of them."""

    charges_itself = True

    def __init__(self, moe, ep, regions, group=None, dtype=None):
        if moe.n_experts % ep.size:
            raise ConfigError(f"rank {ep.global_rank}: {moe.n_experts} experts do not split over an ep group of "
                              f"{ep.size}")
        if moe.d_ff % regions.comm.size:
            raise ConfigError(f"rank {ep.global_rank}: the experts' d_ff ({moe.d_ff}) does not split over tp="
                              f"{regions.comm.size}")
        self.moe, self.ep, self.r = moe, ep, regions
        self.tp = regions.comm
        self.n_local = moe.n_experts // ep.size
        self.group = group or (lambda b, s: TokenGroup.local(ep, b * s))
        self.widen = ("fc1",) if moe.mlp == "gelu" else ("gate", "up")
        self.ff = moe.d_ff // self.tp.size
        self.dtype = dtype if dtype is not None else getattr(moe, "dtype", None)

    # ----------------------------------------------------------------- where parameters live
    def placements(self, sp=False):
        ep = ("ep", 0)
        out = {"router.w": Placement()}
        for n in self.widen:
            out[f"experts.{n}.w"] = Placement((ep, ("tp", 2)))
        out["experts.fc2.w" if self.moe.mlp == "gelu" else "experts.down.w"] = Placement((ep, ("tp", 1)))
        if self.moe.mlp == "gelu":
            out["experts.fc1.b"] = Placement((ep, ("tp", 1)))
            out["experts.fc2.b"] = Placement((ep,))  # added on tp rank 0 only
        return out

    def coords(self):
        return {"ep": self.ep.rank}

    def sizes(self):
        return {"ep": self.ep.size}

    # ----------------------------------------------------------------- forward
    def _check(self, P):
        n = P["experts.fc1.w" if "experts.fc1.w" in P else "experts.gate.w"].shape[0]
        if n != self.n_local:
            raise ConfigError(f"rank {self.ep.global_rank}: expected this rank's {self.n_local} experts "
                              f"(shard_experts), got {n}")

    def _experts(self, P):
        """This rank's experts as it computes them: fc2's bias on tp rank 0 only."""
        if self.tp.size > 1 and "experts.fc2.b" in P and self.tp.rank:
            return dict(P, **{"experts.fc2.b": np.zeros_like(P["experts.fc2.b"])})
        return P

    def _charge(self, counts, backward=False):
        """Charge this rank's experts on the rows routing sent them (the declaration's even
        share replaced by the routed counts)."""
        shape = self._shape_of(self._in_shape, tuple(int(c) for c in counts))
        what = "moe: experts backward" if backward else "moe: experts"
        self.ep.replace_declared(what, expert_kernels(shape, self._context(), shape.counts, backward))
        self.ep.charge(what, optional=True)

    def _payload(self, x):
        """The dtype routed rows travel in: the precision policy's ``ep`` (else as they are)."""
        return np_dtype(self._context().dtype("ep")) if self.ep.precision else x.dtype

    def _context(self):
        return self.ep.work_context(self.dtype if self.dtype is not None else np.float32)

    def _shape_of(self, x_shape, counts=None):
        t, b, s_loc = self.tp.size, x_shape[0], x_shape[1]
        m = self.moe
        n = s_loc * t if self.r.sp else s_loc
        stats = None
        if m.capacity_factor is not None or m.aux_loss_coef:  # the token group's statistics, gathered
            g = self.group(b, n)
            if g.comm is not None and g.comm.size > 1:
                stats = (g.comm.size, len(g.runs))
        return LayerShape(b, n, m.d_model, 1, 1, m.d_ff, mlp=m.mlp, bias=m.mlp == "gelu", tp=t, sp=self.r.sp,
                          n_experts=m.n_experts, top_k=m.top_k, ep=self.ep.size, counts=counts, stats=stats)

    def work(self, x_shape):
        """The layer's :class:`~emulator.machine.work.Work` (an even router) for input ``x_shape``."""
        return moe_work(self._shape_of(x_shape), self._context())

    def forward(self, P, x):
        self._in_shape = np.shape(x)
        with self.ep.declared(lambda: self.work(np.shape(x)).forward, "MoE forward"):
            return self._forward(P, x)

    def _forward(self, P, x):
        self._check(P)
        moe, c, k = self.moe, self.ep.size, self.moe.top_k
        xg = self.r.gather(x)
        x2 = xg.reshape(-1, moe.d_model)
        idx, weights, rc = route(P["router.w"], x2, k)
        self.ep.charge("moe: router")
        e_ids, tokens = idx.ravel(), np.repeat(np.arange(len(x2)), k)
        keep = np.ones(len(e_ids), bool)
        if moe.capacity_factor is not None or moe.aux_loss_coef:  # the group's statistics
            place, n_group, totals, p_sum = self.group(*xg.shape[:2]).statistics(e_ids, k, moe.n_experts, rc["p"])
            cap = capacity(n_group, k, moe.n_experts, moe.capacity_factor)
            if cap is not None:
                keep = place < cap
        kept = np.nonzero(keep)[0]
        order = kept[np.argsort(e_ids[kept], kind="stable")]  # my kept assignments, by expert
        counts = np.bincount(e_ids[order], minlength=moe.n_experts)
        recv_counts = self.ep.all_to_all_single(counts).reshape(c, self.n_local)  # [source rank, my expert]
        send_splits, recv_splits = counts.reshape(c, self.n_local).sum(1), recv_counts.sum(1)
        send = self._payload(x2)
        rows = self.ep.all_to_all_single(x2[tokens[order]].astype(send, copy=False), recv_splits.tolist(),
                                         send_splits.tolist()).astype(x2.dtype, copy=False)
        # the rows arrive by source rank, each source's by expert: regroup by expert
        start = np.concatenate([[0], np.cumsum(recv_counts.ravel())])[:-1].reshape(c, self.n_local)
        regroup = np.concatenate([np.arange(start[i, j], start[i, j] + recv_counts[i, j])
                                  for j in range(self.n_local) for i in range(c)] + [[]]).astype(int)
        expert_counts = recv_counts.sum(0)
        ys, ec = experts_forward(self._experts(P), rows[regroup], expert_counts)
        self._charge(expert_counts)
        out_rows = np.empty_like(rows)
        out_rows[regroup] = ys
        back = self.ep.all_to_all_single(out_rows.astype(send, copy=False), send_splits.tolist(),
                                         recv_splits.tolist()).astype(x2.dtype, copy=False)
        y = np.zeros_like(x2)
        np.add.at(y, tokens[order], weights.ravel()[order, None] * back)
        self.ep.charge("moe: weighted sum")
        cache = {"route": rc, "weights": weights, "order": order, "tokens": tokens, "back": back, "kept": regroup,
                 "rows": len(rows), "experts": ec, "counts": expert_counts, "dropped": int((~keep).sum()),
                 "splits": (send_splits.tolist(), recv_splits.tolist()), "shape": np.shape(xg)}
        if moe.aux_loss_coef:  # Switch's loss over the group: E sum_e f_e P_e
            f, mean_p = totals / (n_group * k), p_sum / n_group
            cache["aux_loss"] = moe.n_experts * float((f * mean_p).sum())
            cache["aux_dp"] = np.broadcast_to(moe.n_experts * f / n_group, rc["p"].shape).astype(x2.dtype)
        return self.r.reduce(y.reshape(xg.shape)), cache

    # ----------------------------------------------------------------- backward
    def backward(self, P, cache, dy):
        """(dx for this rank's tokens, gradients of this rank's parameters)."""
        self._in_shape = np.shape(dy)
        with self.ep.declared(lambda: self.work(np.shape(dy)).backward_input, "MoE backward"):
            return self._backward(P, cache, dy)

    def _backward(self, P, cache, dy):
        moe = self.moe
        dy2 = self.r.reduce_back(dy).reshape(-1, moe.d_model)
        order, tokens, back, regroup = cache["order"], cache["tokens"], cache["back"], cache["kept"]
        send_splits, recv_splits = cache["splits"]
        w_flat = cache["weights"].ravel()
        dweights = np.zeros_like(dy2, shape=(len(w_flat),))
        dweights[order] = (dy2[tokens[order]] * back).sum(-1)
        if self.tp.size > 1:  # each tp rank's outputs are partial sums: so are these
            dweights = self.tp.all_reduce(dweights)
        send = self._payload(dy2)
        d_rows = self.ep.all_to_all_single((w_flat[order, None] * dy2[tokens[order]]).astype(send, copy=False),
                                           recv_splits, send_splits).astype(dy2.dtype, copy=False)
        d_experts = d_rows[regroup]
        experts = self._experts(P)
        dxs = experts_backward_input(experts, cache["experts"], d_experts)
        grads = experts_backward_weight(experts, cache["experts"], d_experts)  # fc2.b's: whole on every tp rank
        self._charge(cache["counts"], backward=True)
        dx_rows = np.empty_like(dy2, shape=(cache["rows"], moe.d_model))
        dx_rows[regroup] = dxs
        dx_back = self.ep.all_to_all_single(dx_rows.astype(send, copy=False), send_splits,
                                            recv_splits).astype(dy2.dtype, copy=False)
        extra = moe.aux_loss_coef * cache.get("aux_scale", 1.0) * cache["aux_dp"] if moe.aux_loss_coef else None
        dx, dlogits = route_backward(P["router.w"], cache["route"], dweights.reshape(-1, moe.top_k), extra)
        if self.tp.rank:
            dx = np.zeros_like(dx)  # the router's input gradient once over tp, as the bias is added once
        np.add.at(dx, tokens[order], dx_back)
        grads["router.w"] = cache["route"]["x"].T @ dlogits
        self.ep.charge("moe: router backward")
        return self.r.gather_back(dx.reshape(cache["shape"])), grads

    def backward_input(self, P, cache, dy):
        dx, cache["grads"] = self.backward(P, cache, dy)
        return dx

    def backward_weight(self, P, cache, dy):
        if "grads" not in cache:
            self.backward_input(P, cache, dy)
        return cache.pop("grads")

    def flops(self, x_shape):
        t = int(np.prod(x_shape[:-1]))
        router = 2 * t * self.moe.d_model * self.moe.n_experts
        experts = 2 * t * self.moe.top_k * (len(self.widen) + 1) * self.moe.d_model * self.ff
        return {"forward": router + experts, "backward_input": router + experts, "backward_weight": router + experts}


class _NoTensorParallelism(TPRegions):
    """One rank per expert slice: nothing to gather or reduce."""

    def __init__(self, comm):
        super().__init__(comm.new_group([comm.global_rank]), False)

    def gather(self, x, async_op=False):
        return x

    gather_back = reduce = reduce_back = gather


def forward(comm, moe, params_local, x_local):
    """This rank's output for its tokens ``x_local`` (tokens, d), the experts over the group
    ``comm``, every rank's tokens one group in rank order; and the cache for :func:`backward`."""
    x = np.asarray(x_local)
    if x.shape[-1] != moe.d_model:
        raise ConfigError(f"rank {comm.global_rank}: tokens of width {x.shape[-1]}, the layer's is {moe.d_model}")
    layer = ParallelMoE(moe, comm, _NoTensorParallelism(comm), lambda b, s: TokenGroup.rank_order(comm, b * s))
    x2 = x.reshape(1, -1, moe.d_model)
    y, cache = layer.forward(params_local, x2)
    cache["shape"] = x.shape
    return y.reshape(x.shape), cache


def backward(comm, moe, params, cache, dy):
    """(dx for this rank's tokens, gradients of this rank's parameters)."""
    layer = ParallelMoE(moe, comm, _NoTensorParallelism(comm))
    dy = np.asarray(dy)
    shape = cache["shape"]
    cache = dict(cache, shape=(1,) + (int(np.prod(shape[:-1])), moe.d_model))
    dx, grads = layer.backward(params, cache, dy.reshape(1, -1, moe.d_model))
    return dx.reshape(shape), grads


# ----------------------------------------------------------------- the declaration of its work
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
