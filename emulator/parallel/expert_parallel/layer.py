"""The MoE layer with its experts over an ``ep`` group (and each expert optionally over
``tp``): route, drop over capacity, dispatch, run the local experts, combine; backward the
same all-to-alls the other way (the package's docstring walks through it)."""

import numpy as np

from ...errors import ConfigError
from ...machine.work import np_dtype
from ...nn.moe import (capacity, experts_backward_input, experts_backward_weight, experts_forward,
                       route, route_backward)
from ..layer_shape import LayerShape
from ..placement import Placement
from .token_groups import TokenGroup
from .work import expert_kernels, moe_work


class ParallelMoE:
    """``moe``: the layer's configuration (an ``nn.MoE``); ``ep``: the expert-parallel
    group; ``regions``: the tp group's operators (:class:`~.tp_regions.TPRegions`);
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
