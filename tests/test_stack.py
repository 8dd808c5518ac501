"""Software stacks as data: each preset's settings carry their sources (every number equal to
the number its quote gives), the presets differ in the kernels they run, not by a factor,
and a name that is not a stack is refused with the ones that are."""

import re
from dataclasses import fields, replace

import pytest

from emulator import ConfigError
from emulator.machine import stack_sources
from emulator.machine.stack import FUSIONS, Stack, context, stack_preset
from emulator.parallel.layer_shape import LayerShape
from emulator.parallel.tp_block import block_work
from emulator.planner import cluster_preset, evaluate, model_preset
from emulator.parallel import ParallelDims

NAMES = ("megatron-core", "megatron-2021", "pytorch-eager", "pytorch-compile")
LLAMA_BLOCK = LayerShape(1, 4096, 4096, 32, 8, 14336, 128256, mlp="swiglu", bias=False, norm="rmsnorm", rope=True,
                         tp=2, sp=True)


def _numbers(text):
    return [float(x.replace(",", "")) for x in re.findall(r"\d[\d,]*\.?\d*(?:e-?\d+)?", text)]


@pytest.mark.parametrize("name", NAMES)
def test_every_setting_has_a_source_and_every_number_its_quote(name):
    stack = stack_preset(name)
    assert stack.name == name and stack.sources
    for key, src in stack.sources.items():
        assert src.quote and src.repo, key
        if src.value is not None:
            assert src.value in _numbers(src.quote), (key, src.value, src.quote)
    # the numbers the stack uses are its sources' values (in the setting's units)
    from emulator.parallel.tp_regions import PIPELINE_SPLITS

    numbers = {"bucket": stack.bucket.minimum, "bucket.per_rank": stack.bucket.per_rank,
               "bucket.first": stack.bucket.first, "tp_overlap_sms": stack.tp_overlap_sms,
               "tp_overlap_splits": PIPELINE_SPLITS, "dispatch": stack.dispatch, "launch": stack.launch}
    for key, src in stack.sources.items():
        if src.value is not None:
            assert key in numbers, (name, key)
            assert numbers[key] == pytest.approx(src.value * src.scale), (name, key, numbers[key], src.value)
    for fusion in stack.fused:  # each fusion it has is sourced
        assert f"fused.{fusion}" in stack.sources, (name, fusion)


def test_each_numeric_setting_of_the_presets_is_checked_against_a_quote():
    checked = {(n, k) for n in NAMES for k, s in stack_preset(n).sources.items() if s.value is not None}
    assert ("megatron-core", "bucket") in checked and ("megatron-core", "tp_overlap_sms") in checked
    assert ("pytorch-eager", "bucket") in checked and ("pytorch-eager", "dispatch") in checked
    assert stack_sources.MEGATRON_CORE["bucket"].value == 40_000_000


def test_the_presets_differ_in_the_kernels_they_run():
    works = {n: block_work(LLAMA_BLOCK, context(n)) for n in NAMES}
    names = {n: [k.name for k in w.kernels()] for n, w in works.items()}
    # the 2021 code: attention's scores as batched GEMMs in HBM, softmax and its backward apart
    assert any("scores Q K^T" in x for x in names["megatron-2021"])
    assert any("softmax backward" in x for x in names["megatron-2021"])
    assert not any("scores" in x for x in names["megatron-core"])
    assert {k.kind for k in works["megatron-core"].kernels("forward")} >= {"attention"}
    # eager torch: the activation's and RoPE's ops each a kernel, q, k, v three GEMMs
    for ops in ("mlp: activation: silu(gate)", "mlp: activation: * up", "attention: rope q: .float()",
                "attention: qkv: q"):
        assert ops in names["pytorch-eager"] and ops not in names["megatron-core"], ops
    assert len(works["pytorch-eager"].kernels()) > len(works["pytorch-compile"].kernels()) > 0
    assert len(works["pytorch-eager"].kernels()) > len(works["megatron-core"].kernels())
    # fused weight-gradient accumulation (Megatron) against an add into the gradient buffer (eager)
    assert any(k.name.endswith("accumulate") for k in works["pytorch-eager"].kernels("backward_weight"))
    assert not any(k.name.endswith("accumulate") for k in works["megatron-core"].kernels("backward_weight"))


