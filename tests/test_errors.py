"""Misuse fails fast, from world.run, with a message that names the ranks."""

import numpy as np
import pytest

from emulator import (CollectiveMismatchError, ConfigError, DeadlockError, EmulatorError, GroupError, MeshError,
                      P2POp, PeerError, RankError, ShapeError, World)

pytestmark = pytest.mark.timeout(10)


def run_fails(world, prog, exc, within, *patterns):
    with within(1.0):
        with pytest.raises(exc) as info:
            world.run(prog)
    assert isinstance(info.value, EmulatorError)
    for p in patterns:
        assert p in str(info.value), f"{p!r} not in:\n{info.value}"
    return info.value


def test_different_collectives(within):
    def prog(comm):
        if comm.rank == 2:
            comm.all_gather(np.zeros(4))
        else:
            comm.all_reduce(np.zeros(4))

    run_fails(World(4), prog, CollectiveMismatchError, within, "ranks 0 and 2", "all_reduce(shape=(4,)",
              "all_gather(shape=(4,)")


def test_same_collective_different_shape_or_dtype(within):
    def shape(comm):
        comm.all_reduce(np.zeros(4 + (comm.rank == 1)))

    def dtype(comm):
        comm.all_reduce(np.zeros(4, np.float32 if comm.rank == 3 else np.float64))

    run_fails(World(4), shape, CollectiveMismatchError, within, "rank 1 called all_reduce(shape=(5,)")
    run_fails(World(4), dtype, CollectiveMismatchError, within, "dtype=float32", "dtype=float64")


def test_rank_returns_while_others_wait(within):
    def prog(comm):
        if comm.rank != 3:
            comm.all_reduce(np.zeros(2))

    e = run_fails(World(4), prog, DeadlockError, within, "missing: [3]", "returned already: [3]")
    assert "rank 0 waits in all_reduce" in str(e)


def test_recv_without_send(within):
    def prog(comm):
        if comm.rank == 0:
            comm.recv(1)

    run_fails(World(2), prog, DeadlockError, within, "rank 0 waits in recv(src=1)",
              "rank 1 has not posted the matching send and has returned")


def test_cyclic_recv_deadlock(within):
    def prog(comm):
        comm.recv((comm.rank + 1) % comm.size)

    run_fails(World(3), prog, DeadlockError, within, "rank 0 waits in recv(src=1)", "rank 2 waits in recv(src=0)",
              "returned already: none")


def test_exception_in_a_rank_stops_the_others(within):
    stopped = []

    def prog(comm):
        try:
            if comm.rank == 2:
                raise KeyError("boom")
            comm.all_reduce(np.zeros(1))
        finally:
            stopped.append(comm.rank)

    e = run_fails(World(4), prog, RankError, within, "rank 2 raised KeyError", "raise KeyError")
    assert e.rank == 2 and isinstance(e.original, KeyError)
    # ranks 0 and 1 were waiting: they were stopped (their finally ran); rank 3 never started
    assert sorted(stopped) == [0, 1, 2]


def test_uneven_reduce_scatter(within):
    run_fails(World(3), lambda c: c.reduce_scatter(np.zeros(4)), ShapeError, within,
              "rank 0: reduce_scatter", "shape (4,)", "multiple of 3")


@pytest.mark.parametrize("peer,what", [(0, "to itself"), (5, "out of range"), (-1, "out of range")])
def test_bad_peers(within, peer, what):
    def prog(comm):
        if comm.rank == 0:
            comm.send(np.zeros(1), peer)

    run_fails(World(2), prog, PeerError, within, "rank 0", what)


def test_group_the_rank_is_not_in(within):
    def prog(comm):
        g = comm.new_group([0, 1])
        g.all_reduce(np.zeros(1))

    run_fails(World(3), prog, GroupError, within, "rank 2 called all_reduce on group [0, 1]")


def test_unknown_axis(within):
    run_fails(World(mesh={"dp": 2}), lambda c: c.group("tp"), GroupError, within, "no mesh axis 'tp'")


