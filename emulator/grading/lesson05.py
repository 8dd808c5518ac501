"""Checks for lesson 05 (mixture of experts, expert parallelism).

Routing, permutation and capacity are compared with brute-force references on many random
cases (experts that receive nothing included); the expert-parallel forward and backward,
dropless and with capacity, with the single-device ``nn.MoE`` on the concatenation of
every rank's tokens, for ep = 1, 2, 4, several expert counts and k = 1, 2, and their traces
are read (an all-to-all of counts, then uneven all-to-alls whose split sizes are the routed
counts). While a check runs, the library's own versions refuse.
"""

import numpy as np

from .. import nn
from ..engine.world import World
from ..accounting import moe as formulas
from ..nn import moe as M
from ..parallel import expert_parallel as EP
from .common import CheckFailed, compare_arrays, expect, passed, run_on_emulator
from .napkins import variants
from .refuse import refusing

ROUTING = (M.route,)
PERMUTE = (M.permutation,)
FORWARD = (EP.forward,)
BACKWARD = (EP.backward,)
CAPACITY = (M.keep_first, M.keep_first_choices_first)
EP_CAPACITY = (EP.forward, M.keep_first, M.keep_first_choices_first)
SHAPES = [(4, 1), (4, 2), (8, 2), (8, 1)]


