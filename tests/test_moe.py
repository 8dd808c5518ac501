"""Expert parallelism against the single-device MoE layer (tests/test_moe_layer.py holds the
layer against torch): the experts sharded over ranks or split by tensor parallelism, and the
dispatch in two hops across nodes against the flat one."""

import time

import numpy as np
import pytest

from emulator import ConfigError, World
from emulator.parallel import expert_parallel as ep
from tests._moe import layer


def test_shard_experts_contract():
    moe, p = layer(8, 2, None)
    parts = [ep.shard_experts(p, 4, r) for r in range(4)]
    for r, part in enumerate(parts):
        assert set(part) == set(p) and part["router.w"] is p["router.w"]
        assert np.array_equal(part["experts.fc1.w"], p["experts.fc1.w"][2 * r:2 * r + 2])
    with pytest.raises(ValueError, match="do not split evenly over 3"):
        ep.shard_experts(p, 3, 0)


@pytest.mark.parametrize("ep_size", [1, 2, 4])
@pytest.mark.parametrize("n_experts, top_k, cf", [(4, 1, None), (8, 2, None), (8, 2, 1.0), (8, 1, 0.5), (4, 2, 1.25)])
def test_expert_parallel_equals_one_device(ep_size, n_experts, top_k, cf):
    moe, p = layer(n_experts, top_k, cf)
    rng = np.random.default_rng(5)
    x, dy = rng.standard_normal((4, 6, 8)), rng.standard_normal((4, 6, 8))
    y, cache = moe.forward(p, x)
    dx, grads = moe.backward(p, cache, dy)
    xs, dys = np.split(x, ep_size), np.split(dy, ep_size)

    def prog(comm):
        local = ep.shard_experts(p, comm.size, comm.rank)
        yl, cl = ep.forward(comm, moe, local, xs[comm.rank])
        return (yl,) + ep.backward(comm, moe, local, cl, dys[comm.rank]) + (cl,)

    world = World(ep_size)
    out = world.run(prog)
    np.testing.assert_allclose(np.concatenate([o[0] for o in out]), y, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([o[1] for o in out]), dx, atol=1e-12)
    for k in grads:
        got = sum(o[2][k] for o in out) if k == "router.w" else np.concatenate([o[2][k] for o in out])
        np.testing.assert_allclose(got, grads[k], atol=1e-12, err_msg=k)
    assert sum(o[3]["dropped"] for o in out) == cache["dropped"]
    # the trace: (with capacity, the group's counts), counts, dispatch, combine forward; two more backward;
    # uneven splits = the kept assignments: a dropped one is never sent
    for r in range(ep_size):
        calls = world.calls[r]
        if cf is not None and ep_size > 1:  # one rank is its own group: nothing to ask
            assert calls[0].op == "all_gather" and calls[0].group == "world"
            calls = calls[1:]
        assert [c.op for c in calls] == ["all_to_all_single"] * 5
        kept = len(xs[r].reshape(-1, 8)) * top_k - out[r][3]["dropped"]
        assert calls[1].nbytes == kept * 8 * 8 and calls[3].nbytes == kept * 8 * 8


def test_expert_parallel_with_the_load_balancing_loss():
    moe, p = layer(4, 2, None, aux=0.01)
    x = np.random.default_rng(6).standard_normal((8, 8))
    y, cache = moe.forward(p, x)
    _, grads = moe.backward(p, cache, np.ones_like(y))

    def prog(comm):
        local = ep.shard_experts(p, 2, comm.rank)
        yl, cl = ep.forward(comm, moe, local, np.split(x, 2)[comm.rank])
        return cl["aux_loss"], ep.backward(comm, moe, local, cl, np.ones_like(yl))[1]["router.w"]

    out = World(2).run(prog)
    assert out[0][0] == pytest.approx(cache["aux_loss"]) == out[1][0]
    np.testing.assert_allclose(out[0][1] + out[1][1], grads["router.w"], atol=1e-12)


def test_expert_parallel_misuse_fails_fast():
    moe, p = layer(4, 1, None)
    t0 = time.perf_counter()
    with pytest.raises(ConfigError, match="do not split over an ep group of 3"):
        World(3).run(lambda comm: ep.forward(comm, moe, p, np.zeros((3, 8))))
    with pytest.raises(ConfigError, match="shard_experts"):
        World(2).run(lambda comm: ep.forward(comm, moe, p, np.zeros((3, 8))))
    assert time.perf_counter() - t0 < 1


