"""What the planner knows of a machine: :class:`Cluster` (nodes of GPUs, their links and
their device model) and :func:`cluster_preset`.

The links and the device are the emulator's own (:mod:`emulator.machine.topology`,
:mod:`emulator.machine.device`), so a plan the planner evaluates runs on the emulator on the
same machine: ``cluster.topology``.
"""

from dataclasses import dataclass

from ..errors import ConfigError
from ..machine.device import Device
from ..machine.topology import Topology


@dataclass(frozen=True)
class Cluster:
    """``nodes`` nodes of ``topology.gpus_per_node`` GPUs. ``topology`` carries the links
    (NVLink, NICs, channels) and ``topology.device`` the GPU (peak, HBM, achieved rates)."""

    name: str
    nodes: int
    topology: Topology

    def __post_init__(self):
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 1:
            raise ConfigError(f"Cluster {self.name!r}: nodes must be a positive int, got {self.nodes!r}")

    @property
    def gpus_per_node(self):
        return self.topology.gpus_per_node

    @property
    def gpus(self):
        return self.nodes * self.gpus_per_node

    @property
    def device(self):
        return self.topology.device

    @property
    def hbm_bytes(self):
        return self.device.hbm_bytes

    @property
    def peak_flops(self):
        return self.device.peak_flops

    @property
    def nvlink(self):
        return self.topology.nvlink

    @property
    def nic(self):
        return self.topology.nic

    def describe(self):
        t = self.topology
        return (f"{self.name}: {self.nodes} node(s) x {t.gpus_per_node} {self.device.name} "
                f"({self.hbm_bytes / 1e9:.0f} GB HBM, {self.peak_flops / 1e12:.0f} TFLOP/s bf16), NVLink "
                f"{t.nvlink.beta / 1e9:.0f} GB/s, {t.nics_per_node} NICs of {t.nic.beta / 1e9:.0f} GB/s per node")

    def with_nodes(self, nodes):
        return Cluster(self.name, nodes, self.topology)


PRESETS = {
    "h100": ("H100 SXM nodes, 8 x 400G NDR NICs (DGX/HGX H100)", Topology.h100, Device.h100),
    "h200": ("H200 SXM nodes, 8 x 400G NDR NICs (HGX H200)", Topology.h200, Device.h200),
    "a100": ("A100 SXM 80 GB nodes, 8 x 200G HDR NICs (DGX A100, as Selene)", Topology.a100, Device.a100),
}


def cluster_preset(name, nodes=1, gpus_per_node=8, ideal=False):
    """``cluster_preset("h100", nodes=2048)``: ``"h100"``, ``"h200"`` or ``"a100"`` nodes,
    the device's achieved rates (``ideal=True``: every kernel at the datasheet's peak)."""
    key = str(name).lower()
    if key not in PRESETS:
        raise ConfigError(f"cluster_preset: no preset {name!r}; known: {', '.join(PRESETS)}")
    title, topology, device = PRESETS[key]
    dev = device()
    if ideal:
        dev = Device(dev.name + " at peak", dev.peak_flops, dev.hbm_bandwidth, dev.hbm_bytes)
    return Cluster(title, nodes, topology(gpus_per_node=gpus_per_node, device=dev))
