"""Bytes each GPU sends per training step, by strategy."""

from .memory import check_zero_stage


def zero_traffic_per_gpu(n_params, dp_size, zero_stage, bytes_per_param=2):
    """Bytes each GPU sends per step: 2(n-1)/n x the parameter bytes for ZeRO stages 0-2
    (one all-reduce, or reduce-scatter + all-gather), 3(n-1)/n x for stage 3 (an
    all-gather in forward, another in backward, a reduce-scatter)."""
    check_zero_stage(zero_stage)
    n = dp_size
    copies = 3 if zero_stage == 3 else 2
    return copies * (n - 1) / n * bytes_per_param * n_params


def dp_compute_bound_tokens(flops, bandwidth, dp, grad_bytes):
    """Tokens per replica per step for which the compute, 6 N T / (TP PP) FLOPs per GPU,
    lasts as long as the ring all-reduce of its gradients, 2 (dp-1)/dp grad_bytes N / (TP
    PP) bytes per GPU: T = grad_bytes (dp-1)/dp flops / (3 bandwidth)."""
    return grad_bytes * (dp - 1) / dp * flops / (3 * bandwidth)
