"""Parallelism from Scratch: a NumPy emulator of a multi-GPU machine.

``World(n).run(fn)`` runs ``fn(comm)`` once per emulated rank, in one process, with real
NumPy data, every message recorded, every byte held counted, and simulated time.
"""

from . import collectives
from .errors import (ArgumentError, CollectiveMismatchError, DeadlockError, EmulatorError, GroupError,
                     MemoryLedgerError, MeshError, PeerError, RankError, ShapeError)
from .memory import KINDS as MEMORY_KINDS
from .memory import MemoryLedger
from .table import Table, human_bytes
from .topology import INFINIBAND_NDR, NVLINK_H100, NVLINK_H100_LINE_RATE, Link, Topology
from .trace import Event, Stats, Timeline, TraceRecord
from .comm import Comm, Handle
from .world import World

__all__ = [
    "World", "Comm", "Handle", "Topology", "Link", "NVLINK_H100", "NVLINK_H100_LINE_RATE",
    "INFINIBAND_NDR", "MemoryLedger", "MEMORY_KINDS", "Table", "human_bytes", "Event", "Stats",
    "Timeline", "TraceRecord", "collectives", "EmulatorError", "CollectiveMismatchError",
    "DeadlockError", "RankError", "ShapeError", "PeerError", "GroupError", "MeshError",
    "MemoryLedgerError", "ArgumentError",
]


def __getattr__(name):
    # Heavier parts load on first use: `from emulator import nn`, `emulator.viz`, ...
    import importlib

    if name in ("nn", "viz", "accounting", "widgets"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'emulator' has no attribute {name!r}")
