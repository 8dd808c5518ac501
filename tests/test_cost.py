"""The closed-form cost model agrees with the emulator's clock, for any group; nccl-tests'
bandwidths; the calibration table in emulator/machine/topology.py."""

import re

import numpy as np
import pytest

from emulator import ConfigError, Topology, World
from emulator.machine import topology
from emulator.cost import busbw, calibration_table, collective_time, crossover_bytes

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
        collective_time("all_to_all", 10, 4, topo)


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
