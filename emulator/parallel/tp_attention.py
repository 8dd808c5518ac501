"""Tensor-parallel attention; it lives in :mod:`emulator.parallel.tensor_parallel.attention`."""

from .tensor_parallel.attention import ParallelAttention, attention_work

__all__ = ["ParallelAttention", "attention_work"]
