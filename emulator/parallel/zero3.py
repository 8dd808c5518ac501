"""Moved: ZeRO-3 lives in :mod:`emulator.parallel.data_parallel.zero3`."""

from .data_parallel.zero3 import ZeRO3