def _softmax(z):
    e = np.exp(z - z.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def check_top_k_route(fn):
    """Exercise 5.1: fn(logits (T, E), k) -> (expert ids (T, k), weights (T, k))."""
    what = "Exercise 5.1"
    rng = np.random.default_rng(0)
    for t, e, k in [(1, 2, 1), (7, 4, 1), (16, 8, 2), (30, 6, 3), (5, 4, 4)]:
        logits = rng.standard_normal((t, e)) * 3
        with refusing(what, *ROUTING):
            idx, w = fn(logits.copy(), k)
        p = _softmax(logits)
        want = np.argsort(-p, axis=1, kind="stable")[:, :k]
        expect(np.shape(idx) == (t, k), f"{what}: expert ids of shape {np.shape(idx)}, expected ({t}, {k})")
        expect(np.array_equal(np.asarray(idx), want), f"{what}, {e} experts, k={k}: the chosen experts differ; "
                                                       f"take each token's k most probable, most probable first")
        sel = np.take_along_axis(p, want, 1)
        compare_arrays(f"{what}, {e} experts, k={k}: weights", w, sel / sel.sum(1, keepdims=True))
        if 1 < k < e and np.allclose(np.asarray(w), sel):
            raise CheckFailed(f"{what}: the weights are the raw probabilities; renormalise them over the k chosen")
    passed(what, "top-k experts and weights renormalised over them, for 5 shapes up to k = 4")


def check_permutation(permute, unpermute):
    """Exercise 5.2: permute(expert_ids, n_experts) -> (order, counts);
    unpermute(ys, order, tokens, weights, n_tokens) -> y (n_tokens, d)."""
    what = "Exercise 5.2"
    rng = np.random.default_rng(1)
    # the last two cases leave the last expert (and then the first too) with no assignment
    for t, e, k, unused in [(6, 3, 1, ()), (20, 4, 2, ()), (33, 8, 2, ()), (10, 5, 3, ()), (12, 6, 2, (5,)),
                            (9, 7, 1, (0, 6))]:
        pool = np.setdiff1d(np.arange(e), unused)
        idx = np.stack([rng.permutation(pool)[:k] for _ in range(t)])
        ids, tokens = idx.ravel(), np.repeat(np.arange(t), k)
        with refusing(what, *PERMUTE):
            order, counts = permute(ids.copy(), e)
        want = np.argsort(ids, kind="stable")
        expect(np.array_equal(np.asarray(order), want), f"{what}, {t} tokens, {e} experts, k={k}: the order differs; "
               f"sort the assignments by expert, keeping token order within each expert (a stable sort)")
        want_counts = np.bincount(ids, minlength=e)
        expect(np.shape(counts) == (e,), f"{what}, {e} experts, expert(s) {list(unused)} chosen by no token: counts "
               f"has shape {np.shape(counts)}, expected ({e},): one count per expert, zeros included (np.bincount "
               f"stops at the largest id it sees unless given minlength)")
        expect(np.array_equal(np.asarray(counts), want_counts),
               f"{what}: counts must list the assignments of every expert 0..{e - 1} (zeros included)")
        ys = rng.standard_normal((len(ids), 5))
        weights = rng.random((t, k))
        with refusing(what, *PERMUTE):
            y = unpermute(ys.copy(), want, tokens, weights.copy(), t)
        ref = np.zeros((t, 5))
        np.add.at(ref, tokens[want], weights.ravel()[want, None] * ys)
        compare_arrays(f"{what}, {t} tokens, k={k}: unpermuted output", y, ref)
    passed(what, "assignments sorted by expert (stable) with their counts, and outputs weighted back to their tokens")


def _layer(e, k, cf=None, seed=0):
    moe = nn.MoE(8, 16, e, k, cf, dtype=np.float64)
    p = moe.init(np.random.default_rng(seed))
    p["router.w"] *= 40  # an uneven router: uneven splits
    return moe, p


def check_ep_forward(fn):
    """Exercise 5.3: fn(comm, moe, params_local, x_local) -> y_local (dropless)."""
    what = "Exercise 5.3"
    for size in (1, 2, 4):
        for e, k in SHAPES:
            moe, p = _layer(e, k, seed=size + e)
            x = np.random.default_rng(size).standard_normal((4 * size, 8))
            y, _ = moe.forward(p, x)
            xs = np.split(x, size)
            world = World(size)
            label = f"{what}, ep={size}, {e} experts, k={k}"
            with refusing(what, *FORWARD):
                got = run_on_emulator(world, lambda comm: fn(comm, moe, EP.shard_experts(p, size, comm.rank),
                                                             xs[comm.rank].copy()), label)
            compare_arrays(f"{label}: output", np.concatenate([np.asarray(g).reshape(-1, 8) for g in got]), y)
            for r in range(size):
                calls = world.calls[r]
                a2a = [c for c in calls if c.op.startswith("all_to_all")]
                expect(len(calls) == 3 and len(a2a) == 3, f"{label}: rank {r} made {[c.op for c in calls]}; the "
                       f"forward needs three all-to-alls: the counts, the dispatch and the combine")
                rows = 4 * k * 8 * 8  # every assignment of this rank's 4 tokens, one row of 8 float64 each
                expect(calls[1].nbytes == rows and calls[2].nbytes >= 0, f"{label}: rank {r}'s dispatch moved "
                       f"{calls[1].nbytes} bytes; it should send exactly its {4 * k} routed rows ({rows} bytes), "
                       f"split by the counts")
    passed(what, "expert parallelism equals the single-device layer for ep = 1, 2, 4, 4 and 8 experts, k = 1, 2; "
                 "counts, dispatch and combine, with split sizes from the routed counts")


def check_ep_backward(fn):
    """Exercise 5.4: fn(comm, moe, params_local, cache, dy_local) -> (dx_local, grads_local)."""
    what = "Exercise 5.4"
    for size in (1, 2, 4):
        for e, k in SHAPES:
            moe, p = _layer(e, k, seed=10 + size + e)
            rng = np.random.default_rng(size)
            x, dy = rng.standard_normal((4 * size, 8)), rng.standard_normal((4 * size, 8))
            y, cache = moe.forward(p, x)
            dx, grads = moe.backward(p, cache, dy)
            xs, dys = np.split(x, size), np.split(dy, size)
            label = f"{what}, ep={size}, {e} experts, k={k}"
            fwd = World(size).run(lambda comm: EP.forward(comm, moe, EP.shard_experts(p, size, comm.rank),
                                                          xs[comm.rank]))  # the library's forward
            world = World(size)
            with refusing(what, *BACKWARD):
                got = run_on_emulator(world, lambda comm: fn(comm, moe, EP.shard_experts(p, size, comm.rank),
                                                             fwd[comm.rank][1], dys[comm.rank].copy()), label)
            compare_arrays(f"{label}: input gradient", np.concatenate([np.asarray(g[0]).reshape(-1, 8) for g in got]),
                           dx)
            for r, g in enumerate(got):
                mine = g[1] if isinstance(g, (tuple, list)) and len(g) == 2 else None
                expect(isinstance(mine, dict), f"{label}: rank {r} returned {type(mine).__name__} for the gradients; "
                       f"return (dx, grads) with grads a dict keyed like params")
                for key in grads:
                    if key in mine:
                        continue
                    if key == "router.w":
                        raise CheckFailed(f"{label}: rank {r}'s gradients have no 'router.w': the router is trained "
                                          f"too. Its weights get a gradient through each token's expert weights: "
                                          f"route_backward(params['router.w'], cache['route'], dweights) gives "
                                          f"dlogits, and the router's gradient is x.T @ dlogits")
                    raise CheckFailed(f"{label}: rank {r}'s gradients have no {key!r}: experts_backward_weight gives "
                                      f"the gradients of this rank's experts")
            for key in grads:
                if key == "router.w":
                    mine = [g[1][key] for g in got]
                    ok = np.allclose(sum(mine), grads[key]) or all(np.allclose(m, grads[key]) for m in mine)
                    expect(ok, f"{label}: the router's gradient is neither each rank's part (summing to one device's) "
                               f"nor the sum on every rank")
                else:
                    compare_arrays(f"{label}: gradient of {key}", np.concatenate([g[1][key] for g in got]), grads[key])
            ops = [c.op for c in world.calls[0]]
            a2a = [op for op in ops if op.startswith("all_to_all")]
            expect(len(a2a) == 2 and set(ops) - {"all_to_all_single", "all_reduce"} == set(),
                   f"{label}: the backward made {ops}; it needs two all-to-alls: output gradients out to the experts, "
                   f"input gradients back (the counts are known); an all-reduce of the router's gradient is allowed")
    passed(what, "input and every parameter gradient equal the single-device layer for ep = 1, 2, 4; two all-to-alls")


def check_capacity(fn):
    """Exercise 5.5: fn(expert_ids, n_experts, capacity) -> keep (bool per assignment)."""
    what = "Exercise 5.5"
    rng = np.random.default_rng(2)
    for n, e, cap in [(10, 2, 3), (40, 4, 8), (64, 8, 1), (50, 5, 20), (30, 3, 0)]:
        ids = rng.choice(e, n, p=np.linspace(1, 3, e) / np.linspace(1, 3, e).sum())
        with refusing(what, *CAPACITY):
            keep = np.asarray(fn(ids.copy(), e, cap), bool)
        seen = np.zeros(e, int)
        want = np.zeros(n, bool)
        for i, x in enumerate(ids):
            want[i] = seen[x] < cap
            seen[x] += 1
        expect(keep.shape == (n,), f"{what}: return one flag per assignment ({n}), got shape {keep.shape}")
        bad = np.nonzero(keep != want)[0]
        if len(bad):
            i = bad[0]
            raise CheckFailed(f"{what}, capacity {cap}: assignment {i} (expert {ids[i]}, #{(ids[:i] == ids[i]).sum()} "
                              f"in its line) should be {'kept' if want[i] else 'dropped'}: first come, first served")
    passed(what, "the first `capacity` assignments of each expert kept, the rest dropped, in 5 cases")


def _skewed_layer(e, k, cf, seed):
    moe = nn.MoE(8, 16, e, k, cf, dtype=np.float64)
    p = moe.init(np.random.default_rng(seed))
    p["router.w"] *= 40
    p["router.w"][:, 0] += 0.5  # expert 0 is everybody's favourite: it overflows
    return moe, p


def _per_rank_capacity(moe, p, xs):
    """The wrong reference: capacity applied to each rank's tokens apart."""
    part = nn.MoE(moe.d_model, moe.d_ff, moe.n_experts, moe.top_k, moe.capacity_factor, dtype=np.float64)
    return np.concatenate([part.forward(p, x)[0] for x in xs])


def check_ep_capacity(fn):
    """Exercise 5.6: fn(comm, moe, params_local, x_local) -> y_local, with the layer's
    capacity: the same assignments dropped as on one device."""
    what = "Exercise 5.6"
    for size in (1, 2, 4):
        for e, k in SHAPES:
            for cf in (0.5, 1.0, 1.5):
                moe, p = _skewed_layer(e, k, cf, seed=size + e + int(4 * cf))
                x = np.random.default_rng(size + k).standard_normal((6 * size, 8))
                y, cache = moe.forward(p, x)
                xs = np.split(x, size)
                world = World(size)
                label = f"{what}, ep={size}, {e} experts, k={k}, capacity factor {cf}"
                with refusing(what, *EP_CAPACITY):
                    got = run_on_emulator(world, lambda comm: fn(comm, moe, EP.shard_experts(p, size, comm.rank),
                                                                 xs[comm.rank].copy()), label)
                out = np.concatenate([np.asarray(g).reshape(-1, 8) for g in got])
                if not np.allclose(out, y, rtol=1e-9, atol=1e-9):
                    dropless = nn.MoE(8, 16, e, k, None, dtype=np.float64).forward(p, x)[0]
                    if cache["dropped"] and np.allclose(out, dropless, rtol=1e-9, atol=1e-9):
                        raise CheckFailed(f"{label}: nothing was dropped, but {cache['dropped']} assignments overflow: "
                                          f"each expert computes at most ceil(c T k / E) rows of the whole batch "
                                          f"(T: every rank's tokens)")
                    if size > 1 and np.allclose(out, _per_rank_capacity(moe, p, xs), rtol=1e-9, atol=1e-9):
                        raise CheckFailed(f"{label}: you applied the capacity to each rank's tokens apart; an expert's "
                                          f"buffer takes the first ceil(c T k / E) rows of the whole batch, in token "
                                          f"order: rank 0's tokens, then rank 1's, ...")
                    compare_arrays(f"{label}: output", out, y)
                for r in range(size):
                    ops = [c.op for c in world.calls[r]]
                    expect(set(ops) <= {"all_to_all_single", "all_to_all", "all_gather"} and
                           sum(op.startswith("all_to_all") for op in ops) >= (2 if size > 1 else 0),
                           f"{label}: rank {r} made {ops}; dispatch and combine are all-to-alls (counts may be "
                           f"exchanged with an all-to-all or an all-gather)")
                routed = size * 6 * k * 8 * 8  # every assignment of every rank's 6 tokens: rows of 8 float64
                moved = sum(c.nbytes for r in range(size) for c in world.calls[r])
                expect(moved <= 2 * routed + size * 8 * 8 * e, f"{label}: the ranks moved {moved} bytes; dispatching "
                       f"every routed row once and combining it once is {2 * routed} bytes (plus the counts)")
    passed(what, "expert parallelism with capacity drops what one device drops (token order over the whole batch) "
                 "for ep = 1, 2, 4, 4 and 8 experts, k = 1, 2, capacity factors 0.5 to 1.5")


def napkin_a2a(fn):
    """fn(tokens, d_model, top_k, ep, dtype_bytes) -> bytes per GPU per MoE layer, forward."""
    cases = [dict(tokens=4096, d_model=7168, top_k=8, ep=64, dtype_bytes=2),
             dict(tokens=8192, d_model=6144, top_k=2, ep=8, dtype_bytes=2),
             dict(tokens=2048, d_model=4096, top_k=8, ep=32, dtype_bytes=1),
             dict(tokens=1024, d_model=2048, top_k=4, ep=4, dtype_bytes=4)]
    (b,) = variants("Napkin 5.1", lambda **kw: (fn(**kw),), cases,
                    lambda **kw: (formulas.all_to_all_bytes_per_layer(**kw),), " B", ("bytes",),
                    (formulas.all_to_all_bytes_per_layer,))
    passed("Napkin 5.1", f"{b / 1e6:.0f} MB per GPU per layer for the dispatch and combine of 4096 tokens")


def napkin_drops(fn):
    """fn(tokens, top_k, n_experts, capacity_factor, hot_share) -> assignments dropped."""
    cases = [dict(tokens=4096, top_k=2, n_experts=8, capacity_factor=1.25, hot_share=0.3),
             dict(tokens=1024, top_k=1, n_experts=4, capacity_factor=1.0, hot_share=0.5),
             dict(tokens=8192, top_k=8, n_experts=64, capacity_factor=2.0, hot_share=0.05),
             dict(tokens=1024, top_k=1, n_experts=4, capacity_factor=1.0, hot_share=0.1)]  # the rest overflow

    def model(**kw):
        return (formulas.expected_drops(**kw),)

    def wrapped(**kw):
        return (fn(**kw),)

    for i, case in enumerate(cases):  # a case may drop nothing: compare with an absolute slack too
        with refusing("Napkin 5.2", formulas.expected_drops):
            got = wrapped() if i == 0 else wrapped(**case)
        want = model(**case)[0]
        try:
            ok = abs(float(got[0]) - want) <= max(1.0, 0.02 * want)
        except (TypeError, ValueError):
            ok = False
        expect(ok, f"Napkin 5.2 ({', '.join(f'{k}={v:g}' for k, v in case.items())}): {got[0]!r} dropped is off; "
                   f"count the hot expert's overflow and the others' separately")
    passed("Napkin 5.2", f"{model(**cases[0])[0]:,.0f} of {4096 * 2:,} assignments dropped when one of 8 experts "
                         f"gets 30% of them at capacity factor 1.25")
