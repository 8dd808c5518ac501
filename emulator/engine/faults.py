"""Faults on the emulated machine: a rank that dies, a rank that is slow, and how the
others find out.

``World(mesh=..., faults=[RankFailure(rank=3, at=2e-3)], watchdog_timeout=600.0)``:

* :class:`RankFailure` -- rank 3 stops at 2 ms of its simulated clock: a compute or a
  wait that would carry it past that time ends there, a call it makes at that time or
  later never happens, and an operation it takes part in that would end after it never
  completes (for anyone). Its program is unwound (its ``finally`` blocks run).
* :class:`Straggler` -- every compute of one rank takes ``slowdown`` times as long (a GPU
  that throttles, a host that steals cycles): nothing fails, everyone waits for it.

**How the others find out.** Nothing tells the peers of a dead rank at once: their
collectives were issued and wait for a member that never comes. What ends the wait, on
a cluster that runs torch over NCCL, is ``ProcessGroupNCCL``'s watchdog, a thread per
process group that polls its unfinished work: once an operation has been pending for the
group's timeout (10 minutes by default, ``kProcessGroupNCCLDefaultTimeout`` in
``torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp``), ``WorkNCCL::checkTimeout`` logs
``[Rank r] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=..,
OpType=.., ...) ran for .. milliseconds before timing out.``, the watchdog logs
``failure detected by watchdog at work sequence id: ..``, signals every rank to dump its
flight recorder, and rethrows the error so that the process goes down
(``WorkNCCL::handleException``: ``To avoid data inconsistency, we are taking the entire
process down.``), as ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` 1 and 3 both do (3 is
``ProcessGroupNCCL``'s default, 1 what torchrun sets for its workers in
``torch/distributed/elastic/agent/server/local_elastic_agent.py``). The timeout
counts from when the operation was enqueued, and the oldest pending operation of a rank
times out first (the watchdog walks its work list in order). Its message names the rank
that waited, the operation and its sequence number, not the rank that died: finding
that one is what ``TORCH_NCCL_DESYNC_DEBUG`` (``retrieveDesyncReport``: "ranks [..] are
the lagging ranks that caused this timeout") and the flight recorder's dumps are for.
Across nodes NCCL's network transport may notice first (``ncclRemoteError``, "remote
process exited or there was a network error", ``src/init.cc``), which the watchdog also
polls for; a peer inside the node, or a process that hangs instead of exiting, leaves
only the timeout. The emulator models the timeout, and knows who died: its
:class:`~emulator.errors.RankFailedError` names both.

Every rank still running ends at its own watchdog time, ``issued + watchdog_timeout``
for its oldest unfinished operation; the timeline shows the wait. A rank that had
returned before is not touched; a job whose dead rank had nothing left to share with
anyone still fails (the launcher sees a process die).
"""

import math
from dataclasses import dataclass

import numpy as np

from ..errors import ConfigError, RankFailedError

DEFAULT_WATCHDOG_TIMEOUT = 600.0  # seconds: ProcessGroupNCCL's default, 10 minutes
SHOWN = 8  # survivors listed in a RankFailedError's message


class RankDied(BaseException):
    """Unwinds a dead rank's program (a BaseException, so that no ``except Exception``
    in the rank's code can swallow it)."""

    def __init__(self, rank, at):
        self.rank, self.at = rank, at
        super().__init__(f"rank {rank} died at {at:.6g} s")


def _rank_ok(rank):
    return not isinstance(rank, bool) and isinstance(rank, (int, np.integer)) and rank >= 0


@dataclass(frozen=True)
class RankFailure:
    """Rank ``rank`` stops at ``at`` seconds of its simulated clock."""

    rank: int
    at: float

    def __post_init__(self):
        if not _rank_ok(self.rank):
            raise ConfigError(f"RankFailure: rank must be a rank number (int >= 0), got {self.rank!r}")
        if not (isinstance(self.at, (int, float, np.floating)) and math.isfinite(self.at) and self.at >= 0):
            raise ConfigError(f"RankFailure(rank={self.rank}): at= is the simulated time of the failure in seconds "
                              f"(a finite number >= 0), got {self.at!r}")


