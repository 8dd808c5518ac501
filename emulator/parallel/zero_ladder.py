"""Moved: the ZeRO ladder lives in :mod:`emulator.parallel.data_parallel.ladder`."""

from .data_parallel.ladder import NAMES, STRATEGIES, assemble, data_parallel
