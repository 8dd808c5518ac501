"""A DP x TP x PP split in three numbers: is it valid, what training state does each GPU
hold when everything is sharded, and what is the pipeline's bubble.

``mesh_tradeoff(n_params, gpus, tp, pp, gpus_per_node, global_batch, micro_batch=1)``:
DP is what is left of the GPUs; the split is valid when TP fits in a node, TP x PP divides
the GPUs and DP x micro_batch the global batch (in sequences). The state is 16 bytes per
parameter over all the GPUs (fully sharded: 16 N / (DP TP PP)), the same whatever the
split; the bubble is 1F1B's, (p - 1)/(m + p - 1), with m = global_batch / (DP micro_batch)
micro-batches per replica (None when the split is not valid).
"""


def mesh_tradeoff(n_params, gpus, tp, pp, gpus_per_node, global_batch, micro_batch=1):
    dp = gpus // (tp * pp) if gpus % (tp * pp) == 0 else None
    valid = dp is not None and tp <= gpus_per_node and global_batch % (dp * micro_batch) == 0
    m = global_batch // (dp * micro_batch) if valid else None
    return {"valid": bool(valid), "state_bytes": 16 * n_params / gpus,
            "bubble": (pp - 1) / (m + pp - 1) if valid else None}
