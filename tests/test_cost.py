"""The closed-form cost model agrees with the emulator's clock; nccl-tests' bandwidths."""

import numpy as np
import pytest

from emulator import Topology, World
from emulator.cost import busbw, collective_time, crossover_bytes


@pytest.mark.parametrize("n,per_node", [(2, 8), (4, 8), (8, 8), (8, 4), (16, 8)])
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
def test_formula_equals_simulated_clock(n, per_node, op):
    topo = Topology(gpus_per_node=per_node)
    elems = 1024 * n
    w = World(n, topology=topo)
    w.run(lambda comm: getattr(comm, op)(np.ones(elems if op != "all_gather" else elems // n, np.float32)))
    assert max(w.stats().time) == pytest.approx(collective_time(op, elems * 4, n, topo), rel=1e-9)


def test_tree_formula():
    topo = Topology()
    w = World(8, algorithm="tree")
    w.run(lambda comm: comm.all_reduce(np.ones(1000, np.float64)))
    assert max(w.stats().time) == pytest.approx(collective_time("all_reduce", 8000, 8, topo, "tree"))


def test_bus_bandwidth_and_crossover():
    assert busbw("all_reduce", 1e9, 8, 4.73e-3) / 1e9 == pytest.approx(370, rel=1e-3)
    assert busbw("all_gather", 1e9, 4, 1.0) == pytest.approx(0.75e9)
    topo = Topology()
    s = crossover_bytes(8, topo.intra)
    lat = 14 * topo.intra.alpha
    assert collective_time("all_reduce", s, 8, topo) == pytest.approx(2 * lat)
    with pytest.raises(ValueError, match="need n >= 1"):
        collective_time("all_reduce", 10, 0, topo)
