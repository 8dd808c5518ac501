"""Expert parallelism: an MoE layer's experts split over the ranks of an ``ep`` group.

Every rank holds the router (replicated) and ``E / size`` experts (rank r: experts
``r E/size .. (r+1) E/size - 1``), and routes its own tokens. Forward:

1. **route** locally and sort this rank's (token, expert) assignments by expert;
2. **count exchange**: an all-to-all of the per-expert counts, so each rank learns how
   many rows it will receive from every other rank for each of its experts;
3. **dispatch**: one uneven ``all_to_all_single`` sends each row to its expert's rank;
4. the owner regroups the rows by expert (source rank, then token order: the order of
   the whole batch, so capacity drops the same assignments one device would), runs its
   experts on the kept rows, and returns zeros for the dropped ones;
5. **combine**: the reverse ``all_to_all_single`` brings the outputs home, where each
   token sums its experts' outputs, weighted.

Backward runs the same two all-to-alls the other way: output gradients out to the experts,
input gradients back. The router's gradient is this rank's part (the sum over the ep group
is the full one, as data parallelism will sum it).

Dropped rows are still sent here (the owner drops them), so the bytes are the dropless
layer's; production systems compute each row's place from the exchanged counts and drop
before sending. All ranks must hold the same number of tokens.
"""

import numpy as np

from ..errors import ConfigError
from ..nn.moe import (EXPERT_KEYS, capacity, experts_backward_input, experts_backward_weight, experts_forward,
                      keep_first, route, route_backward)


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
    return {k: (v[rank * n:(rank + 1) * n].copy() if k in EXPERT_KEYS else v) for k, v in params.items()}


def _check(comm, moe, params, x):
    if moe.n_experts % comm.size:
        raise ConfigError(f"rank {comm.global_rank}: {moe.n_experts} experts do not split over an ep group of "
                          f"{comm.size}")
    n = moe.n_experts // comm.size
    if params["experts.fc1.w"].shape[0] != n:
        raise ConfigError(f"rank {comm.global_rank}: expected this rank's {n} experts (shard_experts), got "
                          f"{params['experts.fc1.w'].shape[0]}")
    x = np.asarray(x)
    if x.shape[-1] != moe.d_model:
        raise ConfigError(f"rank {comm.global_rank}: tokens of width {x.shape[-1]}, the layer's is {moe.d_model}")
    return n, x.reshape(-1, moe.d_model)


def forward(comm, moe, params, x):
    """This rank's output for its tokens ``x``, and the cache for :func:`backward`."""
    n_local, x2 = _check(comm, moe, params, x)
    c, k = comm.size, moe.top_k
    idx, weights, rc = route(params["router.w"], x2, k)
    e_ids, tokens = idx.ravel(), np.repeat(np.arange(len(x2)), k)
    order = np.argsort(e_ids, kind="stable")  # my assignments, by expert
    counts = np.bincount(e_ids, minlength=moe.n_experts)
    comm.compute(flops=2 * x2.size * moe.n_experts, name="route")
    recv_counts = comm.all_to_all_single(counts).reshape(c, n_local)  # [source rank, my expert]
    send_splits, recv_splits = counts.reshape(c, n_local).sum(1), recv_counts.sum(1)
    rows = comm.all_to_all_single(x2[tokens[order]], recv_splits.tolist(), send_splits.tolist())
    # the rows arrive by source rank, each source's by expert: regroup by expert, source order within
    start = np.concatenate([[0], np.cumsum(recv_counts.ravel())])[:-1].reshape(c, n_local)
    regroup = np.concatenate([np.arange(start[i, j], start[i, j] + recv_counts[i, j])
                              for j in range(n_local) for i in range(c)]).astype(int)
    local_e = np.repeat(np.arange(n_local), recv_counts.sum(0))
    keep = keep_first(local_e, n_local, capacity(c * len(x2), k, moe.n_experts, moe.capacity_factor))
    kept = regroup[keep]
    expert_counts = np.bincount(local_e[keep], minlength=n_local)
    ys, ec = experts_forward(params, rows[kept], expert_counts)
    comm.compute(flops=4 * len(kept) * moe.d_model * moe.d_ff, name="experts")
    out_rows = np.zeros_like(rows)
    out_rows[kept] = ys
    back = comm.all_to_all_single(out_rows, send_splits.tolist(), recv_splits.tolist())
    y = np.zeros_like(x2)
    np.add.at(y, tokens[order], weights.ravel()[order, None] * back)
    cache = {"route": rc, "weights": weights, "order": order, "tokens": tokens, "back": back, "kept": kept,
             "rows": len(rows), "experts": ec, "counts": expert_counts, "dropped": int((~keep).sum()),
             "splits": (send_splits.tolist(), recv_splits.tolist()), "shape": np.shape(x)}
    if moe.aux_loss_coef:  # the load-balancing loss needs the whole batch's statistics
        stats = comm.all_reduce(np.concatenate([counts, rc["p"].sum(0)]).astype(np.float64))
        n_tokens = c * len(x2)
        f, mean_p = stats[:moe.n_experts] / (n_tokens * k), stats[moe.n_experts:] / n_tokens
        cache["aux_loss"] = moe.n_experts * float((f * mean_p).sum())
        cache["aux_dp"] = np.broadcast_to(moe.n_experts * f / n_tokens, rc["p"].shape).astype(x2.dtype)
    return y.reshape(np.shape(x)), cache


def backward(comm, moe, params, cache, dy):
    """(dx for this rank's tokens, gradients of this rank's parameters)."""
    dy2 = np.asarray(dy).reshape(-1, moe.d_model)
    order, tokens, back, kept = cache["order"], cache["tokens"], cache["back"], cache["kept"]
    send_splits, recv_splits = cache["splits"]
    w_flat = cache["weights"].ravel()
    dys_mine = w_flat[order, None] * dy2[tokens[order]]
    dweights = np.zeros(len(w_flat), dy2.dtype)
    dweights[order] = (dy2[tokens[order]] * back).sum(-1)
    dys_rows = comm.all_to_all_single(dys_mine, recv_splits, send_splits)
    dys = dys_rows[kept]
    dxs = experts_backward_input(params, cache["experts"], dys)
    grads = experts_backward_weight(params, cache["experts"], dys)
    comm.compute(flops=8 * len(kept) * moe.d_model * moe.d_ff, name="experts backward")
    dx_rows = np.zeros((cache["rows"], moe.d_model), dy2.dtype)
    dx_rows[kept] = dxs
    dx_back = comm.all_to_all_single(dx_rows, send_splits, recv_splits)
    extra = moe.aux_loss_coef * cache["aux_dp"] if moe.aux_loss_coef else None
    dx, dlogits = route_backward(params["router.w"], cache["route"], dweights.reshape(-1, moe.top_k), extra)
    np.add.at(dx, tokens[order], dx_back)
    grads["router.w"] = cache["route"]["x"].T @ dlogits  # this rank's part
    comm.compute(flops=4 * dy2.size * moe.n_experts, name="route backward")
    return dx.reshape(cache["shape"]), grads
