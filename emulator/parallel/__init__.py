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

Tensor parallelism: :mod:`emulator.parallel.tensor_parallel` (Megatron's column- and
row-parallel linear layers, the f/g operators).

``data_parallel(zero_stage, comm, model, params, opt, **options)`` picks one by its stage;
``assemble`` puts full parameters back together from every rank's shards.
"""

import numpy as np

from ..errors import ConfigError
from .flat_layout import layouts
from .ddp import DDP
from .zero1 import ZeRO1
from .zero2 import ZeRO2
from .zero3 import ZeRO3

STRATEGIES = {0: DDP, 1: ZeRO1, 2: ZeRO2, 3: ZeRO3}
NAMES = {0: "DDP", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}


def data_parallel(zero_stage, comm, model, params, opt, **options):
    """The strategy for ``zero_stage`` 0 (DDP), 1, 2 or 3, on the data-parallel group ``comm``."""
    if zero_stage not in STRATEGIES:
        raise ConfigError(f"zero_stage must be 0 (DDP), 1, 2 or 3, got {zero_stage!r}")
    return STRATEGIES[zero_stage](comm, model, params, opt, **options)


def assemble(model, params0, shards_by_rank):
    """Full parameters from every rank's shards ({layer: flat slice} per rank), in the
    global view (no messages): to check a sharded run against a single device."""
    n = len(shards_by_rank)
    out = {}
    for name, layout in layouts(model, params0, n).items():
        flat = np.concatenate([s[name] for s in shards_by_rank])
        out.update({f"{name}.{k}": v for k, v in layout.unflatten(flat).items()})
    return out


from .dims import ParallelDims  # noqa: E402 -- after STRATEGIES, which the runtime uses
from .placement import Placement, shard, unshard  # noqa: E402
from .runtime import MeshRun, run_on_mesh, shape_only_batches  # noqa: E402

__all__ = ["DDP", "ZeRO1", "ZeRO2", "ZeRO3", "STRATEGIES", "NAMES", "data_parallel", "assemble", "ParallelDims",
           "Placement", "shard", "unshard", "run_on_mesh", "MeshRun", "shape_only_batches"]
