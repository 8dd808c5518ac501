"""One GPU's compute, as the emulator charges it: how long a kernel
(:mod:`emulator.machine.kernels`) takes.

:meth:`Device.ideal` runs every matrix product at the datasheet's peak and elementwise
work in no time (the textbook count, "FLOPs over peak"). A calibrated device charges
achieved rates instead.
"""

from dataclasses import dataclass

from ..errors import ConfigError

H100_BF16_FLOPS = 989e12  # H100 SXM, dense bf16, without sparsity (NVIDIA H100 datasheet)


@dataclass(frozen=True)
class Device:
    """``peak_flops``: dense bf16 FLOP/s (datasheet); ``hbm_bandwidth``: bytes/s of HBM
    (datasheet); ``hbm_bytes``: its capacity. ``ideal=True``: every kernel at peak, memory-
    bound kernels free."""

    name: str
    peak_flops: float
    hbm_bandwidth: float = 3.35e12
    hbm_bytes: float = 80e9
    ideal: bool = True

    def __post_init__(self):
        if not (self.peak_flops > 0 and self.hbm_bandwidth > 0 and self.hbm_bytes > 0):
            raise ConfigError(f"Device {self.name!r}: peak_flops, hbm_bandwidth and hbm_bytes must be positive")

    @classmethod
    def ideal_device(cls, peak_flops=H100_BF16_FLOPS, name="ideal H100 (peak FLOP/s)"):
        return cls(name, peak_flops)

    def time(self, kernel):
        """Seconds for one :class:`~emulator.machine.kernels.Kernel`."""
        if self.ideal:
            return kernel.flops / self.peak_flops
        raise NotImplementedError("calibrated devices: see the device model")
