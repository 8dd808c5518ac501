"""The closed-form cost model agrees with the emulator's clock, for any group; nccl-tests'
bandwidths; the calibration table in emulator/machine/topology.py."""

import re

import numpy as np
import pytest

from emulator import ConfigError, Topology, World
from emulator.machine import topology
from emulator.cost import (PUBLISHED_ALL_TO_ALL, all_to_all_ports, all_to_all_time, busbw, calibration_table,
                           collective_time, crossover_bytes)
from emulator.machine.topology import Link

GROUPS = [(0, 1), (0, 8), (0, 1, 2, 3), tuple(range(8)), tuple(range(16)), (0, 8, 16, 24), (1, 3, 9, 11),
          tuple(range(0, 32, 2)), (5, 13, 21, 29), (3, 2, 1, 0), (0, 1, 2, 8, 9, 10), tuple(range(32)),
          (0, 4, 8, 12, 16, 20, 24, 28), (7, 15, 23)]


def engine_time(ranks, op, elems, topo, channels=None, algorithm="ring"):
    w = World(32, topology=topo)

    def prog(comm):
        g = comm.new_group(ranks)
        if comm.global_rank in ranks:
            n = len(ranks)
            x = np.ones(elems if op != "all_gather" else elems // n, np.float32)
            kwargs = {} if op == "broadcast" else {"algorithm": algorithm}
            if channels is not None:
                kwargs["channels"] = channels
            getattr(g, op)(x, **kwargs)

    w.run(prog)
    return max(w.stats().time)


@pytest.mark.parametrize("ranks", GROUPS, ids=lambda g: "-".join(map(str, g)))
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
@pytest.mark.parametrize("per_rank", [24, 1000, 1 << 18])
def test_ring_formula_agrees_with_the_engine_for_any_group(ranks, op, per_rank):
    n = len(ranks)
    elems = per_rank * n
    topo = Topology.h100()
    got = engine_time(ranks, op, elems, topo)
    assert got == pytest.approx(collective_time(op, elems * 4, list(ranks), topo), rel=0.05)


@pytest.mark.parametrize("ranks", [(0, 8), tuple(range(16)), (0, 1, 2, 3, 8, 9, 10, 11)])
@pytest.mark.parametrize("channels", [1, 2, 8])
def test_channels_are_an_argument_too(ranks, channels):
    topo = Topology(gpus_per_node=8)
    elems = 4096 * len(ranks)
    got = engine_time(ranks, "all_reduce", elems, topo, channels=channels)
    assert got == pytest.approx(collective_time("all_reduce", elems * 4, ranks, topo, channels=channels), rel=1e-6)


@pytest.mark.parametrize("ranks", [tuple(range(8)), tuple(range(16)), (0, 8), (0, 9, 18)])
def test_tree_formula(ranks):
    topo = Topology()
    got = engine_time(ranks, "all_reduce", 1000 * len(ranks), topo, algorithm="tree")
    assert got == pytest.approx(collective_time("all_reduce", 4000 * len(ranks), ranks, topo, "tree"), rel=1e-9)


def test_an_int_means_ranks_0_to_n_minus_1():
    topo = Topology()
    assert collective_time("all_reduce", 1e6, 16, topo) == collective_time("all_reduce", 1e6, range(16), topo)
    # a strided group pays its single NIC; ranks 0..1 only NVLink: the old closed form could not tell
    assert collective_time("all_reduce", 1e6, [0, 8], topo) > 4 * collective_time("all_reduce", 1e6, 2, topo)


def test_bus_bandwidth_and_crossover():
    assert busbw("all_reduce", 1e9, 8, 4.73e-3) / 1e9 == pytest.approx(370, rel=1e-3)
    assert busbw("all_gather", 1e9, 4, 1.0) == pytest.approx(0.75e9)
    topo = Topology()
    s = crossover_bytes(8, topo.nvlink)
    lat = 14 * topo.nvlink.alpha
    assert collective_time("all_reduce", s, 8, topo) == pytest.approx(2 * lat)
    with pytest.raises(ConfigError, match="at least one rank"):
        collective_time("all_reduce", 10, 0, topo)
    with pytest.raises(ConfigError, match="no closed form"):
        collective_time("broadcast", 10, 4, topo)  # the ring has no broadcast here


@pytest.mark.parametrize("nodes", [1, 2, 4])
def test_calibration_table_is_the_model_and_within_25_percent(nodes):
    """The model column of the table in emulator/machine/topology.py is what the model computes,
    and it lies within 25% of the published nccl-tests figures for rings."""
    topo = Topology.h100()
    n = 8 * nodes
    model = busbw("all_reduce", 2**30, n, collective_time("all_reduce", 2**30, n, topo)) / 1e9
    (lo, hi), = [p for k, p, what, _ in topology.PUBLISHED_ALL_REDUCE_BUSBW if k == nodes and "SHARP" not in what]
    assert 0.75 * lo <= model <= 1.25 * hi
    row = [r for r in calibration_table() if r["nodes"] == nodes and r["model GB/s"] != "(ring only)"][0]
    assert row["model GB/s"] == f"{model:.0f}"
    label = {1: "1 node x 8, ring", 2: "2 nodes x 8, ring", 4: "4 nodes x 8 "}[nodes]
    row = [line for line in topology.__doc__.splitlines() if line.startswith(label)]
    assert row and re.search(rf"\b{round(model)} GB/s", row[0]), (row, model)
    # one channel is one NIC's worth, the figure a flat ring would give
    if nodes > 1:
        flat = busbw("all_reduce", 2**30, n, collective_time("all_reduce", 2**30, n, topo, channels=1)) / 1e9
        assert 40 < flat < 50


# ----------------------------------------------------------------- all-to-all
def engine_all_to_all(ranks, sizes, topo, world=32):
    """Run ``all_to_all_single`` with ``sizes[i][j]`` float32 rows from group rank i to j on a
    World; returns the operation's time (its slowest rank)."""
    w = World(world, topology=topo)
    n = len(ranks)

    def prog(comm):
        g = comm.new_group(ranks)
        if comm.global_rank in ranks:
            i = g.rank
            x = np.zeros((int(sizes[i].sum()), 1), np.float32)
            g.all_to_all_single(x, [int(sizes[j][i]) for j in range(n)], [int(s) for s in sizes[i]])
        return comm.now

    w.run(prog)
    return max(w.stats().time)


A2A_TOPOLOGIES = [Topology(), Topology(gpus_per_node=4), Topology(nics_per_node=2), Topology.h200()]


@pytest.mark.parametrize("ranks", GROUPS)
@pytest.mark.parametrize("topo", A2A_TOPOLOGIES, ids=["h100", "4-per-node", "2-nics", "h200"])
def test_all_to_all_formula_agrees_with_the_engine_for_any_group_and_sizes(ranks, topo):
    rng = np.random.default_rng(len(ranks) + 7 * topo.gpus_per_node)
    n = len(ranks)
    for rows in (np.full((n, n), 3), np.full((n, n), 70000), rng.integers(0, 20000, (n, n)),
                 rng.integers(0, 3, (n, n)) * rng.integers(0, 2, (n, n))):  # uneven, zeros included
        rows = rows.copy()
        np.fill_diagonal(rows, rng.integers(0, 50, n))  # what a rank keeps never crosses a link
        got = engine_all_to_all(ranks, rows, topo)
        want = all_to_all_time(rows * 4, ranks, topo)
        assert got == pytest.approx(want, rel=1e-9), (ranks, rows.sum())


@pytest.mark.parametrize("ranks", [tuple(range(8)), tuple(range(16)), (0, 8, 16, 24), (1, 2, 9, 10, 17)])
@pytest.mark.parametrize("nbytes", [0, 1024, 2**20, 2**27])
def test_collective_time_of_an_even_all_to_all_is_the_engine_comm_all_to_all(ranks, nbytes):
    topo = Topology()
    n = len(ranks)
    w = World(32, topology=topo)

    def prog(comm):
        g = comm.new_group(ranks)
        if comm.global_rank in ranks:
            g.all_to_all([np.zeros(nbytes // n // 4, np.float32) for _ in range(n)])

    w.run(prog)
    assert max(w.stats().time) == pytest.approx(collective_time("all_to_all", (nbytes // n // 4) * 4 * n, ranks,
                                                                topo), rel=1e-9)


def test_all_to_all_time_is_the_busiest_port_not_a_sum_of_steps():
    """16 GPUs on two nodes, 1 MiB to every peer: each NIC carries 8 MiB at once; the old
    lock-step schedule charged 15 cross-node messages one after another (402.7 us)."""
    topo = Topology()
    per_pair = 2**20
    t = collective_time("all_to_all", 16 * per_pair, 16, topo)
    assert t == pytest.approx(topo.nic.alpha + 8 * per_pair / topo.nic.beta)
    assert t * 1e6 == pytest.approx(179.8, abs=0.1)
    lock_step = 15 * topo.nic.time(per_pair)
    assert lock_step * 1e6 == pytest.approx(402.7, abs=0.1) and t < 0.45 * lock_step
    ports = all_to_all_ports(np.full((16, 16), per_pair), 16, topo)
    busiest = max(ports.values(), key=lambda p: p[1].time(p[0]))
    assert busiest[1] is topo.nic and busiest[0] == 8 * per_pair
    with pytest.raises(ConfigError, match="matrix"):
        all_to_all_time(np.ones((3, 3)), 4, topo)


@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_all_to_all_busbw_matches_the_published_figures(nodes):
    """Large all-to-alls on H100 nodes (one NDR NIC per GPU): the busiest NIC runs at what NCCL
    reaches on one NIC (46-49 GB/s), and busbw is about N/(N-1) NICs (nccl-tests#130)."""
    topo = Topology.h100()
    n, size = 8 * nodes, 2**30
    t = collective_time("all_to_all", size, n, topo)
    nic_bytes = 8 * (nodes - 1) * size / n
    (_, lo, hi, _), = [f for f in PUBLISHED_ALL_TO_ALL if f[0].startswith("one NDR")]
    assert lo <= nic_bytes / t / 1e9 <= hi
    bus = busbw("all_to_all", size, n, t) / 1e9
    assert bus == pytest.approx(nodes / (nodes - 1) * topo.nic.beta / 1e9, rel=0.07)
    assert bus > topo.nic.beta / 1e9  # NVLink carries the in-node share: more than one NIC's worth


@pytest.mark.parametrize("ep", [16, 32, 64])
def test_a_deepseek_sized_dispatch_runs_at_deepep_s_bottleneck_bandwidths(ep):
    """4096 tokens of 7168 values in FP8, top-8 spread evenly: the NIC bottleneck bandwidth
    (bytes through the busiest NIC over the time) within DeepEP's measured 43-58 GB/s; and in
    one node of H800s (NVLink about 160 GB/s) within 5% of its 153-158 GB/s."""
    rows = 4096 * 8 / ep * 7168  # bytes (FP8) from one GPU to each other GPU
    (_, lo, hi, _), = [f for f in PUBLISHED_ALL_TO_ALL if "RDMA" in f[0]]
    topo = Topology.h100()
    ports = all_to_all_ports(np.full((ep, ep), rows), ep, topo)
    nic = max((b for b, link in ports.values() if link is topo.nic))
    assert lo <= nic / all_to_all_time(np.full((ep, ep), rows), ep, topo) / 1e9 <= hi
    h800 = Topology(nvlink=Link("NVLink (H800)", alpha=2e-6, beta=160e9))
    (_, lo, hi, _), = [f for f in PUBLISHED_ALL_TO_ALL if "NVLink" in f[0]]
    sizes = np.full((8, 8), 4096 * 8 / 8 * 7168)
    nvl = max(b for b, _ in all_to_all_ports(sizes, 8, h800).values())
    assert 0.95 * lo <= nvl / all_to_all_time(sizes, 8, h800) / 1e9 <= 1.05 * hi
