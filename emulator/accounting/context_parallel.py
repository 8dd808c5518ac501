"""Context parallelism in numbers: the activations a GPU keeps when the sequence is split
over ``c`` ranks, the local length at which ring attention's compute hides its K/V
transfer, and how a mesh's GPUs divide between context and data parallelism."""


def cp_activation_bytes(s, b, h, layers, c):
    """(bytes of activations per GPU per layer, for all ``layers``): the 34 s b h bytes of
    a layer's bf16 activations (the s^2 scores never stored) over s / c positions."""
    per_layer = 34 * (s / c) * b * h
    return per_layer, layers * per_layer


def ring_overlap_positions(flops=989e12, beta=370e9, dtype_bytes=2, h=16384, kv_heads=8, head_dim=128):
    """The fewest local positions n for which one ring step's compute (4 b n^2 h FLOPs,
    every query head) takes as long as its K/V transfer (2 b n kv_heads head_dim values of
    dtype_bytes): n = flops dtype_bytes kv / (2 beta h), with kv = kv_heads head_dim the
    width of K (and of V) under grouped-query attention. The defaults: Llama 3 405B's
    width and K/V heads on H100 NVLink."""
    return flops * dtype_bytes * kv_heads * head_dim / (2 * beta * h)


def cp_dp_split(seq, tokens, positions_per_gpu, gpus, tp, pp):
    """(CP, DP, sequences per data-parallel replica per step) for sequences of ``seq``
    tokens, ``tokens`` per step, each GPU holding ``positions_per_gpu`` positions, on
    ``gpus`` GPUs with ``tp`` x ``pp`` model parallelism."""
    cp = seq // positions_per_gpu
    dp = gpus // (tp * pp * cp)
    return cp, dp, tokens // seq // dp
