"""Ring collectives over channels: every channel's ring, in every order, gives the reference;
messages go to ring neighbours only; crossing pieces sit on different GPUs' NICs."""

import numpy as np
import pytest

from emulator import Topology, World
from emulator.algorithms import global_view as C
from emulator.algorithms import step_plans as P

TOPO = Topology(gpus_per_node=4)


def rings_of(ranks, topo=TOPO):
    return lambda c: topo.rings(ranks, c)


@pytest.mark.parametrize("ranks", [tuple(range(8)), tuple(range(12)), (0, 4, 8), (1, 2, 5, 6, 9, 10), (7, 3, 6, 2)])
@pytest.mark.parametrize("channels", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("elems", [5, 96, 20000])
def test_channels_give_the_reference(ranks, channels, elems):
    n = len(ranks)
    rng = np.random.default_rng(elems + channels)
    bufs = [rng.standard_normal(elems) for _ in range(n)]
    out, steps = P.run_plan(P.plan_all_reduce(bufs, "sum", "ring", channels, rings_of(ranks)))
    assert all(np.allclose(o, np.sum(bufs, axis=0), rtol=1e-12, atol=1e-12) for o in out)
    rs_bufs = [b[: elems - elems % n] for b in bufs]
    out, _ = P.run_plan(P.plan_reduce_scatter(rs_bufs, "max", "ring", channels, rings_of(ranks)))
    assert all(np.array_equal(o, r) for o, r in zip(out, C.reference_reduce_scatter(rs_bufs, "max")))
    shards = [b[:3] for b in bufs]
    out, _ = P.run_plan(P.plan_all_gather(shards, "ring", channels, rings_of(ranks)))
    assert all(np.array_equal(o, np.concatenate(shards)) for o in out)
    # bytes: each rank sends 2(n-1)/n of the buffer in all, whatever the channels
    sent = np.zeros(n)
    for m in steps:
        np.add.at(sent, m.src, m.nbytes)
    assert sent.sum() == 2 * (n - 1) * bufs[0].nbytes


def test_each_channel_talks_to_its_ring_neighbours_and_crosses_nodes_on_its_own_gpu():
    ranks = tuple(range(8))  # two nodes of 4
    rings = TOPO.rings(ranks, 4)
    assert len(rings) == 4  # one ring order per channel: 4 GPUs per node
    exits = set()
    for order, first, stop in rings:
        assert sorted(order) == list(ranks)
        nxt = {order[p]: order[(p + 1) % 8] for p in range(8)}
        exits |= {a for a, b in nxt.items() if a // 4 != b // 4}
        bufs = [np.ones(64) for _ in ranks]
        _, steps = P.run_plan(P.plan_all_reduce(bufs, "sum", "ring", 4, rings_of(ranks)))
        for m in steps:
            for s, d, ch in zip(m.src, m.dst, m.channels()):
                if first <= ch < stop:
                    assert nxt[s] == d
    assert exits == set(ranks)  # every GPU's NIC carries one channel's crossing


def test_one_node_has_one_ring_whatever_the_channels():
    assert len(Topology().rings(tuple(range(8)), 8)) == 1
    assert len(Topology().rings((0, 8, 16), 8)) == 1  # one GPU per node: one NIC, one ring


def test_spmd_channels_in_the_trace():
    x = np.arange(4096, dtype=np.float32)
    w = World(8, topology=TOPO)
    out = w.run(lambda comm: comm.all_reduce(x + comm.rank))
    assert np.allclose(out[5], 8 * x + 28)
    assert {r.channel for r in w.trace} == {0, 1, 2, 3}
    nic_senders = {r.src for r in w.trace if r.link == "nic"}
    assert nic_senders == set(range(8))
    assert sum(w.stats().bytes_sent) == 2 * 7 * x.nbytes
