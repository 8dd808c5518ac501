"""The machine's shape and the alpha-beta cost of a message.

A message of ``n`` bytes over a link costs ``alpha + n / beta`` seconds: ``alpha`` is the
fixed latency (launch, synchronisation, first byte), ``beta`` the bandwidth in bytes/s.
Ranks ``0..gpus_per_node-1`` share node 0, the next ``gpus_per_node`` node 1, and so on;
a message between two ranks on one node takes the intra-node link, any other message the
inter-node link.

Where the preset numbers come from (rounded; they are for reasoning, not for a datasheet):

* NVLink 4 on an 8-GPU H100/H200 (HGX) node: 18 links x 25 GB/s = 450 GB/s per direction
  per GPU (900 GB/s bidirectional, NVIDIA's H100 datasheet). nccl-tests' all_reduce on
  such a node reports a bus bandwidth of roughly 360-380 GB/s for large messages; we use
  370 GB/s as the achieved per-direction bandwidth of one ring step.
* InfiniBand NDR: 400 Gb/s per port, one port (one NIC) per GPU = 50 GB/s per GPU per
  direction (NVIDIA ConnectX-7 datasheet; DGX H100 has 8 NDR ports for 8 GPUs).
* Latency: a few microseconds per hop is the order nccl-tests shows for small messages
  (NVLink about 2 us per step, InfiniBand about 5 us per step).
* Peak dense bf16 throughput of an H100/H200 SXM: 989 TFLOP/s (datasheet, without
  sparsity). H200 has the H100's compute with more and faster HBM.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class Link:
    """One kind of link: ``alpha`` seconds of latency, ``beta`` bytes per second."""

    name: str
    alpha: float
    beta: float

    def __post_init__(self):
        if not (self.alpha >= 0 and self.beta > 0):
            raise ValueError(
                f"Link {self.name!r}: need alpha >= 0 seconds and beta > 0 bytes/s, "
                f"got alpha={self.alpha}, beta={self.beta}"
            )

    def time(self, nbytes):
        """Seconds to send ``nbytes`` over this link in one message."""
        return self.alpha + nbytes / self.beta


NVLINK_H100 = Link("NVLink 4 (H100/H200, achieved)", alpha=2e-6, beta=370e9)
NVLINK_H100_LINE_RATE = Link("NVLink 4 (H100/H200, line rate)", alpha=2e-6, beta=450e9)
INFINIBAND_NDR = Link("InfiniBand NDR (400 Gb/s per GPU)", alpha=5e-6, beta=50e9)
H100_BF16_FLOPS = 989e12


@dataclass(frozen=True)
class Topology:
    """``gpus_per_node`` GPUs per node, one link inside a node, another between nodes.

    ``flops`` is one device's peak (used by ``comm.compute(flops=...)``).
    """

    gpus_per_node: int = 8
    intra: Link = NVLINK_H100
    inter: Link = INFINIBAND_NDR
    flops: float = H100_BF16_FLOPS

    def __post_init__(self):
        if not (isinstance(self.gpus_per_node, int) and self.gpus_per_node >= 1):
            raise ValueError(
                f"Topology: gpus_per_node must be a positive int, got {self.gpus_per_node!r}"
            )
        if not self.flops > 0:
            raise ValueError(f"Topology: flops must be positive, got {self.flops!r}")

    @classmethod
    def h100_cluster(cls, gpus_per_node=8):
        """H100/H200 HGX nodes on NVLink 4, joined by InfiniBand NDR (the default)."""
        return cls(gpus_per_node, NVLINK_H100, INFINIBAND_NDR, H100_BF16_FLOPS)

    def node(self, rank):
        return rank // self.gpus_per_node

    def link(self, src, dst):
        """The link a message from global rank ``src`` to ``dst`` travels on."""
        return self.intra if self.node(src) == self.node(dst) else self.inter
