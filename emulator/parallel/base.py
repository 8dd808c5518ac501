"""Moved: the data-parallel strategies' base class lives in :mod:`emulator.parallel.data_parallel.strategy`."""

from .data_parallel.strategy import DataParallelStrategy