@pytest.mark.parametrize("t", [1, 2, 4])
@pytest.mark.parametrize("cf", [None, 1.0])
def test_tensor_parallel_experts_equal_one_device(t, cf):
    from emulator.parallel.expert_parallel.alternatives import shard_experts_tp, tp_moe_forward

    moe, p = layer(8, 2, cf)
    x = np.random.default_rng(4).standard_normal((24, 8))
    want, _ = moe.forward(p, x)
    world = World(t)
    out = world.run(lambda comm: tp_moe_forward(comm, moe, shard_experts_tp(p, t, comm.rank), x))
    assert all(np.allclose(o, want, atol=1e-12) for o in out)
    assert [c.op for c in world.calls[0]] == ["all_reduce"]  # one dense all-reduce
    with pytest.raises(ConfigError, match="d_ff 16 does not split over 3"):
        shard_experts_tp(p, 3, 0)


@pytest.mark.parametrize("nodes, per_node", [(2, 4), (3, 2), (1, 4)])
def test_two_hop_all_to_all_equals_the_flat_one(nodes, per_node):
    from emulator.parallel.expert_parallel.alternatives import hierarchical_all_to_all

    n = nodes * per_node
    chunks = [[np.full(3, 100.0 * src + dst) for dst in range(n)] for src in range(n)]
    flat = World(n).run(lambda comm: comm.all_to_all(chunks[comm.rank]))
    two = World(n).run(lambda comm: hierarchical_all_to_all(comm, chunks[comm.rank], per_node))
    for r in range(n):
        assert [c.tolist() for c in two[r]] == [c.tolist() for c in flat[r]]
        assert [c[0] for c in two[r]] == [100.0 * src + r for src in range(n)]
    with pytest.raises(Exception, match="not whole nodes"):
        World(3).run(lambda comm: hierarchical_all_to_all(comm, chunks[0][:3], 2))


@pytest.mark.parametrize("cf, aux", [(1.0, 0.0), (None, 0.3), (0.75, 0.3)])
def test_expert_parallel_with_unequal_token_counts_per_rank(cf, aux):
    """Capacity and the load-balancing loss are statistics of all the group's tokens: with 3,
    9 and 4 tokens on three ranks they must be the single device's on the 16 tokens."""
    moe, p = layer(6, 2, cf, aux=aux)
    rng = np.random.default_rng(7)
    sizes = [3, 9, 4]
    x, dy = rng.standard_normal((16, 8)), rng.standard_normal((16, 8))
    y, cache = moe.forward(p, x)
    dx, grads = moe.backward(p, cache, dy)
    cuts = np.cumsum([0] + sizes)

    def prog(comm):
        local = ep.shard_experts(p, comm.size, comm.rank)
        mine = slice(cuts[comm.rank], cuts[comm.rank + 1])
        yl, cl = ep.forward(comm, moe, local, x[mine])
        return (yl,) + ep.backward(comm, moe, local, cl, dy[mine]) + (cl,)

    out = World(3).run(prog)
    np.testing.assert_allclose(np.concatenate([o[0] for o in out]), y, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([o[1] for o in out]), dx, atol=1e-12)
    np.testing.assert_allclose(sum(o[2]["router.w"] for o in out), grads["router.w"], atol=1e-12)
    assert sum(o[3]["dropped"] for o in out) == cache["dropped"]
    if aux:
        assert all(o[3]["aux_loss"] == pytest.approx(cache["aux_loss"]) for o in out)


@pytest.mark.parametrize("nodes, per_node", [(2, 4), (3, 2), (4, 2)])
def test_two_hop_all_to_all_crosses_the_nics_first_then_nvlink(nodes, per_node):
    """DeepSeek-V3's order (report section 3.2.2; DeepEP's RDMA senders, then forwarders to
    NVLink): every cross-node message of the first hop goes between GPUs of one local index,
    and ends before the second hop, all on NVLink, starts."""
    from emulator import Topology
    from emulator.parallel.expert_parallel.alternatives import hierarchical_all_to_all

    n = nodes * per_node
    chunks = [[np.full(5, 100.0 * src + dst) for dst in range(n)] for src in range(n)]
    world = World(n, topology=Topology(gpus_per_node=per_node))
    world.run(lambda comm: hierarchical_all_to_all(comm, chunks[comm.rank], per_node))
    nic = [t for t in world.trace if t.link == "nic"]
    nvlink = [t for t in world.trace if t.link == "nvlink"]
    assert nic and nvlink
    assert all(t.src % per_node == t.dst % per_node for t in nic)  # the rail: same local index
    assert max(t.end for t in nic) <= min(t.start for t in nvlink)
    assert {t.nbytes for t in nic} == {per_node * 5 * 8}  # one message per remote node: a node's worth


