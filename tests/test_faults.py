"""Fault injection: a rank that dies at a simulated time, the watchdog that ends every other
rank's run with a RankFailedError, stragglers."""

import math

import numpy as np
import pytest

from emulator import (ConfigError, DeadlockError, EmulatorError, P2POp, RankFailedError, RankFailure, Straggler,
                      World)
from emulator.engine.faults import DEFAULT_WATCHDOG_TIMEOUT


def steps(comm, n=5, seconds=1e-3):
    """n steps of compute then an all-reduce over dp and one over tp."""
    for step in range(n):
        comm.compute(seconds=seconds, name=f"step {step}")
        comm.group("dp").all_reduce(np.ones(1000))
        comm.group("tp").all_reduce(np.ones(10))
    return comm.rank


def run_failing(world, prog=steps):
    with pytest.raises(RankFailedError) as info:
        world.run(prog)
    return info.value


def test_the_contract():
    world = World(mesh={"dp": 4, "tp": 2}, faults=[RankFailure(rank=3, at=2e-3)], watchdog_timeout=600.0)
    err = run_failing(world)
    assert isinstance(err, EmulatorError) and err.checkpoints == []  # a World saves nothing
    assert err.rank == 3 and err.at == 2e-3 and err.dead == {3: 2e-3}
    assert sorted(err.timeouts) == [0, 1, 2, 4, 5, 6, 7]  # every other rank
    msg = str(err)
    assert msg.startswith("rank 3 failed at 2.000 ms")
    for r, t in err.timeouts.items():
        assert t.time == pytest.approx(t.issued + 600.0)
        assert t.issued < 2e-3 + 1e-4  # issued around the failure, on its clock
        assert world.clock.compute[r] == pytest.approx(t.time)  # the rank's clock ends at watchdog time
        assert f"rank {r}: {t.op} #{t.seq} on group {t.group}" in msg
        assert t.op == "all_reduce" and t.group in ("dp", "tp")
    # the dead rank's dp group waits on it directly; the others wait on ranks stuck themselves
    direct = [r for r, t in err.timeouts.items() if 3 in t.missing]
    assert sorted(direct) == [1, 2, 5, 7]
    assert "rank 3 (dead)" in msg and "(stuck itself)" in msg
    assert world.clock.compute[3] == 2e-3


def test_timeline_shows_the_wait_and_the_failure():
    world = World(mesh={"dp": 2, "tp": 2}, faults=[RankFailure(rank=1, at=1.5e-3)], watchdog_timeout=30.0)
    err = run_failing(world)
    tl = world.timeline()
    assert tl.makespan == pytest.approx(max(t.time for t in err.timeouts.values()))
    for r, t in err.timeouts.items():
        waits = [e for e in tl.of(r, "compute", "idle") if e.name.endswith("(watchdog)")]
        assert len(waits) == 1 and waits[0].end == pytest.approx(t.time)
        assert waits[0].duration == pytest.approx(30.0, abs=1e-3)
    assert [e.name for e in tl.of(1, "compute", "idle")][-1] == "failed"
    assert 1.4e-3 < tl.total("compute", 1) < 1.5e-3  # its compute stopped when it died
    assert err.world is world


@pytest.mark.parametrize("timeout", [1.0, 60.0, DEFAULT_WATCHDOG_TIMEOUT])
def test_watchdog_time_follows_the_timeout(timeout):
    world = World(mesh={"dp": 2, "tp": 1}, faults=[RankFailure(1, 0.5e-3)], watchdog_timeout=timeout)
    err = run_failing(world)
    (t,) = err.timeouts.values()
    assert t.rank == 0 and t.time == pytest.approx(1e-3 + timeout, rel=1e-6)


def test_a_failure_after_the_end_changes_nothing():
    clean = World(mesh={"dp": 2, "tp": 2})
    want = clean.run(steps)
    late = World(mesh={"dp": 2, "tp": 2}, faults=[RankFailure(2, at=10.0)])
    assert late.run(steps) == want
    assert late.clock.final() == clean.clock.final()


