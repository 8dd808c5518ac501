"""A bound on the *wall-clock* time of ``World.run`` (``World(..., wall_timeout=seconds)``).

Every other time in the emulator is simulated (the ``watchdog_timeout`` of a World is
simulated seconds too). This one is real: a rank program that never returns control, a
loop in pure Python that calls nothing of the emulator, holds every rank, since all of
them run in one OS thread, each in turn (greenlets switch only when a rank calls into
the engine). No code of the emulator runs while that loop spins, so nothing inside the
thread can stop it.

:class:`WallGuard` stops it from outside: a watchdog thread waits ``seconds``, then asks
the interpreter to raise :class:`WallInterrupt` in the thread that runs the World
(CPython's ``PyThreadState_SetAsyncExc``, through ``ctypes``). The interpreter raises it
in whatever Python code that thread runs next, the looping rank included, at its next
bytecode boundary, in any thread: the main thread (a Jupyter kernel runs cells there) or
another. ``World.run`` then stops every rank still running and raises a
:class:`~emulator.errors.WallTimeoutError` that names each and what it last did. It asks
again every :data:`REPEAT` seconds until the World has the interrupt (code that swallows
a ``BaseException`` cannot keep it).

What it cannot stop: a single long call into C (one huge NumPy operation, ``time.sleep``)
receives the interrupt only when that call returns, and a rank's ``finally`` block that
itself loops forever while it is being stopped. Without ``wall_timeout`` (None, the
default) nothing of this runs: no thread, and no work at all per collective.
"""

import ctypes
import math
import threading
import traceback

import numpy as np

from ..errors import ConfigError, WallTimeoutError

REPEAT = 0.5  # seconds between requests, until the run has taken the interrupt

_set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
_set_async_exc.argtypes = (ctypes.c_ulong, ctypes.c_void_p)  # a pointer, so that None passes NULL (clears)
_set_async_exc.restype = ctypes.c_int


class WallInterrupt(BaseException):
    """Raised inside the running World's thread when its wall-clock bound has passed (a
    BaseException, so that a rank's ``except Exception`` does not swallow it)."""


def check_wall_timeout(seconds):
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float, np.integer, np.floating)) or \
            not (math.isfinite(seconds) and seconds > 0):
        raise ConfigError(f"wall_timeout is a bound on a run's wall-clock time in seconds (a positive number, or "
                          f"None for none), got {seconds!r}; watchdog_timeout= is the simulated one")
    return float(seconds)


class WallGuard:
    """``with WallGuard(seconds):`` -- after ``seconds`` of wall-clock time, raise
    :class:`WallInterrupt` in this thread (again every :data:`REPEAT` seconds, until
    :meth:`taken`); leaving the block cancels it, and any request not yet raised."""

    def __init__(self, seconds):
        self.seconds = seconds
        self.fired = False  # the bound passed
        self._taken = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        self._target = threading.get_ident()
        self._thread = threading.Thread(target=self._watch, name="World wall_timeout", daemon=True)
        self._thread.start()
        return self

    def _watch(self):
        wait = self.seconds
        while not self._stop.wait(wait):
            with self._lock:
                if self._stop.is_set() or self._taken:
                    return
                self.fired = True
                _set_async_exc(self._target, id(WallInterrupt))
            wait = REPEAT

    def taken(self):
        """The run has the interrupt: ask no more."""
        self._taken = True
        self._stop.set()

    def __exit__(self, *exc):
        self._stop.set()
        with self._lock:  # the watchdog asks only while holding it: after this, nothing new is asked
            if self.fired:
                _set_async_exc(self._target, None)  # withdraw a request not raised yet
        self._thread.join()
        return False


def _where(exc):
    """Where the interrupt found the rank: the innermost frame of its traceback."""
    frames = traceback.extract_tb(exc.__traceback__) if exc is not None else []
    if not frames:
        return ""
    f = frames[-1]
    code = f" `{f.line.strip()}`" if f.line else ""
    return f" at {f.name} ({f.filename}:{f.lineno}){code}"


def _last_call(world, rank):
    calls = world.calls[rank]
    if not calls:
        return "it had made no communication call"
    return f"its last call (of {len(calls)}): {calls[-1]!r}"


def stopped_error(world, seconds, running, exc):
    """The :class:`~emulator.errors.WallTimeoutError` for a run stopped after ``seconds``
    of wall-clock time; ``running``: the rank that had the thread (None: the scheduler),
    ``exc``: the interrupt as it was raised there. Call it before the ranks are unwound."""
    ranks = [r for r in world.live if not world.finished(r) or r == running]
    what = {}
    for r in ranks:
        if r == running:
            doing = f"was running and never gave the thread back{_where(exc)}"
        elif r in world._waiting:
            doing = world._waiting[r]()
        else:
            doing = "was ready to run, waiting for its turn"
        what[r] = f"{doing}; {_last_call(world, r)}"
    lines = [f"World.run was stopped after {seconds:g} s of wall-clock time (wall_timeout={seconds:g}); "
             f"ranks {ranks} were still running:"]
    lines += [f"  rank {r} {what[r]}" for r in ranks]
    done = [r for r in world.live if r not in ranks]
    lines.append(f"  returned already: {done if done else 'none'}")
    if running is not None:
        lines.append(f"Every rank runs in one thread, each in turn until it calls the emulator: rank {running} kept "
                     f"it, so no other rank could go on. Look for a loop in its program that never ends (or a "
                     f"computation far larger than meant), or raise wall_timeout if it is only slow.")
    else:
        lines.append("Raise wall_timeout if the run is only slow; watchdog_timeout= bounds simulated time, not this.")
    return WallTimeoutError(lines, ranks, running, what)
