"""Moved: Megatron's distributed optimizer lives in :mod:`emulator.parallel.data_parallel.distributed_optimizer`."""

from .data_parallel.distributed_optimizer import DistributedOptimizer
