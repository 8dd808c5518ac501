"""The tensor-parallel transformer block; it lives in
:mod:`emulator.parallel.tensor_parallel.block` (the block) and
:mod:`~emulator.parallel.tensor_parallel.block_work` (the declaration of its work)."""

from .tensor_parallel.block import NORMS, RECOMPUTE, TensorParallelBlock, cached_terms
from .tensor_parallel.block_work import block_work, declared_block

__all__ = ["TensorParallelBlock", "cached_terms", "block_work", "declared_block", "RECOMPUTE", "NORMS"]
