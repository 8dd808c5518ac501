"""One GPU's compute, as the emulator charges it: how long a kernel
(:mod:`emulator.machine.kernels`) takes.

:meth:`Device.ideal_device` runs every matrix product at the datasheet's peak and
elementwise work in no time (the textbook count, "FLOPs over peak"); it is every
:class:`~emulator.machine.topology.Topology`'s default. :meth:`Device.h100`,
:meth:`Device.h200` and :meth:`Device.a100` charge what published kernel measurements
achieve instead (the figures and their sources: :mod:`emulator.machine.device_calibration`):

* **GEMM** (m, n, k), on a roofline::

      t = max(2 m n (k + k0) / (E * peak),  bytes / (eta * hbm)) + t0

  ``E`` is the share of the peak a huge product reaches; ``k0`` is what each output tile
  pays besides its k steps (loading the pipeline, writing the tile), so a short reduction
  wastes a larger share; ``t0`` is the fixed cost of a kernel (launch, a last wave that does
  not fill the GPU). A product of m rows therefore runs at ``E * k / (k + k0)`` of the peak
  when it is large, and is bound by HBM when k or m is small (a matrix-vector product reads
  its whole weight for 2 FLOPs per element). H100: E = 0.835, k0 = 512, t0 = 4 us, so an
  8192^3 product reaches 78% of the dense bf16 peak and a 1024^3 one 27%.
* **attention** (FlashAttention: FA3 on H100/H200, FA2 on A100; a kernel whose ``impl`` is
  ``"flash2"`` runs FA2's rates on H100 too, as PyTorch's SDPA does), per pass (forward: the
  kernel's ``passes`` <= 2; backward otherwise), head dim d and key length s::

      rate = R(d) * s / (s + s_half(d)),    t = max(flops / rate, bytes / (eta * hbm)) + t0

  ``R`` is the long-sequence rate, ``s_half`` the key length at which the kernel reaches
  half of it (short sequences spend more of their time outside the inner loop). A kernel
  that computes only part of its score blocks (``fraction`` < 1, a causal mask) runs on the
  masked curve, which starts lower (its diagonal blocks are partly wasted), and never takes
  longer than the same kernel unmasked. Head dims between the measured ones are
  interpolated, outside them clamped; H100's masked backward, which FA3's paper does not
  show, loses what its masked forward loses (R scaled, s_half shifted alike); A100's figures time forward and backward
  together, so both passes are given the same rate.
* **memory-bound** kernels (layer norm, GELU, softmax, the optimizer): ``bytes / (eta * hbm)``,
  eta the share of the datasheet bandwidth a streaming read-and-write kernel reaches.

Nothing here was fitted to a training run's throughput.
"""

import math
from functools import lru_cache
import numbers
from dataclasses import dataclass, field

from ..errors import ConfigError
from .device_calibration import RATES, Rates
from .kernels import Kernel
from .work import KERNELS
from .frozen import hash_once

ATTENTION_IMPLS = ("flash", "flash2", "cudnn")  # the device's fastest fused kernel; FlashAttention-2; cuDNN's
H100_BF16_FLOPS = 989e12  # H100 SXM, dense bf16, without sparsity (NVIDIA H100 datasheet)
A100_BF16_FLOPS = 312e12  # A100 SXM, dense bf16 (NVIDIA A100 datasheet)


