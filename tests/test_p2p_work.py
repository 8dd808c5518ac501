"""``batch_isend_irecv`` as one NCCL group (emulator/engine/p2p_work.py): one handle for the
batch, the batches of a group one after the other on its stream, each done when all its
operations are, received data in the buffers given."""

import numpy as np
import pytest

from emulator import DeadlockError, P2POp, World

MS = 1e-3


def kernels(world, rank):
    return [(e.name, e.start, e.end) for e in world.timeline().of(rank, kind="comm")]


def test_one_handle_for_the_batch_whose_wait_returns_true_and_fills_the_buffers():
    def prog(comm):
        peer = 1 - comm.rank
        first, second = np.full(2, -1.0), np.full(2, -1.0)
        works = comm.batch_isend_irecv([P2POp(comm.isend, np.full(2, comm.rank + 1.0), peer),
                                        P2POp(comm.irecv, first, peer),
                                        P2POp(comm.isend, np.full(2, comm.rank + 10.0), peer),
                                        P2POp(comm.irecv, second, peer)])
        before = first.copy()  # posted, not waited for: the data is not there yet
        out = [len(works), works[0].wait(), before[0]]
        return out + [first[0], second[0]]

    assert World(2).run(prog) == [[1, True, -1.0, 2.0, 11.0], [1, True, -1.0, 1.0, 10.0]]


def test_waiting_for_a_later_batch_fills_the_buffers_of_the_earlier_ones():
    def prog(comm):
        peer = 1 - comm.rank
        bufs = [np.zeros(1), np.zeros(1)]
        works = [comm.batch_isend_irecv([P2POp(comm.isend, np.array([comm.rank * 10.0 + k]), peer),
                                         P2POp(comm.irecv, bufs[k], peer)])[0] for k in range(2)]
        works[1].wait()  # stream order: the first batch completed before the second started
        return [float(b[0]) for b in bufs]

    assert World(2).run(prog) == [[10.0, 11.0], [0.0, 1.0]]


def test_the_batches_of_a_group_run_one_after_the_other():
    """Rank 0's second batch (to rank 2, whose receive is posted at once) starts only when
    its first (to rank 1, which posts its receive after 1 ms) has completed."""
    def prog(comm):
        if comm.rank == 0:
            a = comm.batch_isend_irecv([P2POp(comm.isend, np.ones(4), 1)])
            b = comm.batch_isend_irecv([P2POp(comm.isend, np.ones(4), 2)])
            for w in a + b:
                w.wait()
        elif comm.rank == 1:
            comm.compute(seconds=MS)
            comm.recv(np.empty(4), 0)
        else:
            comm.batch_isend_irecv([P2POp(comm.irecv, np.empty(4), 0)])[0].wait()

    world = World(3)
    world.run(prog)
    (name_a, a0, a1), (name_b, b0, b1) = kernels(world, 0)
    assert (name_a, name_b) == ("send->1", "send->2")
    assert a0 == 0 and a1 > MS and b0 == a1 < b1
    assert world.timeline().of(2, kind="comm")[0].end == b1  # rank 2 waited for it


def test_a_batch_completes_when_its_last_operation_does():
    """Rank 0's send is received at once, its receive only after rank 2's 1 ms: the one
    handle waits for both."""
    def prog(comm):
        if comm.rank == 0:
            (w,) = comm.batch_isend_irecv([P2POp(comm.isend, np.ones(4), 1), P2POp(comm.irecv, np.empty(4), 2)])
            w.wait()
            return comm.now
        if comm.rank == 1:
            comm.recv(np.empty(4), 0)
            return comm.now
        comm.compute(seconds=MS)
        comm.send(np.ones(4), 0)

    world = World(3)
    done0, done1, _ = world.run(prog)
    assert done1 < MS < done0
    (name, start, end), = kernels(world, 0)  # one kernel for the group, from its launch to its last transfer
    assert name == "send->1 recv<-2" and start == 0 and end == done0


def test_separately_issued_ops_do_not_queue_behind_a_batch():
    """A lone isend runs on its pair's own communicator, not the group's stream."""
    def prog(comm):
        if comm.rank == 0:
            (held,) = comm.batch_isend_irecv([P2POp(comm.isend, np.ones(4), 1)])  # rank 1 receives late
            comm.isend(np.ones(4), 2).wait()
            t = comm.now
            held.wait()
            return t
        if comm.rank == 1:
            comm.compute(seconds=MS)
        comm.recv(np.empty(4), 0)

    assert World(3).run(prog)[0] < MS


def test_the_kth_send_meets_the_kth_receive_across_batches():
    def prog(comm):
        if comm.rank == 0:
            for x in (1.0, 2.0):
                comm.batch_isend_irecv([P2POp(comm.isend, np.array([x]), 1)])
            return None
        a, b = np.zeros(1), np.zeros(1)
        comm.batch_isend_irecv([P2POp(comm.irecv, a, 0), P2POp(comm.irecv, b, 0)])[0].wait()
        return float(a[0]), float(b[0])

    assert World(2).run(prog)[1] == (1.0, 2.0)


@pytest.mark.parametrize("order", ["sends first", "receives first"])
def test_sends_and_receives_in_crossing_batches_deadlock_and_say_why(order):
    """Each rank posts its send and its receive in two batches: each one's first batch
    waits for what the other posts only in its second."""
    def prog(comm):
        peer = 1 - comm.rank
        ops = [P2POp(comm.isend, np.ones(4), peer), P2POp(comm.irecv, np.empty(4), peer)]
        works = [comm.batch_isend_irecv([op]) for op in (ops if order == "sends first" else ops[::-1])]
        for w in works:
            w[0].wait()

    with pytest.raises(DeadlockError) as err:
        World(2).run(prog)
    text = str(err.value)
    for rank, peer in ((0, 1), (1, 0)):
        assert f"rank {rank} waits in batch_isend_irecv #0 on group world" in text
        assert f"rank {peer} posted the matching" in text and f"but that batch is queued behind rank {peer}'s " \
                                                              f"batch #0" in text
    assert "Pair the batches" in text


def test_a_collective_on_the_group_runs_after_its_batches():
    """One communicator, one stream: an all-reduce issued after a batch starts after it."""
    def prog(comm):
        peer = 1 - comm.rank
        if comm.rank == 1:
            comm.compute(seconds=MS)
        (w,) = comm.batch_isend_irecv([P2POp(comm.isend, np.ones(4), peer), P2POp(comm.irecv, np.empty(4), peer)])
        comm.all_reduce(np.ones(4), async_op=True).wait()
        w.wait()

    world = World(2)
    world.run(prog)
    (_, _, batch_end), (name, start, _) = kernels(world, 0)
    assert name == "all_reduce" and start >= batch_end > MS


def test_a_batch_runs_on_the_group_of_its_ops_whichever_comm_posts_it():
    """torch takes the group from the P2POps: peers are ranks of that group."""
    def prog(comm):
        pair = comm.new_group([0, 2]) if comm.rank in (0, 2) else None
        if pair is None:
            return None
        buf = np.zeros(1)
        (w,) = comm.batch_isend_irecv([P2POp(pair.isend, np.array([comm.rank + 1.0]), 1 - pair.rank),
                                       P2POp(pair.irecv, buf, 1 - pair.rank)])
        w.wait()
        return float(buf[0])

    world = World(3)
    assert world.run(prog) == [3.0, None, 1.0]
    assert {e.stream for e in world.timeline().events if e.kind == "comm"} == {"comm [0, 2]"}
