"""The lesson checks reject wrong answers, with a message saying what is wrong."""

import numpy as np
import pytest

from emulator.grading import CheckFailed
from emulator.grading import lesson00 as g


def naive_reduce_scatter(bufs, net):
    """Right answer, wrong algorithm: everyone sends everything to everyone."""
    n = len(bufs)
    if n > 1:
        net.exchange([(s, d, bufs[s]) for s in range(n) for d in range(n) if s != d])
    total = np.sum(bufs, axis=0)
    return np.split(total, n)


def test_reduce_scatter_check_counts_bytes():
    with pytest.raises(CheckFailed, match="rank 0 sent .* bytes"):
        g.check_ring_reduce_scatter(naive_reduce_scatter)


def test_reduce_scatter_check_catches_wrong_values():
    with pytest.raises(CheckFailed, match="differ from the reference"):
        g.check_ring_reduce_scatter(lambda bufs, net: np.split(bufs[0], len(bufs)))


def test_spmd_check_refuses_library_collectives_and_reports_deadlock():
    with pytest.raises(CheckFailed, match="send and comm.recv only|comm.send and comm.recv only"):
        g.check_spmd_ring_all_reduce(lambda comm, x: comm.all_reduce(x))

    def recv_first(comm, x):
        if comm.size > 1:
            comm.recv((comm.rank - 1) % comm.size)
        return x

    with pytest.raises(CheckFailed, match="deadlock"):
        g.check_spmd_ring_all_reduce(recv_first)


def test_napkin_checks():
    with pytest.raises(CheckFailed, match="not 'NVLink'"):
        g.napkin_gradient_all_reduce(0.59, "NVLink")
    with pytest.raises(CheckFailed, match="off by more than"):
        g.napkin_bus_bandwidth(211.4)  # algbw, not busbw
    g.napkin_crossover(5.92e6)