@dataclass(frozen=True)
class Device:
    """``peak_flops``: dense bf16 FLOP/s (datasheet); ``hbm_bandwidth``: bytes/s of HBM
    (datasheet); ``hbm_bytes``: its capacity. ``ideal=True``: every kernel at peak, memory-
    bound kernels free; ``ideal=False``: the achieved ``rates`` of a measured GPU."""

    __hash__ = hash_once  # its tables hashed once

    name: str
    peak_flops: float
    hbm_bandwidth: float = 3.35e12
    hbm_bytes: float = 80e9
    ideal: bool = True
    rates: Rates = field(default=None, repr=False)
    sms: int = 132  # streaming multiprocessors (H100 SXM: 132; A100: 108)

    def __post_init__(self):
        for what in ("peak_flops", "hbm_bandwidth", "hbm_bytes"):
            v = getattr(self, what)
            if not (isinstance(v, numbers.Real) and math.isfinite(v) and v > 0):
                raise ConfigError(f"Device {self.name!r}: {what} must be a positive number, got {v!r}")
        if not self.ideal:
            if not isinstance(self.rates, Rates):
                raise ConfigError(f"Device {self.name!r}: a calibrated device (ideal=False) needs rates= "
                                  f"(see emulator.machine.device_calibration), got {self.rates!r}; "
                                  f"or use Device.h100(), Device.h200(), Device.a100()")
            r = self.rates
            if not (0 < r.gemm_efficiency <= 1 and 0 < r.hbm_efficiency <= 1 and r.gemm_k_overhead >= 0
                    and r.launch_seconds >= 0):
                raise ConfigError(f"Device {self.name!r}: efficiencies must be in (0, 1] and overheads >= 0, "
                                  f"got {r[:4]}")
            tables = {"attention": r.attention, **{f"attention_{k}": v for k, v in r.kernel_rows().items()}}
            for table, rows in tables.items():
                for pass_, masked, d, rate, s_half in rows:
                    if not (0 < rate <= self.peak_flops and s_half >= 0):
                        raise ConfigError(f"Device {self.name!r}: {table} rate for {pass_}, d={d} must be in "
                                          f"(0, peak] with s_half >= 0, got ({rate:g}, {s_half})")
                if (rows or table == "attention") and not any(row[:2] == ("fwd", False) for row in rows):
                    raise ConfigError(f"Device {self.name!r}: {table} rates need at least an unmasked forward row")

    # ----------------------------------------------------------------- presets
    @classmethod
    def ideal_device(cls, peak_flops=H100_BF16_FLOPS, name="ideal H100 (peak FLOP/s)"):
        return cls(name, peak_flops)

    @classmethod
    def h100(cls):
        """H100 SXM 80 GB (HBM3, 3.35 TB/s), 989 TFLOP/s dense bf16, 132 SMs (NVIDIA H100 datasheet)."""
        return cls("H100 SXM 80 GB", H100_BF16_FLOPS, 3.35e12, 80e9, ideal=False, rates=RATES["H100"])

    @classmethod
    def h200(cls):
        """H200 SXM 141 GB (HBM3e, 4.8 TB/s): the H100's compute (NVIDIA H200 datasheet)."""
        return cls("H200 SXM 141 GB", H100_BF16_FLOPS, 4.8e12, 141e9, ideal=False, rates=RATES["H200"])

    @classmethod
    def a100(cls):
        """A100 SXM 80 GB (HBM2e, 2.039 TB/s), 312 TFLOP/s dense bf16, 108 SMs (NVIDIA A100 datasheet)."""
        return cls("A100 SXM 80 GB", A100_BF16_FLOPS, 2.039e12, 80e9, ideal=False, rates=RATES["A100"], sms=108)

    # ----------------------------------------------------------------- timing
    @property
    def achieved_hbm(self):
        """Bytes/s a streaming kernel reaches (the datasheet's on the ideal device)."""
        return self.hbm_bandwidth if self.ideal else self.rates.hbm_efficiency * self.hbm_bandwidth

    def time(self, kernel):
        """Seconds for one :class:`~emulator.machine.kernels.Kernel`."""
        if not isinstance(kernel, (Kernel,) + KERNELS):
            raise ConfigError(f"Device {self.name!r}: time() takes a Kernel (emulator.machine.kernels.gemm, "
                              f"attention or memory_bound), got {type(kernel).__name__}")
        if not (kernel.flops >= 0 and kernel.nbytes >= 0 and math.isfinite(kernel.flops + kernel.nbytes)):
            raise ConfigError(f"Device {self.name!r}: a kernel needs finite flops >= 0 and nbytes >= 0, got {kernel}")
        timing = {"gemm": self._gemm, "attention": self._attention, "memory": self._memory}.get(kernel.kind)
        if timing is None:
            raise ConfigError(f"Device {self.name!r}: unknown kernel kind {kernel.kind!r}; "
                              f"expected 'gemm', 'attention' or 'memory'")
        if self.ideal:
            return kernel.flops / self.peak_flops
        return timing(kernel)

    def achieved_flops(self, kernel):
        """The FLOP/s this device reaches on ``kernel`` (its FLOPs over its time)."""
        return kernel.flops / self.time(kernel)

    def _gemm(self, kernel):
        if not kernel.flops:  # an empty product: nothing is launched
            return 0.0
        m, n, k = kernel.shape
        count = max(1, round(kernel.flops / (2.0 * m * n * k)))  # a batch of products: one kernel
        return _gemm_seconds(self, m, n, k, count, kernel.nbytes)

    def attention_rate(self, pass_, head_dim, s_k, masked, impl="flash"):
        """FLOP/s of a FlashAttention kernel: ``R(d) s / (s + s_half(d))`` (module docstring).
        ``impl``: ``"flash"``, the device's fastest fused kernel; ``"flash2"``, FlashAttention-2;
        ``"cudnn"``, cuDNN's fused attention (on A100 all three are FlashAttention-2's rates)."""
        rate, s_half = self._attention_curve(pass_, head_dim, masked, self._attention_rows(impl))
        return rate * s_k / (s_k + s_half)

    def _attention_rows(self, impl):
        if impl not in ATTENTION_IMPLS:
            raise ConfigError(f"Device {self.name!r}: unknown attention kernel {impl!r}; "
                              f"known: {', '.join(ATTENTION_IMPLS)}")
        own = self.rates.kernel_rows().get(impl)
        return own or self.rates.attention  # a kernel without rows of its own on this device: its fastest

    def _attention_curve(self, pass_, head_dim, masked, rows):
        """(R, s_half) at ``head_dim`` from ``rows``; a masked curve the papers do not show
        (H100's masked backward) takes from R and adds to s_half what masking does to the
        forward."""
        table = {d: (rate, s_half) for p, m, d, rate, s_half in rows if (p, m) == (pass_, masked)}
        if table:
            return _interpolate(table, head_dim)
        if not masked:  # no backward measured: the forward's curve
            return self._attention_curve("fwd", head_dim, False, rows)
        if pass_ == "fwd" or not any(row[:2] == ("fwd", True) for row in rows):  # no mask measured at all
            return self._attention_curve(pass_, head_dim, False, rows)
        (r, s), (rf, sf), (rm, sm) = (self._attention_curve(*key, rows) for key in
                                      ((pass_, head_dim, False), ("fwd", head_dim, False), ("fwd", head_dim, True)))
        return r * rm / rf, max(0.0, s + sm - sf)

    def _attention(self, kernel):
        if not kernel.flops:  # no score block computed: nothing is launched
            return 0.0
        b, h, s_q, s_k, d, passes, fraction = kernel.shape
        if not 0 < fraction <= 1:
            raise ConfigError(f"Device {self.name!r}: an attention kernel computes a fraction in (0, 1] of its "
                              f"score blocks, got {fraction}")
        pass_ = "fwd" if passes <= 2 else "bwd"
        impl = getattr(kernel, "impl", "flash")
        memory = kernel.nbytes / self.achieved_hbm
        t = max(kernel.flops / fraction / self.attention_rate(pass_, d, s_k, False, impl), memory)  # every block
        if fraction < 1:
            t = min(t, max(kernel.flops / self.attention_rate(pass_, d, s_k, True, impl), memory))
        return t + self.rates.launch_seconds

    def _memory(self, kernel):
        return kernel.nbytes / self.achieved_hbm