def test_the_torch_stacks_run_flashattention_2_and_megatron_cudnns_kernel():
    """PyTorch's SDPA runs FlashAttention-2 (its flash backend): on H100 about half the rate
    of cuDNN's fused attention, which Transformer Engine prefers there (FlashAttention-2's
    Fig. 7 against FlashAttention-3's Fig. 5 and 6), and a little below FA3's; on A100 FA2
    is the fused kernel every stack runs."""
    from emulator.machine.device import Device

    kinds = {n: {k.impl for k in block_work(LLAMA_BLOCK, context(n)).kernels() if k.kind == "attention"}
             for n in NAMES if stack_preset(n).attention == "flash"}
    assert kinds == {"megatron-core": {"cudnn"}, "pytorch-eager": {"flash2"}, "pytorch-compile": {"flash2"}}
    assert "TransformerEngine" in stack_preset("megatron-core").sources["flash_kernel"].repo
    h100, a100 = Device.h100(), Device.a100()
    core, eager = (next(k for k in block_work(LLAMA_BLOCK, context(n)).kernels("forward") if k.kind == "attention")
                   for n in ("megatron-core", "pytorch-eager"))
    fa3 = replace(core, impl="flash")
    assert 1.4 < h100.time(eager) / h100.time(core) < 2.0
    assert 1.02 < h100.time(core) / h100.time(fa3) < 1.2  # cuDNN a little slower than FA3 at 8k tokens
    assert a100.time(eager) == a100.time(core) == a100.time(fa3)
    m, c = model_preset("llama3-8b"), cluster_preset("h100", nodes=1)
    dims = ParallelDims(dp=8, zero_stage=3)
    attention = {s: evaluate(m, c, dims, 8192, 16 * 8192, stack=stack_preset("pytorch-eager").replace(flash_kernel=s))
                 .breakdown["attention"] for s in ("flash", "flash2")}
    assert attention["flash2"] > 1.5 * attention["flash"]
    assert evaluate(m, c, dims, 8192, 16 * 8192, stack="pytorch-eager").as_dict()["attention_kernel"] == "flash2"
    with pytest.raises(ConfigError, match="flash_kernel"):
        stack_preset().replace(flash_kernel="fa4")
    from emulator.machine.work import Attention
    with pytest.raises(ConfigError, match="unknown attention kernel 'fa4'; known: flash, flash2, cudnn"):
        h100.time(Attention("core", 1, 8, 1024, 1024, 128, 2, 1.0, "bf16", "fa4"))


def test_the_lessons_ring_attention_charges_the_stacks_kernel(monkeypatch):
    """ring_attention outside a declared pass (as lesson 04 calls it) times each block as the
    run's stack runs it: FA2 under the PyTorch stacks, slower on H100 than Megatron's."""
    import numpy as np

    from emulator import Topology, World
    from emulator.machine.device import Device
    from emulator.parallel.context_parallel.ring import ring_attention

    q = np.random.default_rng(0).standard_normal((1, 4, 2048, 128)).astype(np.float32)
    timed, time = [], Device.time

    def recording(self, kernel):
        if kernel.kind == "attention":
            timed.append(kernel.impl)
        return time(self, kernel)

    monkeypatch.setattr(Device, "time", recording)

    def clock(stack):
        def prog(comm):
            rows = slice(comm.rank * 1024, (comm.rank + 1) * 1024)
            ring_attention(comm, q[..., rows, :], q[..., rows, :], q[..., rows, :], causal=True)
            return comm.now
        timed.clear()
        end = max(World(2, topology=Topology.h100(device=Device.h100()), stack=stack).run(prog))
        return end, set(timed)

    (core, core_impls), (eager, eager_impls) = clock("megatron-core"), clock("pytorch-eager")
    assert core_impls == {"cudnn"} and eager_impls == {"flash2"}
    assert eager > core


