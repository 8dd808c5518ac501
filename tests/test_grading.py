"""The lesson checks reject wrong answers (every way found to game them), with a message
saying what is wrong, and accept other correct answers."""

import numpy as np
import pytest

from emulator import collectives as C
from emulator.grading import CheckFailed
from emulator.grading import lesson00 as g


def naive_reduce_scatter(bufs, net):
    """Right answer, wrong algorithm: everyone sends everything to everyone."""
    n = len(bufs)
    if n > 1:
        net.exchange([(s, d, bufs[s]) for s in range(n) for d in range(n) if s != d])
    total = np.sum(bufs, axis=0)
    return np.split(total, n)


def global_sum_with_fake_exchanges(bufs, net):
    """Sums in the global view, then makes n-1 ring-shaped exchanges of the right size."""
    n = len(bufs)
    for _ in range(n - 1):
        net.exchange([(r, (r + 1) % n, np.zeros(len(bufs[0]) // n)) for r in range(n)])
    return np.split(np.sum(bufs, axis=0), n)


def direct_all_gather(shards, net):
    """n-1 steps of the right size, but rank r sends its own shard to r+s: not a ring."""
    n = len(shards)
    have = [[None] * n for _ in range(n)]
    for r in range(n):
        have[r][r] = shards[r]
    for s in range(1, n):
        for (src, dst), data in zip([(r, (r + s) % n) for r in range(n)],
                                    net.exchange([(r, (r + s) % n, shards[r]) for r in range(n)])):
            have[dst][src] = data
    return [np.concatenate(row) for row in have]


def another_correct_reduce_scatter(bufs, net):
    """A correct ring written differently: one array per rank, chunks indexed on the fly."""
    n = len(bufs)
    acc = [b.copy() for b in bufs]
    q = len(bufs[0]) // n
    for s in range(n - 1):
        sends = [(r, (r + 1) % n, acc[r][((r - s - 1) % n) * q:((r - s) % n or n) * q]) for r in range(n)]
        for (src, dst, _), data in zip(sends, net.exchange(sends)):
            c = (src - s - 1) % n
            acc[dst][c * q:(c + 1) * q] += data
    return [acc[r][r * q:(r + 1) * q] for r in range(n)]


def test_reduce_scatter_check_counts_bytes():
    with pytest.raises(CheckFailed, match="rank 0 sent to rank 2|rank 0 sent .* bytes|steps"):
        g.check_ring_reduce_scatter(naive_reduce_scatter)


def test_reduce_scatter_check_catches_wrong_values():
    with pytest.raises(CheckFailed, match="differ from the reference"):
        g.check_ring_reduce_scatter(lambda bufs, net: np.split(bufs[0], len(bufs)))


def test_results_must_come_from_the_messages():
    with pytest.raises(CheckFailed, match="changed in flight and your result did not change"):
        g.check_ring_reduce_scatter(global_sum_with_fake_exchanges)


def test_a_ring_talks_to_its_neighbour_only():
    with pytest.raises(CheckFailed, match="a ring only talks to its right neighbour"):
        g.check_ring_all_gather(direct_all_gather)


def test_the_library_refuses_while_its_exercise_is_checked():
    with pytest.raises(CheckFailed, match="Exercise 0.1: your code called the library's own solution"):
        g.check_ring_reduce_scatter(lambda bufs, net: C.ring_reduce_scatter(bufs))
    assert C.ring_reduce_scatter([np.ones(2)] * 2)[0].tolist() == [2.0]  # and works again afterwards


def test_another_correct_answer_passes(capsys):
    g.check_ring_reduce_scatter(another_correct_reduce_scatter)
    assert "PASSED Exercise 0.1" in capsys.readouterr().out


def test_spmd_check_refuses_library_collectives_and_reports_deadlock():
    with pytest.raises(CheckFailed, match="point-to-point calls only"):
        g.check_spmd_ring_all_reduce(lambda comm, x: comm.all_reduce(x))

    def send_then_recv(comm, x):
        if comm.size > 1:
            comm.send(x, (comm.rank + 1) % comm.size)
            comm.recv((comm.rank - 1) % comm.size)
        return x

    with pytest.raises(CheckFailed, match="deadlock"):
        g.check_spmd_ring_all_reduce(send_then_recv)
    from emulator.p2p_ring import ring_all_reduce_p2p

    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_spmd_ring_all_reduce(ring_all_reduce_p2p)


def test_spmd_ring_with_non_neighbour_peers_fails():
    def direct(comm, x):  # reduce-scatter and all-gather by sending straight to the owner
        n, r = comm.size, comm.rank
        chunks = np.split(x, n)
        for s in range(1, n):
            dst, src = (r + s) % n, (r - s) % n
            buf = np.empty_like(chunks[0])
            comm.send(chunks[dst], dst) if r < dst else None
            got = comm.recv(buf, src) if True else None  # noqa: F841 -- deadlocks or not, it is wrong
        return x

    with pytest.raises(CheckFailed):
        g.check_spmd_ring_all_reduce(direct)


def test_spmd_ring_in_even_odd_order_passes(capsys):
    def even_odd(comm, x):
        n, r = comm.size, comm.rank
        chunks = np.split(x, n)
        right, left = (r + 1) % n, (r - 1) % n

        def exchange(chunk):
            if r % 2 == 0:
                comm.send(chunk, right)
                return comm.recv(left)
            got = comm.recv(left)
            comm.send(chunk, right)
            return got

        if n == 1:
            return x
        for s in range(n - 1):
            c = (r - s - 2) % n
            chunks[c] = chunks[c] + exchange(chunks[(r - s - 1) % n])
        for s in range(n - 1):
            chunks[(r - s - 1) % n] = exchange(chunks[(r - s) % n])
        return np.concatenate(chunks)

    g.check_spmd_ring_all_reduce(even_odd)  # odd n too: an odd rank receives first and breaks the cycle
    assert "PASSED Exercise 0.4" in capsys.readouterr().out


def test_napkins_with_hard_coded_numbers_fail():
    with pytest.raises(CheckFailed, match="n=16"):
        g.napkin_bus_bandwidth(lambda n=8, nbytes=1e9, seconds=4.73e-3: 370.0)
    with pytest.raises(CheckFailed, match="off by more than"):
        g.napkin_bus_bandwidth(lambda n=8, nbytes=1e9, seconds=4.73e-3: nbytes / seconds / 1e9)  # algbw
    with pytest.raises(CheckFailed, match="not 'NVLink'"):
        g.napkin_gradient_all_reduce(lambda n_params=7.5e9, n_gpus=64, gpus_per_node=8: (0.6, 0.08, "NVLink"))
    with pytest.raises(CheckFailed, match="n=4"):
        g.napkin_crossover(lambda n=8, alpha=2e-6, beta=370e9: 5.92e6)
    from emulator.cost import crossover_bytes
    from emulator.topology import Link

    with pytest.raises(CheckFailed, match="library's own solution"):
        g.napkin_crossover(lambda n=8, alpha=2e-6, beta=370e9: crossover_bytes(n, Link("l", alpha, beta)))
    g.napkin_crossover(lambda n=8, alpha=2e-6, beta=370e9: n * alpha * beta)


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
