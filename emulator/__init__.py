"""Parallelism from Scratch: a NumPy emulator of a multi-GPU machine.

``World(n).run(fn)`` runs ``fn(comm)`` once per emulated rank, in one process, with real
NumPy data, every message recorded, every byte held counted, and simulated time.
"""

import importlib

from ._version import __version__
from .algorithms import global_view as collectives
from .records.calls import Call
from .engine.comm import Comm
from .errors import (CollectiveMismatchError, ConfigError, DeadlockError, EmulatorError, GroupError,
                     MemoryLedgerError, MeshError, PeerError, RankError, RankFailedError, ShapeError,
                     WallTimeoutError)
from .engine.faults import RankFailure, Straggler, WatchdogTimeout
from .records.memory import KINDS as MEMORY_KINDS
from .records.memory import MemoryLedger
from .mesh import Mesh
from .algorithms.reduce_ops import REDUCE_OPS, ReduceOp
from .algorithms.p2p_op import P2POp
from .engine.rendezvous import Handle
from .records.table import Table, human_bytes
from .records.timeline import Event, Timeline
from .machine.topology import INFINIBAND_NDR, NVLINK_H100, Link, Topology
from .records.trace import Stats, TraceRecord
from .engine.world import World

__all__ = [
    "World", "Comm", "Handle", "P2POp", "Mesh", "Topology", "Link", "NVLINK_H100", "INFINIBAND_NDR",
    "ReduceOp", "REDUCE_OPS", "MemoryLedger", "MEMORY_KINDS", "Table", "human_bytes", "Event", "Stats",
    "Timeline", "TraceRecord", "Call", "collectives", "EmulatorError", "ConfigError",
    "CollectiveMismatchError", "DeadlockError", "RankError", "ShapeError", "PeerError", "GroupError",
    "MeshError", "MemoryLedgerError", "RankFailure", "Straggler", "WatchdogTimeout", "RankFailedError",
    "WallTimeoutError",
]


def __getattr__(name):
    # Heavier parts load on first use: `from emulator import nn`, `emulator.viz`, ...
    if name in ("nn", "viz", "accounting", "widgets", "parallel", "training", "cost", "planner", "grading"):
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'emulator' has no attribute {name!r}")
