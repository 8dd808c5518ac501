"""Moved: the flat layout lives in :mod:`emulator.parallel.data_parallel.flat_layout`."""

from .data_parallel.flat_layout import FlatLayout, layouts
