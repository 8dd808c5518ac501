"""Lesson 00's checks reject wrong answers (every way found to game them), with a message
saying what is wrong, and accept other correct answers (lesson 01's:
tests/test_grading_lesson01.py)."""

import numpy as np
import pytest

from emulator.algorithms import global_view as C
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
    from emulator.algorithms.p2p_ring import ring_all_reduce_p2p

    with pytest.raises(CheckFailed, match="library's own solution"):
        g.check_spmd_ring_all_reduce(ring_all_reduce_p2p)


def test_spmd_ring_with_non_neighbour_peers_fails():
    """Right sums, right counts and bytes, but chunks go straight to their owners: not a ring."""
    from emulator import P2POp

    def direct(comm, x):
        n, r = comm.size, comm.rank
        chunks = np.split(x, n)
        for s in range(1, n):  # reduce-scatter: send chunk r+s to its owner r+s, receive mine from r-s
            buf = np.empty_like(chunks[r])
            hs = comm.batch_isend_irecv([P2POp(comm.isend, chunks[(r + s) % n], (r + s) % n),
                                         P2POp(comm.irecv, buf, (r - s) % n)])
            for h in hs:
                h.wait()
            chunks[r] = chunks[r] + buf
        for s in range(1, n):  # all-gather: send my chunk to r+s, receive r-s's
            buf = np.empty_like(chunks[r])
            hs = comm.batch_isend_irecv([P2POp(comm.isend, chunks[r], (r + s) % n),
                                         P2POp(comm.irecv, buf, (r - s) % n)])
            for h in hs:
                h.wait()
            chunks[(r - s) % n] = buf
        return np.concatenate(chunks)

    with pytest.raises(CheckFailed, match="a ring only talks to its right neighbour"):
        g.check_spmd_ring_all_reduce(direct)


def per_op_ring(comm, x):
    """The ring with batch_isend_irecv read as one handle per operation (its receive's
    wait() taken for the data): on NCCL, as here, the batch has one handle."""
    from emulator import P2POp

    n, r = comm.size, comm.rank
    chunks = np.split(x, n)
    for s in range(n - 1):
        c = (r - s - 2) % n
        hs = comm.batch_isend_irecv([P2POp(comm.isend, chunks[(r - s - 1) % n], (r + 1) % n),
                                     P2POp(comm.irecv, np.empty_like(chunks[c]), (r - 1) % n)])
        chunks[c] = chunks[c] + hs[1].wait()
    for s in range(n - 1):
        hs = comm.batch_isend_irecv([P2POp(comm.isend, chunks[(r - s) % n], (r + 1) % n),
                                     P2POp(comm.irecv, np.empty_like(chunks[0]), (r - 1) % n)])
        chunks[(r - s - 1) % n] = hs[1].wait()
    return np.concatenate(chunks)


def test_spmd_ring_reading_one_handle_per_operation_fails_and_says_why():
    with pytest.raises(CheckFailed, match=r"n=2: the program failed(.|\n)*IndexError(.|\n)*returns a list holding "
                                          r"one handle for the whole batch"):
        g.check_spmd_ring_all_reduce(per_op_ring)


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
    with pytest.raises(CheckFailed, match=r"^Napkin 0\.2: expected 370 GB/s, got 211\.4 GB/s \(the check allows 2%\)"):
        g.napkin_bus_bandwidth(lambda n=8, nbytes=1e9, seconds=4.73e-3: nbytes / seconds / 1e9)  # algbw
    with pytest.raises(CheckFailed, match="not 'NVLink'"):
        g.napkin_gradient_all_reduce(lambda n_params=7.5e9, n_gpus=64, gpus_per_node=8: (0.6, 0.08, "NVLink"))
    with pytest.raises(CheckFailed, match="n=4"):
        g.napkin_crossover(lambda n=8, alpha=2e-6, beta=370e9: 5.92e6)
    from emulator.cost import crossover_bytes
    from emulator.machine.topology import Link

    with pytest.raises(CheckFailed, match="library's own solution"):
        g.napkin_crossover(lambda n=8, alpha=2e-6, beta=370e9: crossover_bytes(n, Link("l", alpha, beta)))
    g.napkin_crossover(lambda n=8, alpha=2e-6, beta=370e9: n * alpha * beta)
