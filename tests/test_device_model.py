"""The device model's laws: time grows with size and never beats the peak or the HBM; the
ideal device and ``comm.compute(flops=...)`` are unchanged; bad arguments get clear
errors (the published figures: tests/test_device.py)."""

import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from emulator import ConfigError, Topology, World
from emulator.cost import collective_time
from emulator.machine import device_calibration as cal
from emulator.machine.device import gemm_model
from emulator.machine.device import Device
from emulator.machine.kernels import Kernel, attention, gemm, memory_bound
from tests._devices import DEVICES


# ----------------------------------------------------------------- laws of the model
SIZES = [1, 2, 3, 7, 64, 127, 128, 129, 1000, 4096, 8191, 65536, 1_000_000]


@pytest.mark.parametrize("name", DEVICES)
def test_gemm_model_time_grows_with_every_dim(name):
    """The tiled model's time never falls as a dimension grows (each tiling's does not, nor
    their minimum); the measured sweep it is corrected to need not be so (next test)."""
    d = DEVICES[name]
    for m in SIZES[::3]:
        for n in SIZES[1::3]:
            times = [gemm_model(d, m, n, k) for k in SIZES]
            assert times == sorted(times), (m, n)
            assert [gemm_model(d, x, n, 4096) for x in SIZES] == sorted(gemm_model(d, x, n, 4096) for x in SIZES)
            assert [gemm_model(d, m, x, 4096) for x in SIZES] == sorted(gemm_model(d, m, x, 4096) for x in SIZES)


def test_the_measured_sweep_is_not_monotone_and_the_device_follows_it():
    """XLA's H100 sweep times 256 x 256 x 4096 (84.3 TFLOP/s: 6.4 us) below 256 x 256 x 1024
    (19.5 TFLOP/s: 6.9 us): cuBLAS splits a long reduction over more SMs. The device takes
    the measurement, not the monotone model."""
    h100 = DEVICES["H100"]
    sweep = dict(cal._H100_SWEEP)
    measured = {k: 2 * 256 * 256 * k / (sweep[(256, 256, k)] * 1e12) for k in (1024, 4096)}
    assert measured[4096] < measured[1024]
    for k in (1024, 4096):
        assert h100.time(gemm(256, 256, k)) == pytest.approx(measured[k], rel=1e-9)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(DEVICES)), b=st.integers(1, 64), h=st.integers(1, 128),
       s_q=st.integers(1, 1 << 17), s_k=st.integers(1, 1 << 17), d=st.integers(16, 320),
       passes=st.sampled_from([2, 4, 5]), fraction=st.sampled_from([0.25, 0.5, 1.0]),
       dim=st.sampled_from(["b", "h", "s_q", "s_k", "d"]), grow=st.integers(1, 1000))
def test_attention_time_grows_with_every_dim_and_with_the_share_computed(name, b, h, s_q, s_k, d, passes,
                                                                         fraction, dim, grow):
    dev = DEVICES[name]
    args = dict(b=b, h=h, s_q=s_q, s_k=s_k, d=d, passes=passes, fraction=fraction)
    base = dev.time(attention(**args))
    assert dev.time(attention(**{**args, dim: args[dim] + grow})) >= base
    assert dev.time(attention(**{**args, "fraction": 1.0})) >= base  # a mask never costs more


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(DEVICES)), m=st.integers(1, 1 << 20), n=st.integers(1, 1 << 17),
       k=st.integers(1, 1 << 17), s=st.integers(1, 1 << 17), d=st.sampled_from([32, 64, 96, 128, 192, 256]),
       fraction=st.sampled_from([0.5, 1.0]), passes=st.sampled_from([2, 5]))
def test_never_faster_than_the_peak_or_the_hbm(name, m, n, k, s, d, fraction, passes):
    dev = DEVICES[name]
    for kernel in (gemm(m, n, k), attention(1 + m % 8, 1 + n % 64, s, s, d, passes, fraction)):
        t = dev.time(kernel)
        assert kernel.flops / t <= dev.peak_flops
        assert kernel.nbytes / t <= dev.hbm_bandwidth
    assert dev.time(memory_bound(m * k)) >= m * k / dev.hbm_bandwidth


