"""The tensor-parallel MLP; it lives in :mod:`emulator.parallel.tensor_parallel.mlp`."""

from .tensor_parallel.mlp import COLUMN_B, COLUMN_W, ROW_W, ParallelMLP, mlp_work

__all__ = ["ParallelMLP", "mlp_work", "COLUMN_W", "COLUMN_B", "ROW_W"]
