"""What a rank computes, described so a device model can time it: a :class:`Kernel` is a
kind, its FLOPs, the bytes it moves through HBM, and its shape.

* :func:`gemm` (m, n, k): C (m x n) = A (m x k) B (k x n), 2mnk FLOPs;
* :func:`attention` (b, h, s_q, s_k, d, passes, fraction): a fused attention kernel
  (FlashAttention) over ``passes`` matrix products of (s_q x s_k) x d per head (forward:
  QK^T and PV, 2; backward: QK^T again, then dV, dP, dQ, dK, 5), times the share of the
  score blocks it computes (``fraction``: 1/2 under a causal mask);
* :func:`memory_bound` (bytes): an elementwise or normalising kernel (layer norm, GELU,
  softmax, dropout, the optimizer), timed by the bytes it reads and writes.

``comm.compute(kernel=...)`` (or ``kernels=[...]``) charges them at the topology's
:class:`~emulator.machine.device.Device`'s achieved rates.
"""

from typing import NamedTuple


class Kernel(NamedTuple):
    kind: str  # "gemm", "attention" or "memory"
    flops: float
    nbytes: float
    shape: tuple


def gemm(m, n, k, dtype_bytes=2, count=1):
    """``count`` products of (m x k) by (k x n)."""
    m, n, k = int(m), int(n), int(k)
    return Kernel("gemm", count * 2.0 * m * n * k, count * dtype_bytes * (m * k + k * n + m * n), (m, n, k))


def attention(b, h, s_q, s_k, d, passes=2, fraction=1.0, dtype_bytes=2):
    """A fused attention kernel: ``passes`` products of 2 b h s_q s_k d FLOPs each, on
    ``fraction`` of the score blocks."""
    flops = passes * 2.0 * b * h * s_q * s_k * d * fraction
    nbytes = dtype_bytes * b * h * d * (2 * s_q + 2 * s_k)  # Q, O in; K, V streamed (FlashAttention's IO)
    shape = (int(b), int(h), int(s_q), int(s_k), int(d), int(passes), float(fraction))
    return Kernel("attention", flops, nbytes, shape)


def memory_bound(nbytes):
    """An elementwise kernel that reads and writes ``nbytes`` in all."""
    return Kernel("memory", 0.0, float(nbytes), ())


def total_flops(kernels):
    return sum(k.flops for k in kernels)
