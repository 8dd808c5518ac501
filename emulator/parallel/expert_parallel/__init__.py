"""Expert parallelism: an MoE layer's experts split over the ranks of an ``ep`` group (and,
optionally, each expert's matrices over a ``tp`` group).

Every rank holds the router (replicated) and ``E / ep`` experts (rank r: experts
``r E/ep .. (r+1) E/ep - 1``), and routes its own tokens. Forward:

1. **route** locally; apply **capacity** with the statistics of the tokens' group
   (:mod:`.token_groups`: first come, first served in the group's token order), dropping
   this rank's over-capacity assignments before they are sent, and sort the kept ones by
   expert;
2. **count exchange**: an all-to-all of the per-expert counts, so each rank learns how
   many rows it will receive from every other rank for each of its experts;
3. **dispatch**: one uneven ``all_to_all_single`` sends each row to its expert's rank;
4. the owner regroups the rows by expert and runs its experts on them;
5. **combine**: the reverse ``all_to_all_single`` brings the outputs home, where each
   token sums its experts' outputs, weighted.

Backward runs the same two all-to-alls the other way: output gradients out to the experts,
input gradients back. The router's gradient is this rank's part (the sum over the ranks
that hold copies of the router is the full one, as data parallelism sums it).

With tensor parallelism inside the experts (``tp`` of size t > 1, Megatron's expert tensor
parallelism), each rank holds a 1/t slice of every local expert's hidden units and every
rank of the tp group routes the same tokens: the experts' outputs, and the routing
weights' gradients, are partial sums over tp (the first is reduced where the dense MLP's
is, the second by an all-reduce of (tokens x top_k) numbers), and the router's input
gradient is added on tp rank 0 only.

:class:`ParallelMoE` is the block's MLP; :func:`forward` and :func:`backward` run one
layer on an ep group with each rank's tokens in rank order (lesson 05).

The package, a file per idea: :mod:`.shards` (which experts a rank holds), :mod:`.layer`
(:class:`ParallelMoE`), :mod:`.ep_group` (:func:`forward`, :func:`backward`),
:mod:`.token_groups` (capacity's statistics over ranks), :mod:`.work` (the declaration of
the layer's work), :mod:`.alternatives` (tensor-parallel experts, the two-hop dispatch).
"""

from .ep_group import backward, forward
from .layer import ParallelMoE
from .shards import shard_experts
from .token_groups import TokenGroup
from .work import expert_kernels, moe_work

__all__ = ["ParallelMoE", "TokenGroup", "backward", "expert_kernels", "forward", "moe_work", "shard_experts"]
