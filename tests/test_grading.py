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
    with pytest.raises(CheckFailed, match="point-to-point calls only"):
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


def test_lesson01_checks_reject_wrong_answers():
    from emulator.grading import lesson01 as g1

    def per_tensor(comm, grads):  # right values, but one all-reduce per tensor
        return {k: comm.all_reduce(v) / comm.size for k, v in grads.items()}

    with pytest.raises(CheckFailed, match="one bucket"):
        g1.check_ddp_average_gradients(per_tensor)

    def replicated_state(comm, flat_params, flat_grads, opt, state):  # DDP-style: full state
        g = comm.all_reduce(flat_grads) / comm.size
        full_state = opt.init({"flat": flat_params})
        new, _ = opt.step({"flat": flat_params}, {"flat": g}, full_state)
        return new["flat"], full_state

    with pytest.raises(CheckFailed):
        g1.check_zero1_step(replicated_state)

    def never_frees(comm, layer, layout, shard, x):
        full = comm.all_gather(shard)
        comm.memory.hold("gathered", full, "buffers")
        return layer.forward(layout.unflatten(full), x)

    with pytest.raises(CheckFailed, match="still holds"):
        g1.check_zero3_layer_forward(never_frees)
    with pytest.raises(CheckFailed, match="stage 2"):
        g1.problem_8_1({0: 480, 1: 142.5, 2: 60, 3: 30}, [3])
