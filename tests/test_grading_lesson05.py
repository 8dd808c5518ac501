"""Lesson 05's checks reject plausible wrong answers and accept other correct ones."""

import numpy as np
import pytest

from emulator.grading import CheckFailed
from emulator.grading import lesson05 as g
from emulator.nn.moe import (capacity, experts_backward_input, experts_backward_weight, experts_forward, route,
                             route_backward)
from emulator.parallel import expert_parallel as ep


# ----------------------------------------------------------------- Exercise 5.1
def test_top_k_route_check(capsys):
    def by_sorting_logits(logits, k):  # softmax is monotone: sorting logits picks the same experts
        idx = np.argsort(-logits, axis=1, kind="stable")[:, :k]
        sel = np.exp(np.take_along_axis(logits, idx, 1) - logits.max(1, keepdims=True))
        return idx, sel / sel.sum(1, keepdims=True)

    g.check_top_k_route(by_sorting_logits)
    assert "PASSED Exercise 5.1" in capsys.readouterr().out

    def raw(logits, k):
        p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        idx = np.argsort(-p, axis=1, kind="stable")[:, :k]
        return idx, np.take_along_axis(p, idx, 1)

    with pytest.raises(CheckFailed, match="renormalise|weights"):
        g.check_top_k_route(raw)
    with pytest.raises(CheckFailed, match="chosen experts differ"):
        g.check_top_k_route(lambda logits, k: (np.argsort(logits, axis=1)[:, :k], np.full((len(logits), k), 1 / k)))
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_top_k_route(lambda logits, k: route(np.eye(logits.shape[1]), logits, k)[:2])


# ----------------------------------------------------------------- Exercise 5.2
def test_permutation_check(capsys):
    def permute_by_loop(ids, n):
        order = [i for e in range(n) for i in range(len(ids)) if ids[i] == e]
        return np.array(order), np.array([np.sum(ids == e) for e in range(n)])

    def unpermute_by_loop(ys, order, tokens, weights, n_tokens):
        y = np.zeros((n_tokens, ys.shape[1]))
        for row, a in enumerate(order):
            y[tokens[a]] += weights.ravel()[a] * ys[row]
        return y

    g.check_permutation(permute_by_loop, unpermute_by_loop)
    assert "PASSED Exercise 5.2" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="stable"):
        g.check_permutation(lambda ids, n: (np.argsort(-ids, kind="stable"), np.bincount(ids, minlength=n)),
                            unpermute_by_loop)  # experts in the wrong order
    with pytest.raises(CheckFailed, match="unpermuted"):
        g.check_permutation(permute_by_loop, lambda ys, order, tokens, weights, n: unpermute_by_loop(
            ys, order, tokens, np.ones_like(weights), n))  # forgets the weights
    with pytest.raises(CheckFailed, match="minlength"):  # right until the last expert gets no token
        g.check_permutation(lambda ids, n: (np.argsort(ids, kind="stable"), np.bincount(ids)), unpermute_by_loop)


# ----------------------------------------------------------------- Exercises 5.3 and 5.4
def ep_forward_with_loops(comm, moe, params, x, drop_remote=False):
    """Right, written differently: one all_to_all_single per phase, rows regrouped with a
    loop over (expert, source)."""
    n, k = comm.size, moe.top_k
    local = moe.n_experts // n
    idx, weights, _ = route(params["router.w"], x, k)
    ids, tokens = idx.ravel(), np.repeat(np.arange(len(x)), k)
    order = np.argsort(ids, kind="stable")
    counts = np.bincount(ids, minlength=moe.n_experts)
    incoming = comm.all_to_all_single(counts).reshape(n, local)
    send, recv = counts.reshape(n, local).sum(1).tolist(), incoming.sum(1).tolist()
    rows = comm.all_to_all_single(x[tokens[order]], recv, send)
    out_rows = np.zeros_like(rows)
    offsets = np.concatenate([[0], np.cumsum(incoming.ravel())]).reshape(-1)
    for j in range(local):
        picks = [np.arange(offsets[i * local + j], offsets[i * local + j] + incoming[i, j]) for i in range(n)]
        sel = np.concatenate(picks).astype(int)
        one = {key: params[key][j:j + 1] for key in ("experts.fc1.w", "experts.fc1.b", "experts.fc2.w",
                                                       "experts.fc2.b")}
        out_rows[sel] = experts_forward(one, rows[sel], np.array([len(sel)]))[0]
    back = comm.all_to_all_single(out_rows, send, recv)
    if drop_remote:
        back[np.repeat(np.arange(n), send) != comm.rank] = 0
    y = np.zeros_like(x)
    np.add.at(y, tokens[order], weights.ravel()[order, None] * back)
    return y


