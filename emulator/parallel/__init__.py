"""Parallel strategies, one idea per file, that compose on one mesh.

The mesh runtime: :class:`ParallelDims` (``dims.py``) describes a run; every parameter has
a :class:`Placement` (``placement.py``); :func:`run_on_mesh` (``runtime.py``) trains an
``nn.GPT`` with every axis at once (data, tensor, sequence, pipeline, context and expert
parallelism, ZeRO inside pipeline stages), equal to one device, or without data at full
scale (``shape_only=True``).

Each kind of parallelism has its home:

* ``data_parallel/``: the ZeRO ladder side by side, each readable alone: :class:`DDP`
  (replicate everything; bucketed all-reduce overlapped with backward), :class:`ZeRO1`
  (shard the optimizer state), :class:`ZeRO2` (the gradients too), :class:`ZeRO3` (the
  parameters too: FSDP, optionally prefetching), Megatron's distributed optimizer; the flat
  layout (``FlatLayout``, ``reduce_flat``: the one flatten, all-reduce, unflatten); the
  stage's gradient finalization on a mesh (``finalize.py``). ``data_parallel(zero_stage,
  comm, model, params, opt, **options)`` picks a strategy by its stage; ``assemble`` puts
  full parameters back together from every rank's shards.
* ``tensor_parallel/``: Megatron's column- and row-parallel linear layers and their
  regions (f/g and the sequence's all-gather/reduce-scatter, one implementation), the MLP,
  attention and the block split over tp, the vocabulary-parallel embedding and
  cross-entropy.
* ``pipeline/``, ``context_parallel/``, ``expert_parallel``; ``checkpoint/`` saves and
  restarts a mesh run.

The modules that held data parallelism before it had a package (``base``, ``ddp``,
``zero1``, ``zero2``, ``zero3``, ``zero_ladder``, ``flat_layout``, ``buckets``,
``distributed_optimizer``, ``mesh_hooks``), tensor parallelism (``tp_regions``, ``tp_mlp``,
``tp_attention``, ``tp_block``, ``sequence_parallel``, ``vocab_parallel``) and expert
parallelism (``moe_alternatives``, ``token_groups``) before they had packages re-export
their names from them.
"""

from . import data_parallel  # the package, callable as its data_parallel function (see its docstring)
from .data_parallel import DDP, NAMES, STRATEGIES, ZeRO1, ZeRO2, ZeRO3, assemble
from .dims import ParallelDims
from .placement import Placement, shard, unshard
from .runtime import MeshRun, run_on_mesh, shape_only_batches

__all__ = ["DDP", "ZeRO1", "ZeRO2", "ZeRO3", "STRATEGIES", "NAMES", "data_parallel", "assemble", "ParallelDims",
           "Placement", "shard", "unshard", "run_on_mesh", "MeshRun", "shape_only_batches"]