@dataclass(frozen=True)
class Straggler:
    """Every compute of rank ``rank`` takes ``slowdown`` times as long (``slowdown >= 1``)."""

    rank: int
    slowdown: float = 1.5

    def __post_init__(self):
        if not _rank_ok(self.rank):
            raise ConfigError(f"Straggler: rank must be a rank number (int >= 0), got {self.rank!r}")
        if not (isinstance(self.slowdown, (int, float, np.floating)) and math.isfinite(self.slowdown)
                and self.slowdown >= 1):
            raise ConfigError(f"Straggler(rank={self.rank}): slowdown is how many times longer its compute takes, "
                              f"a number >= 1, got {self.slowdown!r}")


@dataclass(frozen=True)
class Unfinished:
    """An operation a rank issued that has not completed: ``op`` (``send``/``recv`` for
    point to point), its number ``seq`` on ``group`` (global ``ranks``), the members it
    still waits for (``missing``), and when this rank issued it."""

    op: str
    seq: int
    group: str
    ranks: tuple
    missing: list
    issued: float


@dataclass(frozen=True)
class WatchdogTimeout:
    """How a surviving rank's run ended: its oldest unfinished operation ``op`` (``seq``:
    the how-many-th on ``group``, whose global ranks are ``ranks``), issued at ``issued``,
    that ``missing`` never completed; the watchdog fired at ``time``."""

    rank: int
    op: str
    seq: int
    group: str
    ranks: tuple
    missing: tuple
    issued: float
    time: float

    def describe(self, timeout, dead=()):
        """One line: what this rank waited in, for whom (dead, or waiting elsewhere), until when."""
        who = ", ".join(f"rank {m} ({'dead' if m in dead else 'stuck itself'})" for m in self.missing) or "nobody"
        return (f"rank {self.rank}: {self.op} #{self.seq} on group {self.group} (ranks {list(self.ranks)}), issued at "
                f"{_ms(self.issued)}, never completed: it waited for {who}; its watchdog fired {timeout:g} s later, at "
                f"{_ms(self.time)}")


def _ms(t):
    return f"{t * 1e3:.3f} ms" if t < 1 else f"{t:.3f} s"


class Faults:
    """The faults of one World: per rank, when it dies (``deadline``, inf if never) and
    how much slower it computes (``slowdown``); ``timeout``: the watchdog's."""

    def __init__(self, faults, size, watchdog_timeout=DEFAULT_WATCHDOG_TIMEOUT, folded=False):
        faults = list(faults or ())
        if not (isinstance(watchdog_timeout, (int, float, np.floating)) and watchdog_timeout > 0
                and math.isfinite(watchdog_timeout)):
            raise ConfigError(f"watchdog_timeout is in seconds and must be a positive number, got "
                              f"{watchdog_timeout!r} (ProcessGroupNCCL's default is {DEFAULT_WATCHDOG_TIMEOUT:g})")
        self.timeout = float(watchdog_timeout)
        self.deadline = [math.inf] * size
        self.slowdown = [1.0] * size
        for f in faults:
            if not isinstance(f, (RankFailure, Straggler)):
                raise ConfigError(f"faults= takes RankFailure(rank, at) and Straggler(rank, slowdown), got {f!r}")
            if f.rank >= size:
                raise ConfigError(f"{f} names rank {f.rank}, but this World has ranks 0..{size - 1}")
            if isinstance(f, RankFailure):
                if self.deadline[f.rank] != math.inf:
                    raise ConfigError(f"rank {f.rank} is given two RankFailures; a rank dies once")
                self.deadline[f.rank] = float(f.at)
            else:
                self.slowdown[f.rank] *= float(f.slowdown)
        self.active = any(d != math.inf for d in self.deadline)
        if faults and folded:
            raise ConfigError("faults= needs every rank to run: a folded World runs one rank for many, so it cannot "
                              "fail one of them alone; drop fold=")
        self.doomed = set()  # ranks that died inside an operation (it never completed)

    def interrupted(self, clock, ranks, steps, t0):
        """Does a member of ``ranks`` die before the operation (``steps`` from ``t0``)
        would end? Then it never completes, and those members are doomed."""
        if not self.active:
            return False
        first = min(self.deadline[r] for r in ranks)
        if first == math.inf:
            return False
        _, end = clock.span(steps, ranks, t0)
        dying = [r for r in ranks if self.deadline[r] < end]
        self.doomed.update(dying)
        return bool(dying)


