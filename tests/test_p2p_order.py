"""Point-to-point operations issued separately run in issue order between two ranks, as
on one NCCL stream per pair (torch's two-rank communicator for a lone send or recv);
operations posted together in ``batch_isend_irecv`` progress together."""

import numpy as np
import pytest

from emulator import DeadlockError, P2POp, World


def exchange_separately(comm):
    """Each rank sends to the other, then receives from it: two isend/irecv, not grouped."""
    peer = 1 - comm.rank
    send = comm.isend(np.full(4, comm.rank, np.float32), peer)
    got = comm.irecv(np.empty(4, np.float32), peer).wait()
    send.wait()
    return got


def test_separate_sends_ahead_of_receives_between_two_ranks_deadlock_and_name_both():
    with pytest.raises(DeadlockError) as err:
        World(2).run(exchange_separately)
    text = str(err.value)
    for rank, peer in ((0, 1), (1, 0)):
        assert (f"rank {rank} waits in recv(src={peer}) #0 on group world: it was issued separately after its "
                f"own send(dst={peer}) #0, which has not completed") in text
    assert "batch_isend_irecv" in text


def test_the_same_exchange_posted_together_runs():
    def together(comm):
        peer = 1 - comm.rank
        buf = np.empty(4, np.float32)
        (work,) = comm.batch_isend_irecv([P2POp(comm.isend, np.full(4, comm.rank, np.float32), peer),
                                          P2POp(comm.irecv, buf, peer)])
        work.wait()
        return buf

    out = World(2).run(together)
    assert [float(o[0]) for o in out] == [1.0, 0.0]


def test_separate_ops_in_matching_orders_run_as_megatron_orders_them():
    """Megatron's unbatched path: even ranks send first, odd ranks receive first."""
    def by_parity(comm):
        peer = 1 - comm.rank
        x, buf = np.full(3, comm.rank + 1.0), np.empty(3)
        if comm.rank % 2 == 0:
            s, r = comm.isend(x, peer), comm.irecv(buf, peer)
        else:
            r, s = comm.irecv(buf, peer), comm.isend(x, peer)
        got = r.wait()
        s.wait()
        return got

    assert [float(o[0]) for o in World(2).run(by_parity)] == [2.0, 1.0]


@pytest.mark.parametrize("n", [3, 4, 5])
def test_a_ring_of_separate_ops_runs_when_each_pair_sees_one_direction(n):
    """Send right, receive left: every pair carries one message, so nothing queues."""
    def ring(comm):
        r = comm.rank
        s = comm.isend(np.array([r]), (r + 1) % n)
        got = comm.irecv(np.empty(1, int), (r - 1) % n).wait()
        s.wait()
        return int(got[0])

    assert World(n).run(ring) == [(r - 1) % n for r in range(n)]


def test_separate_ops_between_a_pair_run_one_after_the_other_and_a_batch_at_once():
    nbytes = 2 ** 22

    def separate(comm):
        peer = 1 - comm.rank
        x, buf = np.ones(nbytes // 8), np.empty(nbytes // 8)
        ops = [lambda: comm.isend(x, peer), lambda: comm.irecv(buf, peer)]
        handles = [op() for op in (ops if comm.rank == 0 else ops[::-1])]
        for h in handles:
            h.wait()

    def batched(comm):
        peer = 1 - comm.rank
        for h in comm.batch_isend_irecv([P2POp(comm.isend, np.ones(nbytes // 8), peer),
                                         P2POp(comm.irecv, np.empty(nbytes // 8), peer)]):
            h.wait()

    world = World(2)
    world.run(separate)
    spans = {e.stream: (e.start, e.end) for e in world.timeline().events if e.kind == "comm"}
    assert set(spans) == {"p2p 0->1", "p2p 1->0"}, spans
    (a0, a1), (b0, b1) = sorted(spans.values())
    assert b0 >= a1 > a0  # the second transfer starts when the first has ended
    world = World(2)
    world.run(batched)
    # one NCCL group: one kernel per rank on the group's stream, both directions inside it at once
    kernels = [(e.rank, e.stream, e.name, e.start, e.end) for e in world.timeline().events if e.kind == "comm"]
    assert kernels == [(0, "comm world", "send->1 recv<-1", 0.0, a1 - a0), (1, "comm world", "send->0 recv<-0", 0.0,
                                                                             a1 - a0)], kernels
    assert max(world.stats().time) == pytest.approx(a1 - a0)


def test_an_op_queued_behind_another_starts_once_it_completes():
    """Rank 0 sends twice to rank 1, separately; rank 1 receives the second only after the first."""
    def prog(comm):
        if comm.rank == 0:
            a, b = comm.isend(np.array([1.0]), 1), comm.isend(np.array([2.0]), 1)
            a.wait()
            b.wait()
            return None
        first = comm.irecv(np.empty(1), 0)
        second = comm.irecv(np.empty(1), 0)
        return float(second.wait()[0]), float(first.wait()[0])

    assert World(2).run(prog)[1] == (2.0, 1.0)
