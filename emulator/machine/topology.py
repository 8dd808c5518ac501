"""The machine's shape: nodes of GPUs on NVLink, NICs between nodes, and NCCL's channels.

A message of ``n`` bytes over a link costs ``alpha + n / beta`` seconds: ``alpha`` is the
fixed latency (launch, synchronisation, first byte), ``beta`` the bandwidth NCCL achieves
on that link, per direction. Ranks ``0..gpus_per_node-1`` share node 0, the next
``gpus_per_node`` node 1, and so on (as torchrun numbers them). Every GPU has

* an NVLink port (through the node's NVSwitch to any GPU of its node), one direction out
  and one in, and
* a NIC: ``nics_per_node`` NICs per node, GPU ``g`` of a node using NIC
  ``g // (gpus_per_node // nics_per_node)``; the default is one NIC per GPU, the
  rail-optimized layout of DGX/HGX H100 and H200 clusters.

A message between two GPUs of one node takes the sender's NVLink-out and the receiver's
NVLink-in; any other message the sender's NIC-out and the receiver's NIC-in (the fabric
between NICs is a non-blocking fat tree). :mod:`emulator.machine.links` charges every message on
those ports.

**Channels.** NCCL splits a ring collective over several *channels*: parallel rings, each
moving a slice of the buffer. Within a node every channel's ring visits the node's GPUs in
the same cyclic order, but each starts at a different GPU, so each channel enters and
leaves the node through a different GPU and NIC (:meth:`Topology.rings`). With 8 GPUs and
8 NICs per node, 8 channels put every NIC to work: cross-node bus bandwidth is the NICs'
together (about 8 x 48 GB/s), not one NIC's. A group with one GPU per node (a strided
data-parallel group) can use only its own NIC, whatever the channels.

Calibration: all_reduce of 1 GiB (busbw as nccl-tests reports it) on H100 nodes with one
NDR 400 Gb/s NIC per GPU, published beside this model (``Topology.h100()``, 8 channels;
``python -m benchmarks.calibration`` prints the model's column):

===========================  ==========================  ========  ==================================
configuration                published busbw             model     source
===========================  ==========================  ========  ==================================
1 node x 8, ring             369 GB/s (NVLS off)         368 GB/s  NVIDIA/nccl-tests#309; ~370 in #212
1 node x 8, NVLS (default)   ~476-480 GB/s               (ring)    NVIDIA/nccl-tests#290, #212
2 nodes x 8, ring            8 NICs x 46-48 = 368-384    373 GB/s  NVIDIA/nccl-tests#290 (per-NIC figure)
4 nodes x 8                  ~320 GB/s (RoCE)            363 GB/s  NVIDIA/nccl#1221
===========================  ==========================  ========  ==================================

At hundreds of nodes NCCL switches to trees (NVIDIA/nccl-tests#283 reports about 350 GB/s
on 248 H200 nodes), where a flat ring is latency-bound. The emulator models rings and
trees, not NVLink SHARP (NVLS), which reduces inside the
NVSwitch and lets a one-node all-reduce exceed the ring's 370 GB/s.

Other figures: NVLink 4 is 18 links x 25 GB/s = 450 GB/s per direction per GPU (NVIDIA H100
datasheet); NCCL's protocol overhead leaves about 370 GB/s (S. Jeaugey in
NVIDIA/nccl-tests#212). NDR InfiniBand is 400 Gb/s = 50 GB/s per direction per NIC
(ConnectX-7); NCCL reaches 46-48 GB/s per NIC (NVIDIA/nccl-tests#290). Latency of a few
microseconds per hop is what nccl-tests shows for small messages. Peak dense bf16 of an
H100/H200 SXM: 989 TFLOP/s (datasheet, without sparsity).

A100 nodes (``Topology.a100()``, as NVIDIA's DGX A100, the node of its Selene cluster): 8
A100 SXM on NVLink 3, 12 links x 25 GB/s = 300 GB/s per direction (600 GB/s both ways;
NVIDIA A100 datasheet), and 8 HDR InfiniBand NICs of 200 Gb/s = 25 GB/s per direction, one
per GPU ("8x200Gbit/s IB cards" on a DGX A100, NVIDIA/nccl#812). Published all_reduce bus
bandwidths at large sizes:

===========================  ================  ========  =======================================
configuration                published busbw   model     source
===========================  ================  ========  =======================================
1 node x 8                   232.5 GB/s (4 GB) 232 GB/s  NVIDIA/nccl-tests#175, NVIDIA/nccl#1048
1 node x 8                   231.6 GB/s (8 GB) 232 GB/s  Azure ND A100 v4 results, NCCL table
2 nodes x 8                  192 GB/s          192 GB/s  NVIDIA/nccl#812 (NVIDIA, DGX A100, 8 HDR)
===========================  ================  ========  =======================================

NCCL reaches about 24 GB/s per HDR NIC (S. Jeaugey in NVIDIA/nccl#412), and the 192 GB/s of
two DGX A100 is 8 of them. Peak dense bf16 of an A100 SXM: 312 TFLOP/s (datasheet).
"""