TILES = ((64, 64), (64, 128), (128, 64), (128, 128), (128, 256), (256, 128))
SPLITS = (1, 2, 4, 8)


def gemm_model(device, m, n, k, count=1, nbytes=None):
    """Seconds of ``count`` products (m x k) @ (k x n) in one kernel, as cuBLAS would pick its
    tiling: for each output tile (tm x tn) and split of k, the tiles run in waves of one per
    SM, each wave taking a tile's FLOPs at the SM's share of E x peak, smaller tiles losing
    ``tile_penalty / (tm tn / (tm + tn))`` of it, every tile paying k0 steps of filling its
    pipeline, a split-K its partial sums written and read back; the fastest choice, no less
    than its bytes at the achieved HBM rate, plus the kernel's fixed cost t0."""
    r = device.rates
    per_sm = r.gemm_efficiency * device.peak_flops / device.sms
    best = math.inf
    for tm, tn in TILES:
        eff = 1.0 - r.tile_penalty / (tm * tn / (tm + tn))
        tiles = -(-m // tm) * -(-n // tn) * count
        for split in SPLITS:
            if split > 1 and k < 128 * split:
                continue
            waves = -(-tiles * split // device.sms)
            t = waves * 2.0 * tm * tn * (-(-k // split) + r.gemm_k_overhead) / (eff * per_sm)
            if split > 1:
                t += r.split_k_seconds + 4.0 * m * n * count * split * 2 / device.achieved_hbm
            best = min(best, t)
    nbytes = nbytes if nbytes is not None else 2.0 * count * (m * k + k * n + m * n)
    fixed = r.gemm_launch if r.gemm_launch is not None else r.launch_seconds
    return max(best, nbytes / device.achieved_hbm) + fixed


def _sweep_correction(device, m, n, k):
    """The measured sweep's time over the model's, interpolated in log2(m, n, k) inside the
    sweep; outside it the correction fades (per dimension beyond the sweep, 4096 / dim;
    below it, dim / 256)."""
    grid = _sweep_grid(device)
    axes = grid["axes"]
    lo, hi = axes[0], axes[-1]
    point, fade = [], 1.0
    for x in (m, n, k):
        c = min(max(x, lo), hi)
        fade *= min(1.0, hi / x, x / lo)
        point.append(math.log2(c))
    logs = [math.log2(a) for a in axes]
    idx = []
    for v in point:
        j = min(max(0, sum(1 for L in logs if L <= v) - 1), len(logs) - 2)
        idx.append((j, (v - logs[j]) / (logs[j + 1] - logs[j])))
    total = 0.0
    for corner in range(8):
        w, key = 1.0, []
        for d, (j, f) in enumerate(idx):
            up = corner >> d & 1
            w *= f if up else 1 - f
            key.append(axes[j + up])
        total += w * grid["log"][tuple(key)]
    return math.exp(total * fade)


_GRIDS = {}


def _sweep_grid(device):
    key = (device.rates, device.peak_flops, device.hbm_bandwidth, device.sms)
    if key not in _GRIDS:
        ratios = {}
        for (m, n, k), tflops in device.rates.sweep:
            measured = 2.0 * m * n * k / (tflops * 1e12)
            ratios[(m, n, k)] = math.log(measured / gemm_model(device, m, n, k))
        _GRIDS[key] = {"axes": sorted({m for m, _, _ in ratios}), "log": ratios}
    return _GRIDS[key]


def _interpolate(table, d):
    """(R, s_half) at head dim ``d``: linear between the measured dims, clamped outside them."""
    dims = sorted(table)
    if d <= dims[0]:
        return table[dims[0]]
    if d >= dims[-1]:
        return table[dims[-1]]
    hi = next(x for x in dims if x >= d)
    lo = dims[dims.index(hi) - 1]
    w = (d - lo) / (hi - lo)
    return tuple((1 - w) * a + w * b for a, b in zip(table[lo], table[hi]))


@lru_cache(maxsize=1 << 16)
def _gemm_seconds(device, m, n, k, count, nbytes):
    """A GEMM's seconds on ``device``: a pure function of its shape, so computed once per
    shape (the planner asks for the same shapes under many kernel names)."""
    t = gemm_model(device, m, n, k, count, nbytes)
    return t * _sweep_correction(device, m, n, k) if device.rates.sweep else t