def test_large_gemms_reach_70_to_80_percent_of_the_h100_peak_and_small_ones_much_less():
    h100 = DEVICES["H100"]
    big = h100.achieved_flops(gemm(8192, 8192, 8192)) / h100.peak_flops
    assert 0.70 <= big <= 0.80
    assert h100.achieved_flops(gemm(1024, 1024, 1024)) / h100.peak_flops < 0.4
    skinny = gemm(8, 16384, 16384)  # a matrix-vector-like product: bound by reading the weight
    assert h100.time(skinny) == pytest.approx(skinny.nbytes / h100.achieved_hbm + h100.rates.gemm_launch, rel=0.01)
    short = gemm(16384, 16384, 64)  # a short reduction: bound by writing its output
    assert h100.time(short) >= short.nbytes / h100.achieved_hbm
    assert h100.achieved_flops(short) < 0.2 * h100.peak_flops


def test_h200_has_the_h100_compute_and_its_own_hbm():
    h100, h200 = DEVICES["H100"], DEVICES["H200"]
    assert h200.time(gemm(8192, 8192, 8192)) == h100.time(gemm(8192, 8192, 8192))
    assert h200.time(attention(1, 16, 8192, 8192, 128)) == h100.time(attention(1, 16, 8192, 8192, 128))
    assert h200.time(memory_bound(1e9)) < 0.8 * h100.time(memory_bound(1e9))
    assert (h200.hbm_bandwidth, h200.hbm_bytes) == (4.8e12, 141e9)


def test_products_count_and_head_dims_between_the_measured_ones():
    h100 = DEVICES["H100"]
    one, three = h100.time(gemm(4096, 4096, 4096)), h100.time(gemm(4096, 4096, 4096, count=3))
    assert one < three <= 3 * one  # a batch of products is one kernel: its tiles share the waves
    for pass_ in ("fwd", "bwd"):
        r64, r96, r128 = (h100.attention_rate(pass_, d, 4096, False) for d in (64, 96, 128))
        assert r64 < r96 < r128
        widest = 256 if pass_ == "fwd" else 128  # clamped beyond the widest head dim measured
        assert h100.attention_rate(pass_, 512, 4096, False) == h100.attention_rate(pass_, widest, 4096, False)
    # the masked backward loses what the masked forward loses: at long sequences the same share
    for s in (1 << 20, 1 << 24):
        ratio = h100.attention_rate("fwd", 128, s, True) / h100.attention_rate("fwd", 128, s, False)
        expected = ratio * h100.attention_rate("bwd", 128, s, False)
        assert h100.attention_rate("bwd", 128, s, True) == pytest.approx(expected, rel=1e-3)
    assert h100.attention_rate("bwd", 128, 2048, True) < 0.9 * h100.attention_rate("bwd", 128, 2048, False)
    assert DEVICES["A100"].time(attention(2, 8, 1024, 1024, 64, 2, 0.0)) == 0.0  # no block computed
    # a device measured only for the unmasked forward runs every attention kernel on that curve
    fwd_only = replace(h100, rates=h100.rates._replace(attention=h100.rates.attention[:3]))
    for pass_, masked in (("bwd", False), ("bwd", True), ("fwd", True)):
        assert fwd_only.attention_rate(pass_, 96, 3000, masked) == fwd_only.attention_rate("fwd", 96, 3000, False)
    assert DEVICES["A100"].time(gemm(0, 4096, 4096)) == 0.0


# ----------------------------------------------------------------- the ideal device, unchanged
def test_the_ideal_device_charges_flops_at_peak_and_memory_nothing():
    ideal = Device.ideal_device()
    assert (ideal.ideal, ideal.peak_flops) == (True, 989e12)
    for k in (gemm(8192, 8192, 8192), gemm(3, 5, 7), attention(2, 16, 4096, 4096, 128, 5, 0.5)):
        assert ideal.time(k) == k.flops / 989e12
    assert ideal.time(memory_bound(1e12)) == 0.0
    for topo in (Topology(), Topology.h100(), Topology.h200()):
        assert topo.device == ideal and topo.flops == 989e12
    assert Topology.a100().device.ideal and Topology.a100().device.peak_flops == 312e12 == Topology.a100().flops