def random_dispatch(n, tokens, k, seed, max_nodes=None, per_node=4):
    """Per rank: rows and a (tokens, n) destination mask, k distinct GPUs per token, on at
    most ``max_nodes`` nodes."""
    rng = np.random.default_rng(seed)
    xs, dests = [], []
    for _ in range(n):
        xs.append(rng.standard_normal((tokens, 3)))
        d = np.zeros((tokens, n), bool)
        for t in range(tokens):
            nodes = rng.permutation(n // per_node)[:max_nodes or n // per_node]
            gpus = np.concatenate([np.arange(b * per_node, (b + 1) * per_node) for b in nodes])
            d[t, rng.choice(gpus, min(k, len(gpus)), replace=False)] = True
        dests.append(d)
    return xs, dests


@pytest.mark.parametrize("nodes, per_node, tokens, k", [(2, 4, 9, 3), (3, 2, 5, 4), (4, 4, 12, 8), (1, 4, 7, 2),
                                                         (2, 4, 0, 2)])
def test_two_hop_dispatch_delivers_what_the_flat_one_does_crossing_each_node_once(nodes, per_node, tokens, k):
    from emulator import Topology
    from emulator.parallel.expert_parallel.alternatives import flat_dispatch, two_hop_dispatch

    n = nodes * per_node
    xs, dests = random_dispatch(n, tokens, k, seed=n + tokens, per_node=per_node)
    topo = Topology(gpus_per_node=per_node)
    flat_world, two_world = World(n, topology=topo), World(n, topology=topo)
    flat = flat_world.run(lambda comm: flat_dispatch(comm, xs[comm.rank], dests[comm.rank]))
    two = two_world.run(lambda comm: two_hop_dispatch(comm, xs[comm.rank], dests[comm.rank], per_node))
    for r in range(n):
        for i in range(n):
            np.testing.assert_array_equal(two[r][i], xs[i][dests[i][:, r]])
            np.testing.assert_array_equal(flat[r][i], two[r][i])
    def nic_bytes(world):
        return sum(t.nbytes for t in world.trace if t.link == "nic")

    node_of = np.arange(n) // per_node
    copies = sum(int((d & (node_of != src // per_node)).sum()) for src, d in enumerate(dests))
    per_node_copies = sum(int(np.logical_or.reduceat(d, np.arange(0, n, per_node), axis=1)[:, np.arange(nodes) !=
                                                                                         src // per_node].sum())
                          for src, d in enumerate(dests)) if tokens else 0
    # rows of 3 float64 (24 B); one int64 count per message; the two-hop rows carry their node's mask (per_node B)
    assert nic_bytes(flat_world) == 24 * copies + 8 * n * (n - per_node)  # a copy per remote GPU
    assert nic_bytes(two_world) == (24 + per_node) * per_node_copies + 8 * n * (nodes - 1)  # a copy per remote node


def test_node_limited_routing_bounds_what_crosses_the_nics():
    """Each token to 8 GPUs on at most 2 of 4 nodes: the two-hop dispatch sends it over the
    NICs at most once per remote node, the flat one once per remote GPU; with bytes large
    enough, the two-hop dispatch finishes first."""
    from emulator import Topology
    from emulator.parallel.expert_parallel.alternatives import flat_dispatch, two_hop_dispatch

    n, per_node, tokens = 16, 4, 64
    xs, dests = random_dispatch(n, tokens, 8, seed=3, max_nodes=2, per_node=per_node)
    xs = [np.repeat(x, 300, axis=1) for x in xs]  # wide rows: bandwidth, not latency
    topo = Topology(gpus_per_node=per_node)
    times = {}
    for name, fn in (("flat", lambda comm: flat_dispatch(comm, xs[comm.rank], dests[comm.rank])),
                     ("two hops", lambda comm: two_hop_dispatch(comm, xs[comm.rank], dests[comm.rank], per_node))):
        w = World(n, topology=topo)
        w.run(fn)
        times[name] = max(w.stats().time)
        nic = sum(t.nbytes for t in w.trace if t.link == "nic")
        times[name + " nic"] = nic
    assert times["two hops nic"] < 0.6 * times["flat nic"]
    assert times["two hops"] < times["flat"]
