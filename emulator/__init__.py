"""Parallelism from Scratch: a NumPy emulator of a multi-GPU machine.

``World(n).run(fn)`` runs ``fn(comm)`` once per emulated rank, in one process, with real
NumPy data, every message recorded, every byte held counted, and simulated time.
"""

from . import collectives
from .calls import Call
from .comm import Comm
from .errors import (CollectiveMismatchError, ConfigError, DeadlockError, EmulatorError, GroupError,
                     MemoryLedgerError, MeshError, PeerError, RankError, ShapeError)
from .memory import KINDS as MEMORY_KINDS
from .memory import MemoryLedger
from .mesh import Mesh
from .messages import REDUCE_OPS, ReduceOp
from .p2p import P2POp
from .rendezvous import Handle
from .table import Table, human_bytes
from .timeline import Event, Timeline
from .topology import INFINIBAND_NDR, NVLINK_H100, Link, Topology
from .trace import Stats, TraceRecord
from .world import World

__all__ = [
    "World", "Comm", "Handle", "P2POp", "Mesh", "Topology", "Link", "NVLINK_H100", "INFINIBAND_NDR",
    "ReduceOp", "REDUCE_OPS", "MemoryLedger", "MEMORY_KINDS", "Table", "human_bytes", "Event", "Stats",
    "Timeline", "TraceRecord", "Call", "collectives", "EmulatorError", "ConfigError",
    "CollectiveMismatchError", "DeadlockError", "RankError", "ShapeError", "PeerError", "GroupError",
    "MeshError", "MemoryLedgerError",
]


def __getattr__(name):
    # Heavier parts load on first use: `from emulator import nn`, `emulator.viz`, ...
    import importlib

    if name in ("nn", "viz", "accounting", "widgets", "parallel", "training", "sharding", "cost"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'emulator' has no attribute {name!r}")