def test_ep_forward_check(capsys):
    g.check_ep_forward(ep_forward_with_loops)
    assert "PASSED Exercise 5.3" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="output"):
        g.check_ep_forward(lambda *a: ep_forward_with_loops(*a, drop_remote=True))

    def all_gather_tokens(comm, moe, params, x):  # right values, but every token goes everywhere
        everything = comm.all_gather(x)
        return ep_forward_with_loops(comm, moe, params, x) + 0 * everything.sum()

    with pytest.raises(CheckFailed, match="three all-to-alls"):
        g.check_ep_forward(all_gather_tokens)
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_ep_forward(lambda comm, moe, params, x: ep.forward(comm, moe, params, x)[0])


def test_ep_backward_check(capsys):
    def backward(comm, moe, params, cache, dy, forget_router=False):
        order, tokens, back, kept = cache["order"], cache["tokens"], cache["back"], cache["kept"]
        send, recv = cache["splits"]
        w = cache["weights"].ravel()
        dweights = np.zeros(len(w))
        dweights[order] = (dy[tokens[order]] * back).sum(-1)
        d_rows = comm.all_to_all_single(w[order, None] * dy[tokens[order]], recv, send)
        dxs = experts_backward_input(params, cache["experts"], d_rows[kept])
        grads = experts_backward_weight(params, cache["experts"], d_rows[kept])
        dx_rows = np.zeros((cache["rows"], dy.shape[1]))
        dx_rows[kept] = dxs
        dx_home = comm.all_to_all_single(dx_rows, send, recv)
        if forget_router:
            dx, dlogits = np.zeros_like(dy), np.zeros((len(dy), moe.n_experts))
        else:
            dx, dlogits = route_backward(params["router.w"], cache["route"], dweights.reshape(-1, moe.top_k))
        np.add.at(dx, tokens[order], dx_home)
        grads["router.w"] = comm.all_reduce(cache["route"]["x"].T @ dlogits)  # summed: also accepted
        return dx, grads

    g.check_ep_backward(backward)
    assert "PASSED Exercise 5.4" in capsys.readouterr().out
    with pytest.raises(CheckFailed):
        g.check_ep_backward(lambda *a: backward(*a, forget_router=True))  # the router's part of dx missing

    def without(key):
        def fn(*a):
            dx, grads = backward(*a)
            grads.pop(key)
            return dx, grads
        return fn

    with pytest.raises(CheckFailed, match="no 'router.w': the router is trained too"):
        g.check_ep_backward(without("router.w"))  # was a raw KeyError
    with pytest.raises(CheckFailed, match="no 'experts.fc2.b': experts_backward_weight"):
        g.check_ep_backward(without("experts.fc2.b"))
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_ep_backward(ep.backward)


# ----------------------------------------------------------------- Exercise 5.5 and napkins
def test_capacity_check(capsys):
    def by_loop(ids, n, cap):
        seen, keep = {}, []
        for e in ids:
            keep.append(seen.get(e, 0) < cap)
            seen[e] = seen.get(e, 0) + 1
        return np.array(keep)

    g.check_capacity(by_loop)
    assert "PASSED Exercise 5.5" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match="first come"):
        g.check_capacity(lambda ids, n, cap: by_loop(ids[::-1], n, cap)[::-1])  # last come first served
    with pytest.raises(CheckFailed, match="first come"):
        g.check_capacity(lambda ids, n, cap: by_loop(ids, n, cap + 1))  # off by one


# ----------------------------------------------------------------- Exercise 5.6
def keep_by_loop(ids, n, cap):
    seen, keep = {}, []
    for e in ids:
        keep.append(seen.get(e, 0) < cap)
        seen[e] = seen.get(e, 0) + 1
    return np.array(keep, bool)


def ep_capacity_key(comm, moe, params, x, order_of_line="token", per_rank=False):
    """The key's method (drop at the owner); wrong in the way the flags say."""
    n, k = comm.size, moe.top_k
    local = moe.n_experts // n
    idx, weights, _ = route(params["router.w"], x, k)
    ids, tokens = idx.ravel(), np.repeat(np.arange(len(x)), k)
    order = np.argsort(ids, kind="stable")
    counts = np.bincount(ids, minlength=moe.n_experts)
    incoming = comm.all_to_all_single(counts).reshape(n, local)
    send, recv = counts.reshape(n, local).sum(1).tolist(), incoming.sum(1).tolist()
    rows = comm.all_to_all_single(x[tokens[order]], recv, send)
    starts = np.concatenate([[0], np.cumsum(incoming.ravel())])[:-1].reshape(n, local)
    by_expert = np.concatenate([np.arange(starts[i, j], starts[i, j] + incoming[i, j])
                                for j in range(local) for i in range(n)]).astype(int)
    mine = np.repeat(np.arange(local), incoming.sum(0))
    tokens_seen = len(x) if per_rank else n * len(x)
    cap = capacity(tokens_seen, k, moe.n_experts, moe.capacity_factor)
    if per_rank:  # each source rank's rows against a capacity of its own
        source = np.concatenate([np.repeat(np.arange(n), incoming[:, j]) for j in range(local)])
        keep = np.zeros(len(mine), bool)
        for i in range(n):
            keep[source == i] = keep_by_loop(mine[source == i], local, cap)
    elif order_of_line == "reversed":  # last come first served
        keep = keep_by_loop(mine[::-1], local, cap)[::-1]
    else:
        keep = keep_by_loop(mine, local, cap)
    ys, _ = experts_forward(params, rows[by_expert[keep]], np.bincount(mine[keep], minlength=local))
    back_rows = np.zeros_like(rows)
    back_rows[by_expert[keep]] = ys
    back = comm.all_to_all_single(back_rows, send, recv)
    out = np.zeros_like(x)
    np.add.at(out, tokens[order], weights.ravel()[order, None] * back)
    return out