from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from ..errors import ConfigError
from .device import Device
from .frozen import hash_once


@dataclass(frozen=True)
class Link:
    """One kind of link: ``alpha`` seconds of latency, ``beta`` bytes per second achieved
    per direction, ``line_rate`` the datasheet's bytes per second per direction."""

    name: str
    alpha: float
    beta: float
    line_rate: float = None

    def __post_init__(self):
        if not (self.alpha >= 0 and self.beta > 0):
            raise ConfigError(f"Link {self.name!r}: need alpha >= 0 seconds and beta > 0 bytes/s, "
                              f"got alpha={self.alpha}, beta={self.beta}")
        if self.line_rate is None:
            object.__setattr__(self, "line_rate", self.beta)

    def time(self, nbytes):
        """Seconds to send ``nbytes`` over this link in one message."""
        return self.alpha + nbytes / self.beta


# all_reduce of 1 GiB on H100/H200 nodes with one NDR NIC per GPU, as published:
# (nodes of 8, (low, high) busbw in GB/s, what was measured, source). cost.calibration_table()
# sets the model beside them; the table in the docstring above is the same.
PUBLISHED_ALL_REDUCE_BUSBW = (
    (1, (369, 370), "ring (NVLS off)", "NVIDIA/nccl-tests#309, #212"),
    (1, (476, 480), "NVLink SHARP, NCCL's default in one node", "NVIDIA/nccl-tests#290, #212"),
    (2, (368, 384), "ring: 8 NICs x 46-48 GB/s", "NVIDIA/nccl-tests#290"),
    (4, (320, 320), "RoCE, NVLS on or off", "NVIDIA/nccl#1221"),
)

# The same for A100 nodes with one HDR NIC per GPU (test_device.py checks the model against them).
PUBLISHED_ALL_REDUCE_BUSBW_A100 = (
    (1, (231.6, 232.5), "one node (NVLink 3)", "NVIDIA/nccl-tests#175, NVIDIA/nccl#1048; Azure ND A100 v4"),
    (2, (192, 192), "8 NICs x 24 GB/s", "NVIDIA/nccl#812"),
)

NVLINK_H100 = Link("NVLink 4 (H100/H200 SXM)", alpha=2e-6, beta=370e9, line_rate=450e9)
INFINIBAND_NDR = Link("InfiniBand NDR 400 Gb/s (ConnectX-7)", alpha=5e-6, beta=48e9, line_rate=50e9)
NVLINK_A100 = Link("NVLink 3 (A100 SXM)", alpha=2e-6, beta=232e9, line_rate=300e9)
INFINIBAND_HDR = Link("InfiniBand HDR 200 Gb/s", alpha=5e-6, beta=24e9, line_rate=25e9)
H100_BF16_FLOPS = 989e12
A100_BF16_FLOPS = 312e12


