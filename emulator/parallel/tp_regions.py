"""The tensor-parallel regions; they live in :mod:`emulator.parallel.tensor_parallel.regions`
(the operators), :mod:`~emulator.parallel.tensor_parallel.overlap` (Transformer Engine's),
:mod:`~emulator.parallel.tensor_parallel.regions_work` (what they declare) and
:mod:`~emulator.parallel.tensor_parallel.linear` (``ColumnThenRow``)."""

from .tensor_parallel.linear import ColumnThenRow
from .tensor_parallel.overlap import TERegions
from .tensor_parallel.regions import SEQ, TPRegions, all_reduce_together, ready
from .tensor_parallel.regions_work import (OVERLAPPED, PIPELINE_SPLITS, region_gather, region_gather_again,
                                           region_gather_back, region_reduce, region_reduce_back, te_overlap, wgrad)

__all__ = ["SEQ", "TPRegions", "TERegions", "ColumnThenRow", "ready", "all_reduce_together", "PIPELINE_SPLITS",
           "OVERLAPPED", "te_overlap", "region_gather", "region_reduce", "region_reduce_back", "region_gather_back",
           "region_gather_again", "wgrad"]
