"""The data-parallel strategies by ZeRO stage, side by side: ``STRATEGIES`` (0: DDP, 1:
ZeRO-1, 2: ZeRO-2, 3: ZeRO-3), ``data_parallel`` to pick one, ``strategy_for`` to pick the
one a software stack runs, and ``assemble`` to put full parameters back together from every
rank's shards."""

import numpy as np

from ...errors import ConfigError
from .buckets import bucket_limit
from .ddp import DDP
from .distributed_optimizer import DistributedOptimizer
from .flat_layout import layouts
from .fsdp_pipeline import FSDPInPipeline
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


def uses_distributed_optimizer(stack, zero_stage):
    """Whether ZeRO-1 runs as Megatron's distributed optimizer, both collectives overlapped."""
    return zero_stage == 1 and stack.grad_overlap == "backward" and stack.param_gather_overlap


def fsdp_whole_in_pipeline(stack, zero_stage, pipelined):
    """Whether ZeRO-3 runs as FSDP2 inside torch's pipelining under ``stack``: a stage's
    layers kept gathered and their gradients whole until one reduce-scatter after its last
    backward (:class:`~.fsdp_pipeline.FSDPInPipeline`; ``pipelined``: pp > 1). The one rule
    the emulator's strategy and the planner's account both read."""
    return zero_stage == 3 and pipelined and stack.fsdp_unsharded_in_pipeline


def strategy_for(stack, zero_stage, comm, model, params, opt, pp_rank=0, label="", pipelined=False):
    """The data-parallel strategy a software stack runs for ``zero_stage``: DDP with its
    buckets (Megatron's rule, torch DDP's 25 MB, or one bucket after the flush), ZeRO-1 as
    Megatron's distributed optimizer where it overlaps both collectives, ZeRO-3 with FSDP's
    prefetch where the stack has it, and inside a pipeline (``pipelined``) as FSDP2 runs
    there where the stack says so (:class:`~.fsdp_pipeline.FSDPInPipeline`)."""
    b = stack.bucket
    if zero_stage == 0:  # (DDP counts the weights' bytes)
        limit, first = bucket_limit(stack, comm.size, pp_rank, next(iter(params.values())).itemsize)
        return DDP(comm, model, params, opt, bucket_bytes=limit, average=False, label=label, first_bucket_bytes=first)
    if uses_distributed_optimizer(stack, zero_stage):
        elements = None if (b.first_stage_only and pp_rank > 0) else b.size(comm.size)
        return DistributedOptimizer(comm, model, params, opt, bucket_elements=elements, average=False, label=label)
    if fsdp_whole_in_pipeline(stack, zero_stage, pipelined):
        return FSDPInPipeline(comm, model, params, opt, prefetch=stack.fsdp_prefetch, average=False, label=label)
    if zero_stage == 3:
        return ZeRO3(comm, model, params, opt, prefetch=stack.fsdp_prefetch, average=False, label=label)
    return STRATEGIES[zero_stage](comm, model, params, opt, average=False, label=label)


def assemble(model, params0, shards_by_rank):
    """Full parameters from every rank's shards ({layer: flat slice} per rank), in the
    global view (no messages): to check a sharded run against a single device."""
    n = len(shards_by_rank)
    out = {}
    for name, layout in layouts(model, params0, n).items():
        flat = np.concatenate([s[name] for s in shards_by_rank])
        out.update({f"{name}.{k}": v for k, v in layout.unflatten(flat).items()})
    return out