def test_failure_at_zero_and_a_rank_that_dies_with_nothing_left_to_share():
    err = run_failing(World(mesh={"dp": 2, "tp": 2}, faults=[RankFailure(0, at=0.0)]))
    assert err.dead == {0: 0.0} and sorted(err.timeouts) == [1, 2, 3]

    def compute_last(comm):
        comm.group("dp").all_reduce(np.ones(4))
        comm.compute(seconds=1.0, name="tail")  # no communication after this
        return comm.rank

    world = World(mesh={"dp": 4, "tp": 1}, faults=[RankFailure(2, at=0.5)])
    err = run_failing(world, compute_last)
    assert err.dead == {2: 0.5} and err.timeouts == {}  # the others had finished
    assert "No other rank was waiting" in str(err)


def test_a_collective_a_member_dies_in_never_completes():
    """The member dies after it joined, while the all-reduce runs: nobody gets a result."""
    got = {}

    def prog(comm):
        comm.compute(seconds=1e-3 * (comm.rank + 1))
        got[comm.rank] = comm.all_reduce(np.ones(50_000_000 // 8))  # 50 MB: takes a while on one node
        return comm.rank

    ok = World(4)
    ok.run(prog)
    end = ok.clock.final()[0]
    assert end > 4e-3 + 1e-5
    got.clear()
    world = World(4, faults=[RankFailure(0, at=(4e-3 + end) / 2)])  # after the last arrival, before the end
    err = run_failing(world, prog)
    assert got == {} and err.dead == {0: (4e-3 + end) / 2}
    assert sorted(err.timeouts) == [1, 2, 3]
    assert all(t.missing == (0,) for t in err.timeouts.values())
    assert err.timeouts[1].issued == pytest.approx(2e-3)  # each from its own issue time
    assert err.timeouts[3].time == pytest.approx(4e-3 + DEFAULT_WATCHDOG_TIMEOUT)


def test_point_to_point_peer_dies():
    def pipeline(comm):
        for i in range(3):
            comm.compute(seconds=1e-3)
            if comm.rank == 0:
                comm.send(np.ones(8), 1)
            else:
                comm.recv(np.empty(8), 0)
        return comm.rank

    err = run_failing(World(2, faults=[RankFailure(0, at=2.5e-3)]), pipeline)
    t = err.timeouts[1]
    assert (t.op, t.seq, t.missing) == ("recv", 2, (0,))
    assert t.issued == pytest.approx(3e-3, abs=1e-5)  # rank 1 posts its third recv after its own third compute
    assert t.time == t.issued + DEFAULT_WATCHDOG_TIMEOUT


def test_oldest_pending_operation_times_out_first():
    def prog(comm):
        h = comm.all_reduce(np.ones(4), async_op=True)  # issued at 0
        comm.compute(seconds=5.0)
        y = comm.group("tp").all_reduce(np.ones(4))  # issued at 5 s
        return h.wait() + y

    err = run_failing(World(mesh={"dp": 1, "tp": 2}, faults=[RankFailure(1, at=0.0)]), prog)
    t = err.timeouts[0]
    assert t.issued == 0.0 and t.seq == 0 and t.group == "world"
    assert t.time == pytest.approx(DEFAULT_WATCHDOG_TIMEOUT)


def test_two_failures_and_the_message_lists_them():
    err = run_failing(World(mesh={"dp": 4, "tp": 4}, faults=[RankFailure(5, 1.5e-3), RankFailure(9, 2.5e-3)]))
    assert err.rank == 5 and set(err.dead) == {5, 9}
    assert "rank 5 failed" in str(err) and "[9]" in str(err)
    assert "more ranks" in str(err)  # 14 survivors: the message shows some and says so
    assert len(err.timeouts) == 14


def test_a_rank_with_a_late_failure_waiting_on_a_dead_one_times_out():
    # rank 1's own failure would come after its watchdog: it is a survivor that times out
    err = run_failing(World(mesh={"dp": 2, "tp": 1}, faults=[RankFailure(0, 1e-4), RankFailure(1, 1e6)]))
    assert err.dead == {0: 1e-4} and list(err.timeouts) == [1]


def test_deadlock_without_a_failure_is_still_a_deadlock():
    def bad(comm):
        if comm.rank == 0:
            comm.all_reduce(np.ones(2))
        return 0

    with pytest.raises(DeadlockError):
        World(2, faults=[Straggler(1, 2.0)]).run(bad)
    # a failure still to come when the program deadlocks: the deadlock is the bug
    with pytest.raises(DeadlockError):
        World(2, faults=[RankFailure(1, at=1e6)]).run(bad)


def test_straggler_computes_slower_and_the_others_wait():
    fast = World(mesh={"dp": 4, "tp": 1})
    fast.run(steps)
    slow = World(mesh={"dp": 4, "tp": 1}, faults=[Straggler(rank=2, slowdown=1.5)])
    slow.run(steps)
    tl = slow.timeline()
    assert tl.total("compute", 2) == pytest.approx(1.5 * fast.timeline().total("compute", 2))
    assert tl.total("compute", 0) == pytest.approx(fast.timeline().total("compute", 0))
    assert tl.total("idle", 0) > 5 * 0.5e-3 * 0.99 and tl.total("idle", 2) < 1e-4  # everyone waits for rank 2
    twice = World(mesh={"dp": 4, "tp": 1}, faults=[Straggler(2, 1.5), Straggler(2, 2.0)])
    twice.run(steps)
    assert twice.timeline().total("compute", 2) == pytest.approx(3.0 * fast.timeline().total("compute", 2))


@pytest.mark.parametrize("bad, match", [
    (dict(faults=[RankFailure(8, 1.0)]), "ranks 0..7"),
    (dict(faults=[RankFailure(1, 1.0), RankFailure(1, 2.0)]), "two RankFailures"),
    (dict(faults=["rank 3"]), "RankFailure"),
    (dict(watchdog_timeout=0), "positive"),
    (dict(watchdog_timeout=math.inf), "positive"),
    (dict(faults=[RankFailure(1, 1.0)], fold=("dp",)), "fold"),
])
def test_bad_faults_are_refused(bad, match):
    with pytest.raises(ConfigError, match=match):
        World(mesh={"dp": 4, "tp": 2}, **bad)


@pytest.mark.parametrize("make, match", [
    (lambda: RankFailure(-1, 1.0), "rank"), (lambda: RankFailure(1, -1.0), "at="),
    (lambda: RankFailure(1, math.nan), "at="), (lambda: Straggler(1, 0.5), ">= 1"), (lambda: Straggler(True), "rank"),
])
def test_bad_fault_descriptions(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_runs_are_deterministic_and_the_world_reusable():
    world = World(mesh={"dp": 2, "tp": 2}, faults=[RankFailure(3, 1.2e-3)])
    a, b = run_failing(world), run_failing(world)
    assert {r: t.time for r, t in a.timeouts.items()} == {r: t.time for r, t in b.timeouts.items()}
    assert str(a) == str(b)


def test_dead_rank_finally_blocks_run_and_exceptions_cannot_swallow_death():
    cleaned = []

    def prog(comm):
        try:
            try:
                comm.compute(seconds=1.0)
            except Exception:  # noqa: BLE001 -- a student's broad except must not keep a dead rank alive
                cleaned.append("swallowed")
            comm.all_reduce(np.ones(2))
        finally:
            cleaned.append(comm.rank)
        return comm.rank

    run_failing(World(2, faults=[RankFailure(1, 0.5)]), prog)
    assert "swallowed" not in cleaned and 1 in cleaned


def test_batch_isend_irecv_ring_with_a_dead_member():
    def ring(comm):
        right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
        for _ in range(3):
            comm.compute(seconds=1e-3)
            hs = comm.batch_isend_irecv([P2POp(comm.isend, np.ones(4), right),
                                         P2POp(comm.irecv, np.empty(4), left)])
            for h in hs:
                h.wait()
        return comm.rank

    err = run_failing(World(4, faults=[RankFailure(2, 1.5e-3)]), ring)
    assert set(err.timeouts) == {0, 1, 3}
    assert err.timeouts[3].op == "recv" and err.timeouts[3].missing == (2,)
    assert err.timeouts[1].op == "send" and err.timeouts[1].missing == (2,)
