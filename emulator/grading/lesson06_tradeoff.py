"""The splits Exercise 6.4's check tries, and the rules each breaks, in words."""


TRADEOFF_CASES = [  # (n_params, gpus, tp, pp, gpus_per_node, global_batch, micro_batch)
    (70e9, 64, 8, 2, 8, 512, 1), (70e9, 64, 16, 2, 8, 512, 1), (70e9, 64, 8, 4, 8, 512, 1),
    (175e9, 1024, 8, 16, 8, 1536, 1), (7e9, 48, 2, 3, 8, 96, 1), (13e9, 24, 4, 3, 4, 60, 1),
    (30e9, 128, 4, 8, 8, 100, 1), (30e9, 96, 8, 4, 8, 96, 1),
    (13e9, 24, 4, 4, 4, 60, 1),  # tp x pp = 16 does not divide 24 GPUs (tp fits in a node)
    (30e9, 96, 8, 5, 8, 96, 1),  # 40 does not divide 96
    (30e9, 128, 4, 4, 8, 100, 1),  # dp 8 does not divide a batch of 100
    (70e9, 64, 8, 2, 8, 512, 4),  # 4 sequences per micro-batch: m = 32, not 128
    (7e9, 48, 2, 3, 8, 96, 3),  # dp 8 x 3 = 24 divides 96: m = 4
    (70e9, 64, 8, 2, 8, 96, 32),  # dp 4 divides 96, dp x micro_batch = 128 does not
    (1e9, 8, 2, 2, 8, 6, 2),  # dp 2 x 2 = 4 does not divide 6
]


def breaks(n_params, gpus, tp, pp, gpus_per_node, global_batch, micro_batch):
    """The rules a split breaks, in words (empty: valid)."""
    out = []
    if tp > gpus_per_node:
        out.append(f"tp={tp} does not fit in a node of {gpus_per_node} GPUs")
    if gpus % (tp * pp):
        out.append(f"tp x pp = {tp * pp} does not divide the {gpus} GPUs")
    else:
        dp = gpus // (tp * pp)
        if global_batch % (dp * micro_batch):
            out.append(f"dp x micro_batch = {dp} x {micro_batch} = {dp * micro_batch} does not divide the batch of "
                       f"{global_batch} sequences")
    return out
