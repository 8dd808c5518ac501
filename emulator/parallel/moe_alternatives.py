"""Two other ways to run an MoE layer's communication, measured beside expert parallelism.

* ``tp_moe_forward``: tensor parallelism inside every expert (Megatron's MLP split: fc1
  by columns, fc2 by rows). Every rank routes and computes *all* tokens on its slice of
  *every* expert, and one all-reduce of the whole (T, d) output sums the partial results:
  dense slices move instead of sparse tokens, and each expert's matrix multiplications are
  cut t ways (smaller, less efficient GEMMs).
* ``hierarchical_all_to_all``: an all-to-all across nodes in two hops, as DeepEP does: first
  inside each node over NVLink, gathering everything bound for the same GPU index on other
  nodes; then one message per remote node between GPUs of the same index (the same rail).
  Each GPU's NIC then carries (nodes - 1) large messages instead of one small message per
  remote GPU: the latency paid per message shrinks by the number of GPUs per node.
"""

import numpy as np

from ..errors import ConfigError


def shard_experts_tp(params, size, rank):
    """Every expert's fc1 columns and fc2 rows for tensor rank ``rank``; fc2's bias on rank 0
    only (added once when the partial outputs are summed)."""
    f = params["experts.fc1.w"].shape[2]
    if f % size:
        raise ConfigError(f"tensor-parallel experts: d_ff {f} does not split over {size} ranks")
    cols = slice(rank * f // size, (rank + 1) * f // size)
    return {"router.w": params["router.w"], "experts.fc1.w": params["experts.fc1.w"][:, :, cols],
            "experts.fc1.b": params["experts.fc1.b"][:, cols], "experts.fc2.w": params["experts.fc2.w"][:, cols],
            "experts.fc2.b": params["experts.fc2.b"] if rank == 0 else np.zeros_like(params["experts.fc2.b"])}


def tp_moe_forward(comm, moe, params, x):
    """The MoE layer's output for the (replicated) tokens ``x``, experts split t ways: the
    whole layer on this rank's slices gives this rank's partial sum (GELU is elementwise, so
    a slice of fc1's columns feeds the same slice of fc2's rows), and one all-reduce adds them."""
    y, cache = moe.forward(params, x)
    comm.compute(flops=4 * int(cache["counts"].sum()) * moe.d_model * params["experts.fc1.w"].shape[2],
                 name="experts (slices)")
    return comm.all_reduce(y)


def hierarchical_all_to_all(comm, chunks, gpus_per_node):
    """``chunks[j]`` for rank j (one shape for all); returns the chunks every rank sent
    here, in rank order, as a flat all-to-all would, in two hops (see the docstring)."""
    c, g = comm.size, gpus_per_node
    if c % g:
        raise ConfigError(f"hierarchical_all_to_all: {c} ranks are not whole nodes of {g}")
    nodes, node, local = c // g, comm.rank // g, comm.rank % g
    intra = comm.new_group(range(node * g, (node + 1) * g))
    rail = comm.new_group(range(local, c, g))
    chunks = np.stack(chunks).reshape((nodes, g) + np.shape(chunks[0]))  # [dst node, dst local]
    # hop 1 (NVLink): to local peer m, everything bound for GPU index m on every node
    hop1 = intra.all_to_all([np.ascontiguousarray(chunks[:, m]) for m in range(g)])  # from local l: [dst node]
    held = np.stack(hop1)  # [src local, dst node, ...]
    # hop 2 (the rail, over the NICs): to node b, what every local peer sends to (b, my index)
    hop2 = rail.all_to_all([np.ascontiguousarray(held[:, b]) for b in range(nodes)])  # from node a: [src local]
    return [hop2[a][l] for a in range(nodes) for l in range(g)]
