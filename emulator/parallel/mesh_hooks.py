"""Moved: Megatron's finalize_model_grads lives in :mod:`emulator.parallel.data_parallel.finalize`."""

from .data_parallel import MeshHooks, strategy_for, uses_distributed_optimizer
