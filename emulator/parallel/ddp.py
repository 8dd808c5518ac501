"""Moved: DDP lives in :mod:`emulator.parallel.data_parallel.ddp`."""

from .data_parallel.ddp import DDP