def test_mesh_that_does_not_multiply():
    with pytest.raises(MeshError, match="2 x 2 = 4 ranks, but World was asked for 8"):
        World(8, mesh={"dp": 2, "tp": 2})
    with pytest.raises(MeshError):
        World(mesh={"dp": 0})


def test_avg_of_ints_and_unknown_op(within):
    run_fails(World(2), lambda c: c.all_reduce(np.zeros(2, int), op="avg"), ShapeError, within, "floating dtype")
    run_fails(World(2), lambda c: c.all_reduce(np.zeros(2), op="prod"), ConfigError, within, "unknown reduce op",
              "'sum', 'avg', 'max', 'min', 'product'")
    run_fails(World(2), lambda c: c.all_reduce(np.zeros(2), op="mean"), ConfigError, within, "torch calls the mean 'avg'")


def test_send_then_recv_ring_deadlocks_as_on_nccl(within):
    def ring(comm):
        right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        comm.send(np.ones(4), right)
        return comm.recv(left)

    e = run_fails(World(4), ring, DeadlockError, within, "rank 0 waits in send(dst=1) #0 on group world: rank 1 "
                  "has not posted the matching recv", "rank 3 waits in send(dst=0)", "batch_isend_irecv",
                  "even ranks send first")
    assert "returned already: none" in str(e)

    def even_odd(comm):  # the fix without batching: break the cycle
        right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        if comm.rank % 2 == 0:
            comm.send(np.full(4, comm.rank), right)
            return comm.recv(left)
        got = comm.recv(left)
        comm.send(np.full(4, comm.rank), right)
        return got

    assert [r[0] for r in World(4).run(even_odd)] == [3, 0, 1, 2]


def test_recv_buffer_that_does_not_match_the_send(within):
    def prog(comm):
        if comm.rank == 0:
            comm.send(np.ones(4, np.float32), 1)
        else:
            comm.recv(np.empty(4, np.float64), 0)

    run_fails(World(2), prog, CollectiveMismatchError, within, "rank 1 posted recv(src=0) #0 with a buffer of shape "
              "(4,) dtype float64", "rank 0 sends shape (4,) dtype float32")


def test_bad_p2p_ops(within):
    run_fails(World(2), lambda c: P2POp(np.add, np.ones(1), 1), ConfigError, within, "comm.isend or comm.irecv")
    run_fails(World(2), lambda c: c.batch_isend_irecv([]), ConfigError, within, "non-empty list of P2POp")

    def two_groups(comm):
        other = comm.new_group([0, 1])
        if comm.rank < 2:
            comm.batch_isend_irecv([P2POp(comm.isend, np.ones(1), 1 - comm.rank),
                                    P2POp(other.irecv, np.empty(1), 1 - comm.rank)])

    run_fails(World(4), two_groups, ConfigError, within, "must use one group")


def test_uneven_all_to_all_single_that_does_not_add_up(within):
    def prog(comm):  # rank 1 expects 2 rows from rank 0, which sends it 1
        x = np.arange(3.0)
        out = [2, 1] if comm.rank == 1 else None
        return comm.all_to_all_single(x, out, [2, 1])

    run_fails(World(2), prog, CollectiveMismatchError, within, "rank 1 expects 2 rows from rank 0",
              "input_split_sizes[1]")
    run_fails(World(2), lambda c: c.all_to_all_single(np.arange(3.0), None, [1, 1]), ShapeError, within,
              "add up to 2, but dim 0 of the input is 3")
    run_fails(World(2), lambda c: c.all_to_all_single(np.arange(3.0)), ShapeError, within, "does not divide")


def test_world_stays_usable_after_an_error():
    w = World(2)
    with pytest.raises(DeadlockError):
        w.run(lambda c: c.recv(1 - c.rank))
    assert [x.tolist() for x in w.run(lambda c: c.all_reduce(np.ones(2)))] == [[2, 2], [2, 2]]
