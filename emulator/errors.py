"""Errors raised by the emulator.

Every misuse of the emulated machine raises a subclass of :class:`EmulatorError` from
``world.run`` at once (never a hang), and the message names the ranks involved and what
to do about it. Bad arguments to anything in the package (a model, a topology, a
formula) raise :class:`ConfigError`, which is also a ``ValueError``.
"""


class EmulatorError(Exception):
    """Base class of every error the emulator raises on purpose."""


class ConfigError(EmulatorError, ValueError):
    """An argument the emulator cannot use: unknown reduce op or algorithm, a negative
    size, a model whose dims do not fit, a formula's parameter out of range."""


class CollectiveMismatchError(EmulatorError):
    """Ranks of one group called different collectives, or one collective with
    different shapes, dtypes or arguments, at the same point of their programs."""


class DeadlockError(EmulatorError):
    """Every live rank is blocked and no collective or point-to-point transfer can
    ever complete."""


class RankError(EmulatorError):
    """A rank's own code raised; the other ranks were stopped.

    ``rank`` is the global rank, ``original`` the exception it raised and
    ``rank_traceback`` its traceback as text.
    """

    def __init__(self, rank, original, rank_traceback):
        self.rank = rank
        self.original = original
        self.rank_traceback = rank_traceback
        super().__init__(
            f"rank {rank} raised {type(original).__name__}: {original}\n"
            f"--- traceback of rank {rank} ---\n{rank_traceback}"
        )


class RankFailedError(EmulatorError):
    """A rank died (a :class:`~emulator.engine.faults.RankFailure`) and the job stopped.

    ``rank`` is the first rank that died and ``at`` when (simulated seconds); ``dead``
    maps every rank that died to its time; ``timeouts`` maps every other rank that was
    still running to its :class:`~emulator.engine.faults.WatchdogTimeout` (the collective
    and group it waited in, the ranks that never joined, when its watchdog fired);
    ``world`` is the World, whose timeline and trace show the run up to the end;
    ``checkpoints``: the folders of the saves that completed before it (``run_on_mesh``
    with ``checkpoint_dir=``)."""

    def __init__(self, message, dead, timeouts, world=None):
        self.dead, self.timeouts, self.world = dict(dead), dict(timeouts), world
        self.checkpoints = []
        self.rank = min(self.dead, key=lambda r: (self.dead[r], r))
        self.at = self.dead[self.rank]
        super().__init__(message)


class WallTimeoutError(EmulatorError):
    """A run went on past its World's ``wall_timeout`` (seconds of real time, unlike the
    simulated ``watchdog_timeout``) and was stopped.

    ``ranks``: every rank still running; ``running``: the one that had the thread (a
    program that never gave it back, such as a loop in pure Python), None if none had;
    ``last``: per rank, what it was doing and its last communication call."""

    def __init__(self, lines, ranks, running, last):
        self.ranks, self.running, self.last = list(ranks), running, dict(last)
        super().__init__("\n".join(lines))


class ShapeError(ConfigError):
    """An array cannot be used the way the collective needs (e.g. uneven split)."""


class PeerError(ConfigError):
    """A point-to-point peer is invalid: the rank itself, or out of range."""


class GroupError(ConfigError):
    """A rank used a group it is not in, or a mesh axis that does not exist."""


class MeshError(ConfigError):
    """A mesh whose axis sizes do not multiply to the world size, or a bad axis."""


class MemoryLedgerError(ConfigError):
    """Misuse of a rank's memory ledger (unknown name, name held twice, bad kind)."""