def test_a_plan_costs_more_on_the_stacks_that_fuse_less():
    m, c = model_preset("llama3-8b"), cluster_preset("h100", nodes=1)
    dims = ParallelDims(dp=2, tp=4, sequence_parallel=True, micro_batches=4)
    times = {n: evaluate(m, c, dims, 4096, 8 * 4096 * 2, stack=n).step_time for n in NAMES}
    assert times["pytorch-eager"] > times["pytorch-compile"]
    assert times["pytorch-eager"] > times["megatron-core"]


def test_unknown_stacks_and_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="megatron-core, megatron-2021, pytorch-eager, pytorch-compile"):
        stack_preset("jax")
    with pytest.raises(ConfigError, match="unknown software stack"):
        evaluate(model_preset("llama3-8b"), cluster_preset("h100"), ParallelDims(dp=8), 4096, 8 * 4096,
                 stack="deepspeed")
    base = stack_preset()
    with pytest.raises(ConfigError, match="attention"):
        base.replace(attention="sparse")
    with pytest.raises(ConfigError, match="fused"):
        base.replace(fused=frozenset({"everything"}))
    with pytest.raises(ConfigError, match="dispatch"):
        base.replace(dispatch=-1.0)
    assert set(FUSIONS) >= set().union(*(stack_preset(n).fused for n in NAMES))
    assert {f.name for f in fields(Stack)} >= {"precision", "attention", "fused", "grad_overlap", "bucket",
                                                "param_gather_overlap", "fsdp_prefetch", "tp_comm_overlap",
                                                "launch", "dispatch"}


def test_the_contention_beside_nccl_is_the_published_average():
    from emulator.machine import comm_overlap

    assert comm_overlap.NCCL_CONTENTION == 0.189
    assert "an average computational slowdown of 18.9%" in " ".join(comm_overlap.__doc__.split())


def test_under_sequence_parallelism_pytorch_keeps_the_gathered_input_and_megatron_gathers_it_again():
    """torchtitan's TP plan hands the attention and the MLP their input redistributed whole
    (an all-gather), and autograd keeps what the matrix multiply read; Megatron keeps its
    slice and all-gathers it again for the weight gradients."""
    import numpy as np

    from emulator import World, nn
    from emulator.parallel.tp_block import TensorParallelBlock
    from emulator.planner.layers import rank_layers
    from emulator.planner.models import ModelSpec
    from emulator.planner.precision_of import plan_context

    d, a, ff, b, s, t = 32, 8, 64, 2, 8, 2
    P = nn.TransformerBlock(d, a, ff, mlp="swiglu").init(np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((b, s, d)).astype(np.float32)
    model = ModelSpec(1, d, a, ff, 64, mlp="swiglu")
    dims = ParallelDims(tp=t, sequence_parallel=True)
    for name, gathers, full in (("megatron-core", 2, False), ("pytorch-eager", 0, True)):
        def prog(comm):
            tb = TensorParallelBlock(comm, d, a, ff, sequence_parallel=True, mlp="swiglu")
            y, c = tb.forward(tb.shard(P), x[:, comm.rank * s // t:(comm.rank + 1) * s // t])
            held = nn.cache_bytes(c)
            tb.backward(tb.shard(P), c, y)
            return held

        w = World(t, stack=name)
        held = w.run(prog)[0]
        layer = rank_layers(model.with_seq(s), dims, b, s, plan_context(name, param_bytes=4), ["blocks.0"])[0]
        again = [x.name for x in layer.ops["W"] if "again" in x.name]
        assert len(again) == gathers, (name, again)
        assert held["attention.q, k, v projections' input"] == b * s * d * 4 // (1 if full else t), name
        assert sum(held.values()) == pytest.approx(layer.kept, rel=1e-12), name
        backward = [c.op for c in w.calls[0]][4:]  # after the forward's two all-gathers and two reduce-scatters
        assert backward.count("all_gather") == 2 + gathers, (name, backward)