def ep_capacity_dropping_before_sending(comm, moe, params, x):
    """Right, differently: every rank all-gathers the counts, works out which of its rows fit
    (earlier ranks' rows come first in each expert's line), and sends only those."""
    n, k = comm.size, moe.top_k
    local = moe.n_experts // n
    idx, weights, _ = route(params["router.w"], x, k)
    ids, tokens = idx.ravel(), np.repeat(np.arange(len(x)), k)
    everyone = comm.all_gather(np.bincount(ids, minlength=moe.n_experts)[None])  # (n, E)
    before = everyone[:comm.rank].sum(0)  # rows of each expert from earlier ranks
    cap = capacity(n * len(x), k, moe.n_experts, moe.capacity_factor)
    order = np.argsort(ids, kind="stable")
    place = np.zeros(len(ids), int)
    for e in range(moe.n_experts):
        mine_e = order[ids[order] == e]
        place[mine_e] = before[e] + np.arange(len(mine_e))
    sent = order[place[order] < cap]  # my kept assignments, by expert
    counts = np.bincount(ids[sent], minlength=moe.n_experts)
    incoming = comm.all_to_all_single(counts).reshape(n, local)
    send, recv = counts.reshape(n, local).sum(1).tolist(), incoming.sum(1).tolist()
    rows = comm.all_to_all_single(x[tokens[sent]], recv, send)
    out_rows = np.zeros_like(rows)
    starts = np.concatenate([[0], np.cumsum(incoming.ravel())])[:-1].reshape(n, local)
    for j in range(local):
        pick = np.concatenate([np.arange(starts[i, j], starts[i, j] + incoming[i, j]) for i in range(n)]).astype(int)
        one = {key: params[key][j:j + 1] for key in ("experts.fc1.w", "experts.fc1.b", "experts.fc2.w",
                                                       "experts.fc2.b")}
        out_rows[pick] = experts_forward(one, rows[pick], np.array([len(pick)]))[0]
    back = comm.all_to_all_single(out_rows, send, recv)
    out = np.zeros_like(x)
    np.add.at(out, tokens[sent], weights.ravel()[sent, None] * back)
    return out


def test_ep_capacity_check(capsys):
    g.check_ep_capacity(lambda *a: ep_capacity_key(*a))
    g.check_ep_capacity(ep_capacity_dropping_before_sending)  # fewer bytes, same drops: also right
    assert capsys.readouterr().out.count("PASSED Exercise 5.6") == 2
    with pytest.raises(CheckFailed, match="nothing was dropped"):
        g.check_ep_capacity(ep_forward_with_loops)  # Exercise 5.3's dropless layer
    with pytest.raises(CheckFailed, match="each rank's tokens apart"):
        g.check_ep_capacity(lambda *a: ep_capacity_key(*a, per_rank=True))
    with pytest.raises(CheckFailed, match="output"):
        g.check_ep_capacity(lambda *a: ep_capacity_key(*a, order_of_line="reversed"))
    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_ep_capacity(lambda comm, moe, params, x: ep.forward(comm, moe, params, x)[0])


def test_napkin_checks(capsys):
    g.napkin_a2a(lambda tokens=4096, d_model=7168, top_k=8, ep=64, dtype_bytes=2:
                 2 * tokens * top_k * d_model * dtype_bytes * (1 - 1 / ep))

    def drops(tokens=4096, top_k=2, n_experts=8, capacity_factor=1.25, hot_share=0.3):
        cap = np.ceil(capacity_factor * tokens * top_k / n_experts)
        hot = hot_share * tokens * top_k
        rest = (tokens * top_k - hot) / (n_experts - 1)
        return max(hot - cap, 0) + (n_experts - 1) * max(rest - cap, 0)

    g.napkin_drops(drops)
    out = capsys.readouterr().out
    assert "PASSED Napkin 5.1" in out and "PASSED Napkin 5.2" in out
    with pytest.raises(CheckFailed):  # counts the rows that stay on the GPU too
        g.napkin_a2a(lambda tokens=4096, d_model=7168, top_k=8, ep=64, dtype_bytes=2:
                     2 * tokens * top_k * d_model * dtype_bytes)
    with pytest.raises(CheckFailed, match="hot expert"):
        g.napkin_drops(lambda tokens=4096, top_k=2, n_experts=8, capacity_factor=1.25, hot_share=0.3:
                       max(0, hot_share * tokens * top_k - np.ceil(capacity_factor * tokens * top_k / n_experts)))
