"""Per-rank memory ledger: the real ``nbytes`` of what a rank holds, by kind.

A program says what it keeps alive (``comm.memory.hold("w1", w, "params")``) and when it
lets go (``comm.memory.release("w1")``). The ledger keeps current and peak bytes, in total
and per kind, the breakdown at the moment of the peak, and a history by kind stamped with
the rank's simulated clock, so a lesson can show measured memory beside the formula and
over time. ``holding(array)`` says which held entry an array belongs to, so a check can
tie holding to use (the parameters a layer computes with must be held while it does).
"""

import numpy as np

from ..errors import MemoryLedgerError

KINDS = ("params", "grads", "optimizer", "activations", "buffers")


def memory_key(array):
    """What identifies an array's memory, so that the same tensor under two names (a view,
    or the same array twice) counts once: its first byte and its size. Shape-only arrays
    (:mod:`emulator.arrays.shape_only`) say theirs as ``memory_key``."""
    key = getattr(array, "memory_key", None)
    return key if key is not None else (array.__array_interface__["data"][0], array.nbytes)


def is_array(obj):
    return isinstance(obj, np.ndarray) or hasattr(obj, "memory_key")


def nbytes_of(obj, top=True, seen=None):
    """Bytes of an array, of every array inside a dict/list/tuple (other entries, such as
    a step counter, count nothing), or a plain byte count. An array that appears twice
    (the same memory under two names) counts once."""
    seen = set() if seen is None else seen
    if isinstance(obj, dict):
        return sum(nbytes_of(v, False, seen) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(nbytes_of(v, False, seen) for v in obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj) if top else 0
    if is_array(obj):
        key = memory_key(obj)
        if key in seen:
            return 0
        seen.add(key)
        return int(obj.nbytes)
    if hasattr(obj, "nbytes"):
        return int(obj.nbytes)
    if not top:
        return 0
    raise MemoryLedgerError(
        f"cannot size {type(obj).__name__}: hold an array, a dict/list of arrays, or a byte count"
    )


def _arrays(obj):
    if isinstance(obj, dict):
        for v in obj.values():
            yield from _arrays(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _arrays(v)
    elif is_array(obj):
        yield obj


class MemoryLedger:
    """What one rank holds. ``clock`` is a callable returning the rank's simulated time."""

    def __init__(self, rank, clock=lambda: 0.0):
        self.rank = rank
        self._clock = clock
        self._held = {}  # name -> (kind, nbytes)
        self._objects = {}  # name -> what was held (while it is)
        self.current = {k: 0 for k in KINDS}
        self.peak_by_kind = {k: 0 for k in KINDS}
        self.total = 0
        self.peak = 0
        self.peak_time = 0.0
        self.peak_breakdown = dict(self.current)  # bytes by kind at the moment of the peak
        self._by_kind = [(0.0, (0,) * len(KINDS))]  # (time, bytes per kind) after every change

    def hold(self, name, obj, kind):
        """Record that this rank now keeps ``obj`` (an array, a dict of arrays, or bytes)."""
        if kind not in KINDS:
            raise MemoryLedgerError(f"rank {self.rank}: unknown memory kind {kind!r}; use one of {KINDS}")
        if name in self._held:
            raise MemoryLedgerError(
                f"rank {self.rank}: {name!r} is already held ({self._held[name][0]}); "
                f"release it first or pick another name"
            )
        nbytes = nbytes_of(obj)
        self._held[name] = (kind, nbytes)
        self._objects[name] = obj
        self._change(kind, nbytes)
        return obj

    def release(self, name):
        if name not in self._held:
            raise MemoryLedgerError(
                f"rank {self.rank}: release({name!r}) but nothing by that name is held; "
                f"held now: {sorted(self._held) or 'nothing'}"
            )
        kind, nbytes = self._held.pop(name)
        del self._objects[name]
        self._change(kind, -nbytes)

    def release_all(self, kind=None):
        for name in [k for k, (kd, _) in self._held.items() if kind is None or kd == kind]:
            self.release(name)

    def holds(self, name):
        return name in self._held

    def holding(self, array):
        """The name of the held entry that ``array`` shares memory with, or None."""
        for name, obj in self._objects.items():
            for a in _arrays(obj):
                if np.shares_memory(a, array):
                    return name
        return None

    def _change(self, kind, delta):
        self.current[kind] += delta
        self.total += delta
        self.peak_by_kind[kind] = max(self.peak_by_kind[kind], self.current[kind])
        now = self._clock()
        if self.total > self.peak:
            self.peak, self.peak_time = self.total, now
            self.peak_breakdown = dict(self.current)
        self._by_kind.append((now, tuple(self.current[k] for k in KINDS)))

    @property
    def history(self):
        """[(simulated time, total bytes held)] after every change."""
        return [(t, sum(b)) for t, b in self._by_kind]

    def history_by_kind(self):
        """(times, {kind: bytes}) as arrays: what was held after every change, by kind."""
        times = np.array([t for t, _ in self._by_kind])
        table = np.array([b for _, b in self._by_kind], dtype=np.int64).reshape(len(times), len(KINDS))
        return times, {k: table[:, i] for i, k in enumerate(KINDS)}

    def summary(self):
        row = {"rank": self.rank, "current": self.total, "peak": self.peak}
        row.update({f"peak_{k}": v for k, v in self.peak_by_kind.items()})
        return row
