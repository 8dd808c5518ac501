"""All-reduces on a cluster in the napkins' terms: the seconds one takes for a model's
gradients or a layer's activations, the bus bandwidth nccl-tests prints for a timing, and
the message size below which latency dominates. Each is the cost model's
(:mod:`emulator.cost`) on the default H100 nodes (``Topology``), so a napkin's answer and
the emulator's clock agree."""

from ..cost import busbw, collective_time, crossover_bytes
from ..machine.topology import Link, Topology


def gradient_all_reduce_seconds(n_params, n_gpus, gpus_per_node):
    """(seconds with one flat ring, seconds with a channel per NIC) to all-reduce the bf16
    gradients of ``n_params`` parameters over ``n_gpus`` GPUs, ``gpus_per_node`` per node."""
    topo = Topology(gpus_per_node=gpus_per_node)
    flat, channels = (collective_time("all_reduce", 2 * n_params, n_gpus, topo, channels=c) for c in (1, None))
    return flat, channels


def activation_all_reduce_seconds(b, s, h, t, gpus_per_node):
    """Seconds of one all-reduce of the bf16 activations of ``b`` x ``s`` tokens of width
    ``h`` over ``t`` tensor-parallel ranks (a channel per NIC once it leaves the node)."""
    return collective_time("all_reduce", 2 * b * s * h, t, Topology(gpus_per_node=gpus_per_node))


def all_reduce_busbw_gb(n, nbytes, seconds):
    """The bus bandwidth, in GB/s, that nccl-tests' all_reduce_perf prints for ``nbytes``
    per rank on ``n`` GPUs taking ``seconds``."""
    return busbw("all_reduce", nbytes, n, seconds) / 1e9


def latency_crossover_bytes(n, alpha, beta):
    """Bytes per rank below which a ring all-reduce on ``n`` GPUs of one node, over a link
    of latency ``alpha`` seconds and bandwidth ``beta`` bytes/s, spends more time on
    latency than on bandwidth."""
    return crossover_bytes(n, Link("link", alpha, beta))
