"""Sequence parallelism's regions under Megatron-LM's names; they live in
:mod:`emulator.parallel.tensor_parallel.regions` (with tensor parallelism's f and g)."""

from .tensor_parallel.regions import (SEQ, all_gather_dim, gather_from_sequence_parallel_region,
                                      gather_from_sequence_parallel_region_backward, reduce_scatter_dim,
                                      reduce_scatter_to_sequence_parallel_region,
                                      reduce_scatter_to_sequence_parallel_region_backward, sequence_slice)

__all__ = ["SEQ", "all_gather_dim", "reduce_scatter_dim", "gather_from_sequence_parallel_region",
           "gather_from_sequence_parallel_region_backward", "reduce_scatter_to_sequence_parallel_region",
           "reduce_scatter_to_sequence_parallel_region_backward", "sequence_slice"]
