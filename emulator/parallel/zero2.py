"""Moved: ZeRO-2 lives in :mod:`emulator.parallel.data_parallel.zero2`."""

from .data_parallel.zero2 import ZeRO2