def test_compute_flops_stays_at_peak_while_kernels_take_the_device_rate():
    k = gemm(4096, 4096, 4096)
    for topo, device in ((Topology.h100(device=Device.h100()), Device.h100()),
                         (Topology.a100(device=Device.a100()), Device.a100()), (Topology.h100(), None)):
        w = World(2, topology=topo)

        def prog(comm):
            comm.compute(flops=1e12)
            comm.compute(kernel=k)

        w.run(prog)
        expected = 1e12 / topo.flops + (device.time(k) if device else k.flops / topo.flops)
        assert max(w.stats().time) == pytest.approx(expected)
    assert Topology.h100(device=Device.a100()).flops == 312e12  # a preset given a device charges its peak


def test_a_calibrated_topology_runs_collectives_and_kernels_together():
    topo = Topology.h200(device=Device.h200())
    assert hash(topo) == hash(Topology.h200(device=Device.h200()))  # the engine caches tables by topology
    w = World(16, topology=topo)
    x = np.ones(1 << 12, np.float32)
    k = attention(1, 16, 4096, 4096, 128, 2, 0.5)

    def prog(comm):
        comm.compute(kernel=k)
        return comm.all_reduce(x)

    out = w.run(prog)
    assert all(np.array_equal(o, 16 * x) for o in out)
    expected = Device.h200().time(k) + collective_time("all_reduce", x.nbytes, 16, topo)
    assert max(w.stats().time) == pytest.approx(expected)


# ----------------------------------------------------------------- errors
@pytest.mark.parametrize("kwargs, says", [
    (dict(peak_flops=0), "peak_flops must be a positive number"),
    (dict(peak_flops=-1e12), "peak_flops must be a positive number"),
    (dict(peak_flops=float("nan")), "peak_flops must be a positive number"),
    (dict(peak_flops=1e15, hbm_bandwidth=0), "hbm_bandwidth must be a positive number"),
    (dict(peak_flops=1e15, hbm_bytes=-80e9), "hbm_bytes must be a positive number"),
    (dict(peak_flops=1e15, ideal=False), "needs rates="),
    (dict(peak_flops=1e15, ideal=False, rates=cal.RATES["H100"]._replace(gemm_efficiency=1.2)),
     "efficiencies must be in"),
    (dict(peak_flops=1e15, ideal=False, rates=cal.RATES["H100"]._replace(launch_seconds=-1.0)),
     "overheads >= 0"),
    (dict(peak_flops=100e12, ideal=False, rates=cal.RATES["H100"]), "attention rate for fwd, d=64"),
    (dict(peak_flops=1e15, ideal=False, rates=cal.RATES["H100"]._replace(attention=cal.RATES["H100"].attention[6:])),
     "attention rates need at least an unmasked forward row"),
    (dict(peak_flops=1e15, ideal=False,  # FA2's table without its unmasked forward: its lookups would never end
          rates=cal.RATES["H100"]._replace(attention_flash2=cal.RATES["H100"].attention_flash2[3:])),
     "attention_flash2 rates need at least an unmasked forward row"),
    (dict(peak_flops=1e15, ideal=False,  # the same for cuDNN's
          rates=cal.RATES["H100"]._replace(attention_cudnn=cal.RATES["H100"].attention_cudnn[3:])),
     "attention_cudnn rates need at least an unmasked forward row"),
])
def test_bad_device_arguments_say_what_is_wrong(kwargs, says):
    with pytest.raises(ConfigError, match=re.escape(says)):
        Device("test GPU", **kwargs)


def test_bad_kernels_say_what_is_wrong():
    d = DEVICES["H100"]
    with pytest.raises(ConfigError, match="takes a Kernel"):
        d.time(1e12)
    with pytest.raises(ConfigError, match="unknown kernel kind 'conv'"):
        d.time(Kernel("conv", 1e9, 1e6, ()))
    with pytest.raises(ConfigError, match="finite flops >= 0"):
        d.time(Kernel("gemm", -1.0, 1e6, (1, 1, 1)))
    with pytest.raises(ConfigError, match="finite flops >= 0"):
        Device.ideal_device().time(Kernel("memory", 0.0, float("inf"), ()))
    with pytest.raises(ConfigError, match=re.escape("a fraction in (0, 1] of its score blocks, got 2.0")):
        d.time(attention(1, 8, 1024, 1024, 128, 2, 2.0))

