"""A GEMM and a tensor-parallel collective pipelined beside it, as Transformer Engine's
userbuffers run them (``--tp-comm-overlap``; the methods and their defaults are TE's
``initialize_ub``, quoted in :mod:`emulator.machine.stack_sources`):

* **ring exchange** (the all-gather before the q/k/v and fc1 GEMMs in forward, and of the
  output gradient before the output projection's and fc2's input-gradient GEMMs): the
  GEMM is cut into ``n`` = tp chunks; the first is this rank's own, and each next one is
  computed once its rows arrive from the ring. It runs on the copy engines and one SM,
  so the GEMM keeps all its SMs;
* **pipeline** (the reduce-scatter after the output projection and fc2): the GEMM is cut
  into ``splits`` = 4 chunks; each chunk's reduce-scatter starts when the chunk is done,
  on ``sms`` = 16 SMs taken from the GEMM, which runs that much slower.

Both return when the pair ends, counted from when both could start; the emulator's timeline
and the planner use the same two functions.

Compute that runs while an NCCL collective runs on the same GPU (a data-parallel bucket's
reduction, a prefetched all-gather) is slower: NCCL's kernels take SMs and memory bandwidth.
:data:`NCCL_CONTENTION` is the average slowdown Lee et al. measured ("Characterizing
Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning: Performance and
Power Implications", arXiv:2507.03114, 2025: "an average computational slowdown of 18.9%",
GPT and LLaMA layers on A100s, H100s, MI250 and MI210), charged on the compute each
overlapped collective ran beside. Transformer Engine's overlaps take their SMs explicitly
instead (``sm_slowdown``).
"""

NCCL_CONTENTION = 0.189  # Lee et al. 2025, abstract: "an average computational slowdown of 18.9%"


def ring_exchange(gemm, comm, n, arrivals=None):
    """End of a GEMM of ``gemm`` seconds cut into ``n`` chunks, chunk k needing the k-th
    block of an all-gather of ``comm`` seconds (``arrivals[k]``: when it is in; default
    evenly over the all-gather, the first at once)."""
    if n <= 1:
        return gemm
    if arrivals is None:
        arrivals = [comm * k / (n - 1) for k in range(n)]
    t = 0.0
    for k in range(n):
        t = max(t, arrivals[k]) + gemm / n
    return t


def pipelined(gemm, comm, splits):
    """End of a GEMM of ``gemm`` seconds (already slowed by the SMs it gave up) cut into
    ``splits`` chunks, each chunk's share of a ``comm``-second reduce-scatter sent once the
    chunk is done: max(gemm + comm / splits, gemm / splits + comm)."""
    return max(gemm + comm / splits, gemm / splits + comm)


def sm_slowdown(sms, taken):
    """A kernel's time on ``sms - taken`` of ``sms`` SMs, relative to all of them."""
    return sms / (sms - taken) if taken else 1.0


def contention(overlapped):
    """Seconds compute loses for running ``overlapped`` seconds beside an NCCL collective."""
    return NCCL_CONTENTION * overlapped
