"""Two other ways to run an MoE layer's communication, measured beside expert parallelism.

* ``tp_moe_forward``: tensor parallelism inside every expert (Megatron's MLP split: fc1
  by columns, fc2 by rows). Every rank routes and computes *all* tokens on its slice of
  *every* expert, and one all-reduce of the whole (T, d) output sums the partial results:
  dense slices move instead of sparse tokens, and each expert's matrix multiplications are
  cut t ways (smaller, less efficient GEMMs).
* ``hierarchical_all_to_all``: an all-to-all across nodes in two hops, in the order
  DeepSeek-V3's dispatch uses (DeepSeek-V3 report, section 3.2.2; DeepEP's internode
  kernels, ``csrc/kernels/legacy/internode.cu``: RDMA senders first, then forwarders that
  consume RDMA and produce NVLink traffic): first over the NICs to the GPU with the same
  local index on each target node (one message per remote node, on its rail), then inside
  the target node over NVLink to the GPU it is for. For a plain all-to-all this moves the
  same NIC bytes as the flat one and adds a hop: with every message posted at once, as
  NCCL does, it gains nothing.
* ``two_hop_dispatch`` (beside ``flat_dispatch``): what the two hops are for. An MoE token
  goes to k experts; when several of them sit on one node, the flat dispatch sends it over
  the NIC once per GPU, the two-hop dispatch once per node, and NVLink fans it out there.
  DeepSeek-V3 limits each token to at most 4 nodes (node-limited routing, section 2.1.2),
  so a token crosses the NICs at most 4 times whatever its 8 experts.
"""

import numpy as np

from ...errors import ConfigError


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
    here, in rank order, as a flat all-to-all would, in two hops: the NICs first, then
    NVLink (see the module docstring)."""
    c, g = comm.size, gpus_per_node
    if c % g:
        raise ConfigError(f"hierarchical_all_to_all: {c} ranks are not whole nodes of {g}")
    nodes, node, local = c // g, comm.rank // g, comm.rank % g
    intra = comm.new_group(range(node * g, (node + 1) * g))
    rail = comm.new_group(range(local, c, g))
    chunks = np.stack(chunks).reshape((nodes, g) + np.shape(chunks[0]))  # [dst node, dst local]
    # hop 1 (the rail, over the NICs): to node b's GPU of my index, everything bound for node b
    hop1 = rail.all_to_all([chunks[b] for b in range(nodes)])  # from node a: [dst local]
    held = np.stack(hop1)  # [src node, dst local, ...]
    # hop 2 (NVLink): to local peer m, what every node's GPU of my index sent for m
    hop2 = intra.all_to_all([np.ascontiguousarray(held[:, m]) for m in range(g)])  # from local l: [src node]
    return [hop2[l][a] for a in range(nodes) for l in range(g)]


def _check_dispatch(comm, x, dest):
    x, dest = np.asarray(x), np.asarray(dest, bool)
    if dest.shape != (len(x), comm.size):
        raise ConfigError(f"rank {comm.global_rank}: dest must be a (tokens, ranks) = ({len(x)}, {comm.size}) boolean "
                          f"matrix (token t goes to rank j where dest[t, j]), got shape {dest.shape}")
    return x, dest


def _exchange(group, rows, counts):
    """all_to_all_single of ``rows`` split by ``counts`` (one per group rank), counts first."""
    counts = np.asarray(counts, np.int64)
    incoming = group.all_to_all_single(counts)
    return group.all_to_all_single(rows, incoming.tolist(), counts.tolist()), incoming


def flat_dispatch(comm, x, dest):
    """Send token ``t`` (a row of ``x``) to every rank ``j`` with ``dest[t, j]``, one message
    per (token, rank): returns, per source rank, the rows it sent here in its token order."""
    x, dest = _check_dispatch(comm, x, dest)
    order = [np.nonzero(dest[:, j])[0] for j in range(comm.size)]
    rows, incoming = _exchange(comm, x[np.concatenate(order)], [len(o) for o in order])
    return np.split(rows, np.cumsum(incoming)[:-1])


def two_hop_dispatch(comm, x, dest, gpus_per_node):
    """As :func:`flat_dispatch`, in two hops: each token crosses to a remote node once, to
    the GPU of this rank's local index (the rail), which forwards it over NVLink to every
    GPU of its node that needs it. Returns the same rows as :func:`flat_dispatch`."""
    x, dest = _check_dispatch(comm, x, dest)
    c, g = comm.size, gpus_per_node
    if c % g:
        raise ConfigError(f"two_hop_dispatch: {c} ranks are not whole nodes of {g}")
    nodes, node, local = c // g, comm.rank // g, comm.rank % g
    rail = comm.new_group(range(local, c, g))
    intra = comm.new_group(range(node * g, (node + 1) * g))
    per_node = dest.reshape(len(x), nodes, g)  # [token, node, local]
    # hop 1 (NICs): to each node, the tokens bound for any of its GPUs, once, with their masks
    picks = [np.nonzero(per_node[:, b].any(1))[0] for b in range(nodes)]
    rows, from_node = _exchange(rail, x[np.concatenate(picks)], [len(p) for p in picks])
    masks = rail.all_to_all_single(np.concatenate([per_node[p, b] for b, p in enumerate(picks)]).astype(np.uint8),
                                   from_node.tolist(), [len(p) for p in picks]).astype(bool)
    source = np.repeat(np.arange(nodes), from_node)  # the node each held row came from
    # hop 2 (NVLink): to local GPU m, the held rows it needs, by source node
    sends = [np.nonzero(masks[:, m])[0] for m in range(g)]  # already in (source node, token) order
    counts = np.array([np.bincount(source[s], minlength=nodes) for s in sends])  # [dst local, src node]
    incoming = intra.all_to_all_single(counts.ravel()).reshape(g, nodes)  # [src local, src node]
    got = intra.all_to_all_single(rows[np.concatenate(sends)], incoming.sum(1).tolist(), counts.sum(1).tolist())
    parts = np.split(got, np.cumsum(incoming.ravel())[:-1])  # [src local][src node]
    return [parts[l * nodes + a] for a in range(nodes) for l in range(g)]
