"""Tensor parallelism (Megatron-LM; Shoeybi et al., 2019) and sequence parallelism
(Korthikanti et al., 2022): layers split over the ranks of a tp group.

* :mod:`.regions`: where a layer talks, the one implementation of Megatron's operators:
  f and g (``copy_to_tp_region``, ``reduce_from_tp_region``), sequence parallelism's
  all-gather and reduce-scatter along the sequence (``all_gather_dim``,
  ``reduce_scatter_dim``), and :class:`~.regions.TPRegions`, the four of a tp group;
* :mod:`.overlap`: the same operators as Transformer Engine overlaps them with the GEMMs;
* :mod:`.regions_work`: what each operator declares (the planner sums the same);
* :mod:`.linear`: ``ColumnParallelLinear`` and ``RowParallelLinear``, and the backward a
  column-parallel part feeding a row-parallel one shares (``ColumnThenRow``);
* :mod:`.mlp`, :mod:`.attention`: the MLP and attention split by Megatron (whole heads per rank);
* :mod:`.block`: ``TensorParallelBlock``, the transformer block as an ``nn`` module;
  :mod:`.block_work`: the declaration of its work; :mod:`.op_checkpoint`: torchtitan's
  per-op selective checkpointing of a block (``recompute="op"``);
* :mod:`.vocab`: the embedding and the cross-entropy split by vocabulary.

This package's own names are the lesson's: the linear layers and the f/g operators.
"""

from .linear import ColumnParallelLinear, RowParallelLinear
from .regions import (copy_to_tp_region, copy_to_tp_region_backward, reduce_from_tp_region,
                      reduce_from_tp_region_backward)

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "copy_to_tp_region", "copy_to_tp_region_backward",
           "reduce_from_tp_region", "reduce_from_tp_region_backward"]
