"""World(..., wall_timeout=s): a run that goes on past s seconds of wall-clock time is
stopped, a rank stuck in a loop in pure Python included, from the main thread and from
another, with an error naming every rank still running and what it last did; a run that
ends in time is not touched, then or later; without it, no thread runs."""

import threading
import time

import numpy as np
import pytest

from emulator import ConfigError, World, WallTimeoutError

pytestmark = pytest.mark.timeout(60)


def spins_on_rank(k):
    def prog(comm):
        comm.all_reduce(np.zeros(4))
        if comm.rank == k:
            while True:  # never calls the emulator again: the other ranks cannot run
                pass
        comm.all_reduce(np.zeros(4))
        return comm.rank

    return prog


def stopped(world, prog):
    t0 = time.perf_counter()
    with pytest.raises(WallTimeoutError) as info:
        world.run(prog)
    return info.value, time.perf_counter() - t0


def test_a_rank_in_a_pure_python_loop_is_stopped_and_named():
    err, took = stopped(World(4, wall_timeout=1), spins_on_rank(2))
    assert 1.0 <= took < 4.0
    assert err.running == 2 and err.ranks == [0, 1, 2, 3]
    text = str(err)
    assert "wall_timeout=1" in text and "ranks [0, 1, 2, 3] were still running" in text
    assert "rank 2 was running and never gave the thread back at prog" in text and "while True" in text
    assert "rank 0 waits in all_reduce" in text  # the ranks it held up: in their second all_reduce
    assert "missing: [2]" in err.last[3]
    assert "its last call (of 1): all_reduce(world, 32 B)" in err.last[2]
    assert "its last call (of 2): all_reduce(world, 32 B)" in err.last[0]


def test_ranks_that_never_got_the_thread_are_named_too():
    def prog(comm):
        while comm.rank == 0:
            pass

    err, _ = stopped(World(3, wall_timeout=0.5), prog)
    assert err.running == 0 and err.ranks == [0, 1, 2]
    assert err.last[1] == "was ready to run, waiting for its turn; it had made no communication call"


def test_the_world_runs_again_after_it_was_stopped():
    world = World(2, wall_timeout=1)
    stopped(world, spins_on_rank(1))
    assert world.run(lambda comm: float(comm.all_reduce(np.ones(2))[0])) == [2.0, 2.0]


def test_it_works_when_run_is_called_from_another_thread():
    out = {}

    def worker():
        try:
            World(3, wall_timeout=1).run(spins_on_rank(0))
        except WallTimeoutError as exc:
            out["err"] = exc

    t0 = time.perf_counter()
    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(20)
    assert not thread.is_alive() and time.perf_counter() - t0 < 5
    assert out["err"].running == 0 and "rank 0 was running" in str(out["err"])


def test_a_loop_that_swallows_every_exception_is_still_stopped():
    def prog(comm):
        tries = 0
        while True:
            try:
                while True:
                    pass
            except BaseException:  # noqa: BLE001 -- a careless program: the next request still stops it
                tries += 1
                if tries > 1:
                    raise

    err, took = stopped(World(2, wall_timeout=0.5), prog)
    assert took < 4.0 and err.running == 0


def test_a_run_that_ends_in_time_returns_and_is_not_interrupted_later():
    world = World(2, wall_timeout=0.3)
    for _ in range(3):
        assert world.run(lambda comm: comm.rank) == [0, 1]
    deadline = time.perf_counter() + 1.0
    while time.perf_counter() < deadline:  # a request left behind would be raised in this loop
        pass
    assert threading.active_count() == 1 or all(t.name != "World wall_timeout" for t in threading.enumerate())


def test_without_a_wall_timeout_no_thread_is_started():
    seen = []

    def prog(comm):
        seen.append(sorted(t.name for t in threading.enumerate()))
        return comm.rank

    World(2).run(prog)
    assert all("World wall_timeout" not in names for names in seen)
    World(2, wall_timeout=5).run(prog)
    assert "World wall_timeout" in seen[-1]  # the check above can see the thread


@pytest.mark.parametrize("bad", [0, -1, float("inf"), float("nan"), "1", True])
def test_bad_wall_timeouts_are_refused(bad):
    with pytest.raises(ConfigError, match="wall_timeout is a bound on a run's wall-clock time in seconds"):
        World(2, wall_timeout=bad)


def test_a_world_run_inside_a_rank_is_stopped_by_the_outer_bound():
    def inner(comm):
        while True:
            pass

    def outer(comm):
        if comm.rank == 1:
            World(2).run(inner)  # no bound of its own: the outer World's stops it
        return comm.rank

    err, took = stopped(World(2, wall_timeout=0.5), outer)
    assert took < 4.0 and err.running == 1 and "at inner" in err.last[1]
