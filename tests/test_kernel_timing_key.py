"""The planner times a declared kernel by what its time depends on, not by its name: the
experts of an MoE layer are timed once, and a kernel that differs in any other field is
never given another's seconds."""

from dataclasses import fields, replace

import pytest

from emulator.machine.device import Device
from emulator.machine.stack import stack_preset
from emulator.machine.work import Attention, Gemm, Memory
from emulator.parallel import ParallelDims
from emulator.planner import cluster_preset
from emulator.planner.timer import Timer

KERNELS = [Gemm("moe: experts: 0 fc1", 4096, 2048, 7168, "bf16", 1, "fp32", True),
           Attention("attention: core", 1, 16, 4096, 4096, 128, 2, 0.5),
           Memory("ln1", "norm", 16.8e6, 16.8e6)]
CHANGED = {"m": 4097, "n": 2049, "k": 7169, "dtype": "fp32", "count": 2, "out_dtype": "bf16", "accumulate": False,
           "b": 2, "h": 8, "s_q": 2048, "s_k": 2048, "d": 64, "passes": 5, "fraction": 1.0, "impl": "unfused",
           "op": "residual", "read": 1e6, "written": 2e6}


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda k: k.kind)
def test_a_kernels_timing_key_ignores_its_name_and_nothing_else(kernel):
    assert replace(kernel, name="another name").timing_key == kernel.timing_key
    for f in fields(kernel):
        if f.name != "name":
            assert replace(kernel, **{f.name: CHANGED[f.name]}).timing_key != kernel.timing_key, f.name


def test_the_timer_gives_each_kernel_its_own_seconds_whatever_timed_before():
    cluster = cluster_preset("h100", nodes=1)
    timer = Timer(cluster, ParallelDims(dp=8), stack_preset("megatron-core"))
    device = cluster.device
    assert isinstance(device, Device)
    for kernel in KERNELS:
        renamed = replace(kernel, name="expert 7")
        launch = timer.stack.launch if kernel.kind == "memory" else 0.0
        assert timer.op(kernel, 0) == timer.op(renamed, 3) == device.time(kernel) + launch
    small, big = KERNELS[0], replace(KERNELS[0], m=8 * KERNELS[0].m)
    assert timer.op(small, 0) < timer.op(big, 0) == device.time(big)



@pytest.mark.parametrize("dims", [ParallelDims(dp=2, ep=2), ParallelDims(dp=2, tp=4, ep=2, sequence_parallel=True)],
                         ids=["ep", "tp-overlapped"])
def test_a_pass_timed_from_its_kept_steps_sums_as_item_by_item(dims):
    """The timer reads a pass's items once per device and stack: asked again it must give the
    same sums, those of the items timed one by one where nothing overlaps, and a pass that
    differs in its GEMMs must not be given the first pass's seconds."""
    from emulator.planner import model_preset
    from emulator.planner.layers import rank_layers
    from emulator.planner.precision_of import plan_context

    timer = Timer(cluster_preset("h100", nodes=2), dims, stack_preset("megatron-core"))
    block, = rank_layers(model_preset("mixtral-8x22b"), dims, 1, 4096, plan_context(), ["blocks.0"])
    ops = block.ops["F"]
    first = timer.categories(ops, 0)
    assert timer.categories(ops, 0) == first
    if dims.tp == 1:  # no Transformer Engine pairs: each kernel's seconds, added in order
        for kind in ("gemm", "memory", "attention"):
            expected = 0.0
            for o in ops:
                if getattr(o, "kind", None) == kind:
                    expected += timer.op(o, 0)
            assert first[kind] == expected, kind
    grown = tuple(replace(o, m=2 * o.m) if getattr(o, "kind", None) == "gemm" else o for o in ops)
    assert timer.categories(grown, 0)["gemm"] > first["gemm"]
