"""Moved: ZeRO-1 lives in :mod:`emulator.parallel.data_parallel.zero1`."""

from .data_parallel.zero1 import ZeRO1
