"""Parallel strategies, one idea per file, that compose on one mesh.

The mesh runtime: :class:`ParallelDims` (``dims.py``) describes a run; every parameter has
a :class:`Placement` (``placement.py``); :func:`run_on_mesh` (``runtime.py``) trains an
``nn.GPT`` with every axis at once (data, tensor, sequence, pipeline, context and expert
parallelism, ZeRO inside pipeline stages), equal to one device, or without data at full
scale (``shape_only=True``).

Data parallelism, the ZeRO ladder side by side (each readable alone):

* :class:`DDP` (``ddp.py``): replicate everything; bucketed all-reduce overlapped with backward.
* :class:`ZeRO1` (``zero1.py``): shard the optimizer state.
* :class:`ZeRO2` (``zero2.py``): shard the gradients too.
* :class:`ZeRO3` (``zero3.py``): shard the parameters too (FSDP), optionally prefetching.

Tensor and sequence parallelism: :mod:`emulator.parallel.tensor_parallel` (Megatron's
column- and row-parallel linear layers and their regions, f/g and the sequence's
all-gather/reduce-scatter; the MLP, attention and the block split over tp; the
vocabulary-parallel embedding and cross-entropy).

``data_parallel(zero_stage, comm, model, params, opt, **options)`` (``zero_ladder.py``) picks one by its stage;
``assemble`` puts full parameters back together from every rank's shards.
"""

from .ddp import DDP
from .dims import ParallelDims
from .placement import Placement, shard, unshard
from .runtime import MeshRun, run_on_mesh, shape_only_batches
from .zero1 import ZeRO1
from .zero2 import ZeRO2
from .zero3 import ZeRO3
from .zero_ladder import NAMES, STRATEGIES, assemble, data_parallel

__all__ = ["DDP", "ZeRO1", "ZeRO2", "ZeRO3", "STRATEGIES", "NAMES", "data_parallel", "assemble", "ParallelDims",
           "Placement", "shard", "unshard", "run_on_mesh", "MeshRun", "shape_only_batches"]