def resolve(world):
    """After a run of ``world`` stopped (every live rank returned, died or waits): the
    RankFailedError if a rank died, else None (a wait with no failure is a deadlock).
    Ranks still waiting end at their watchdog time, on their clocks."""
    faults, clock = world.faults, world.clock
    dead = dict(world.dead)
    waiting = [r for r in world.live if not world.finished(r)]
    for r in sorted(faults.doomed):
        dead.setdefault(r, faults.deadline[r])
    for r in waiting:  # a rank with a failure time that waits: it dies first, unless its watchdog fires first
        pending = world.unfinished_ops(r)
        fires = min((p.issued for p in pending), default=clock.compute[r]) + faults.timeout
        if faults.deadline[r] <= fires and r not in dead:
            dead[r] = max(faults.deadline[r], clock.compute[r])
    if not dead:
        return None
    timeouts = {}
    for r in waiting:
        if r in dead:
            continue
        pending = sorted(world.unfinished_ops(r), key=lambda p: (p.issued, p.seq))
        if not pending:
            continue
        p = pending[0]
        timeouts[r] = WatchdogTimeout(r, p.op, p.seq, p.group, tuple(p.ranks), tuple(p.missing), p.issued,
                                      p.issued + faults.timeout)
        clock.join(r, timeouts[r].time, f"{p.op} (watchdog)")
    return RankFailedError(_message(dead, timeouts, faults.timeout), dead, timeouts, world)


def _message(dead, timeouts, timeout):
    first = min(dead, key=lambda r: (dead[r], r))
    others = [r for r in sorted(dead) if r != first]
    lines = [f"rank {first} failed at {_ms(dead[first])} of simulated time" +
             (f" (and rank(s) {others} later)" if others else "") + "."]
    if timeouts:
        lines.append(f"Its peers were not told: each waited in the operation below until its watchdog fired "
                     f"({timeout:g} s after it was issued, as ProcessGroupNCCL's timeout), then its process went down:")
        rows = [timeouts[r].describe(timeout, dead) for r in sorted(timeouts)]
        lines += [f"  {row}" for row in rows[:SHOWN]]
        if len(rows) > SHOWN:
            lines.append(f"  ... and {len(rows) - SHOWN} more ranks (the error's .timeouts has every one)")
    else:
        lines.append("No other rank was waiting for it; the launcher still sees a process die and stops the job.")
    lines.append("Restart the job from its last complete checkpoint (run_on_mesh(..., resume_from=path)).")
    return "\n".join(lines)


def find_straggler(timeline):
    """The rank whose compute ends last, step after step, in ``timeline`` (every rank's
    compute events in the same order, as an SPMD program makes them): for each k, the
    rank whose k-th compute event ends last; the rank that does so most often (the lowest
    such rank on a tie). One slow step of another rank (a hiccup) does not make it the
    straggler; being slow in most steps does."""
    ends = [[e.end for e in timeline.of(r, "compute", "compute")] for r in range(timeline.size)]
    steps = min(len(e) for e in ends)
    if steps == 0:
        raise ConfigError("find_straggler: some rank has no compute event in this timeline")
    last = np.argmax(np.array([e[:steps] for e in ends]), axis=0)  # per step, the rank that ends last
    return int(np.argmax(np.bincount(last, minlength=timeline.size)))