@dataclass(frozen=True)
class Topology:
    """``gpus_per_node`` GPUs per node on ``nvlink``; ``nics_per_node`` NICs of kind
    ``nic`` per node (default: one per GPU); ring collectives use ``channels`` channels
    (default: one per NIC). ``flops`` is one device's peak (``comm.compute(flops=...)``)."""

    __hash__ = hash_once  # its tables hashed once

    gpus_per_node: int = 8
    nvlink: Link = NVLINK_H100
    nic: Link = INFINIBAND_NDR
    nics_per_node: int = None
    channels: int = None
    flops: float = H100_BF16_FLOPS
    name: str = field(default="H100 nodes", compare=False)
    device: Device = None

    def __post_init__(self):
        g = self.gpus_per_node
        if not (isinstance(g, (int, np.integer)) and g >= 1):
            raise ConfigError(f"Topology: gpus_per_node must be a positive int, got {g!r}")
        nics = g if self.nics_per_node is None else self.nics_per_node
        if not (isinstance(nics, (int, np.integer)) and 1 <= nics <= g and g % nics == 0):
            raise ConfigError(f"Topology: nics_per_node must divide gpus_per_node ({g}), got {nics!r}")
        object.__setattr__(self, "nics_per_node", int(nics))
        channels = nics if self.channels is None else self.channels
        if not (isinstance(channels, (int, np.integer)) and channels >= 1):
            raise ConfigError(f"Topology: channels must be a positive int, got {channels!r}")
        object.__setattr__(self, "channels", int(channels))
        if not self.flops > 0:
            raise ConfigError(f"Topology: flops must be positive, got {self.flops!r}")
        if self.device is None:  # FLOPs at the peak rate, as comm.compute(flops=...) charges them
            object.__setattr__(self, "device", Device.ideal_device(self.flops))

    # ----------------------------------------------------------------- presets
    @classmethod
    def h100(cls, gpus_per_node=8, **changes):
        """DGX/HGX H100: 8 H100 SXM on NVLink 4 (NVSwitch), one ConnectX-7 NDR 400 Gb/s
        NIC per GPU (NVIDIA DGX H100 user guide), 989 TFLOP/s bf16 each. The default.
        Compute at peak unless ``device=`` (``Topology.h100(device=Device.h100())``)."""
        return cls(gpus_per_node, NVLINK_H100, INFINIBAND_NDR, name="H100 nodes", **_peak_of(changes))

    @classmethod
    def h200(cls, gpus_per_node=8, **changes):
        """HGX H200: the H100's compute and NVLink 4 with more, faster HBM; the same
        NDR 400 Gb/s NIC per GPU, so the same collectives (``device=Device.h200()`` for
        its HBM)."""
        return cls(gpus_per_node, NVLINK_H100, INFINIBAND_NDR, name="H200 nodes", **_peak_of(changes))

    @classmethod
    def a100(cls, gpus_per_node=8, **changes):
        """DGX A100 (the node of NVIDIA's Selene): 8 A100 SXM 80 GB on NVLink 3 (NVSwitch),
        one HDR 200 Gb/s NIC per GPU, 312 TFLOP/s bf16 each (``device=Device.a100()`` for
        achieved rates)."""
        changes = _peak_of(changes)
        changes.setdefault("flops", A100_BF16_FLOPS)
        if changes.get("device") is None:
            changes["device"] = Device.ideal_device(changes["flops"], name="ideal A100 (peak FLOP/s)")
        return cls(gpus_per_node, NVLINK_A100, INFINIBAND_HDR, name="A100 nodes", **changes)

    h100_cluster = h100

    @classmethod
    def free_network(cls, gpus_per_node=8, **changes):
        """Links with no latency and unlimited bandwidth (and H100 compute): messages take
        no time, so what is left is compute and waiting on it. Used to compare pipeline
        schedules with their formulas, which assume exactly that."""
        free = Link("free (no latency, unlimited bandwidth)", alpha=0.0, beta=float("inf"))
        return cls(gpus_per_node, free, free, name="free network", **changes)

    # ----------------------------------------------------------------- where things are
    def node(self, rank):
        return rank // self.gpus_per_node

    def nic_of(self, rank):
        """The global index of the NIC rank ``rank`` sends through."""
        local = rank % self.gpus_per_node
        return self.node(rank) * self.nics_per_node + local // (self.gpus_per_node // self.nics_per_node)

    def link(self, src, dst):
        """The link a message from global rank ``src`` to ``dst`` travels on."""
        return self.nvlink if self.node(src) == self.node(dst) else self.nic

    def rings(self, ranks, channels):
        """The rings of a ring collective over the group ``ranks`` (global ranks, in group
        order) with ``channels`` channels: a tuple of ``(order, first, stop)``, where
        ``order`` lists group-local ranks in ring order and channels ``first..stop-1`` use
        it (cached, so a tuple of ints). Nodes are visited in order; within each node the group's GPUs in rank order,
        rotated by the channel's offset, so that each channel leaves a node from a
        different GPU (rail-aligned)."""
        return _rings(self.gpus_per_node, tuple(int(r) for r in ranks), int(channels))


def _peak_of(changes):
    """A preset given a device charges ``comm.compute(flops=...)`` at that device's peak."""
    if changes.get("device") is not None:
        changes.setdefault("flops", changes["device"].peak_flops)
    return changes


@lru_cache(maxsize=1024)
def _rings(gpus_per_node, ranks, channels):
    by_node = {}
    for i in sorted(range(len(ranks)), key=lambda i: ranks[i]):
        by_node.setdefault(ranks[i] // gpus_per_node, []).append(i)
    per_node = list(by_node.values())
    widest = max(len(p) for p in per_node)
    distinct = 1 if len(per_node) == 1 else min(channels, widest)
    out = []
    for rot in range(distinct):
        order = tuple(i for p in per_node for i in p[rot % len(p):] + p[:rot % len(p)])
        first, stop = rot * channels // distinct, (rot + 1) * channels // distinct
        out.append((order, first, stop))
    return tuple(out)
