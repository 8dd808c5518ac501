"""One declaration of each module's work, two readers: the kernels the emulator charges as a
run goes (``world.charged``) are the ones the planner sums, kernel class by kernel class;
and a module whose code and declaration disagree fails at once."""

from collections import defaultdict

import numpy as np
import pytest

from emulator import World, nn
from emulator.engine.charging import WorkMismatch
from emulator.machine import elementwise
from emulator.parallel import ParallelDims as D
from emulator.parallel.tp_block import TensorParallelBlock
from emulator.planner import ModelSpec, cluster_preset, run_plan
from emulator.planner.layers import rank_layers, split_names
from emulator.planner.precision_of import plan_context

DENSE = ModelSpec(8, 256, 8, 1024, 2048)
GQA = ModelSpec(8, 256, 8, 768, 2048, n_kv_heads=2, mlp="swiglu")
MOE = ModelSpec(4, 256, 8, 512, 2048, mlp="swiglu", n_experts=8, top_k=2)
PLANS = [
    (DENSE, D(dp=2, tp=2, sequence_parallel=True), "megatron-core"),
    (DENSE, D(tp=2, pp=2, micro_batches=4, recompute="full"), "megatron-core"),
    (GQA, D(pp=2, dp=2, v=2, micro_batches=4, schedule="interleaved_1f1b", zero_stage=1), "megatron-core"),
    (GQA, D(tp=2, dp=2, sequence_parallel=True, recompute="selective"), "megatron-2021"),
    (GQA, D(tp=2, dp=2, sequence_parallel=True), "pytorch-eager"),
    (DENSE, D(cp=2, dp=2, zero_stage=3), "pytorch-compile"),
    (MOE, D(dp=4, ep=4), "megatron-core"),
    (GQA, D(dp=2, zero_stage=3, recompute="op"), "pytorch-eager"),  # torchtitan's per-op checkpointing
    (GQA, D(tp=2, dp=2, sequence_parallel=True, recompute="op"), "pytorch-compile"),
    (DENSE, D(tp=2, pp=2, micro_batches=4, recompute="op"), "pytorch-eager"),  # GELU; tp without SP: all-reduces again
]


@pytest.fixture(autouse=True)
def fresh_declarations():
    """Declarations are kept per shape: a test that changes how they are built starts and
    ends with none kept."""
    from emulator.parallel.tp_block import declared_block

    declared_block.cache_clear()
    yield
    declared_block.cache_clear()


def _totals(kernels):
    out = defaultdict(float)
    for k in kernels:
        kind = f"attention:{k.impl}" if k.kind == "attention" else k.kind  # the fused kernel the stack runs
        out[(kind, "flops")] += k.flops
        out[(kind, "bytes")] += k.nbytes
        out[(kind, "count")] += 1
    return out


def charged(world, rank):
    return _totals(k for _, passes in world.charged[rank] for _, kernels in passes for k in kernels)


def declared(model, dims, stack, seq, batch, rank):
    """What the planner sums for pipeline rank ``rank``: every chunk's layers, each pass as
    often as the schedule runs it, and the optimizer's update."""
    ctx = plan_context(stack)
    m = model.with_seq(seq)
    b = batch // (dims.dp * dims.micro_batches)
    names = split_names(m.n_layers, dims.pp * dims.v)
    from emulator.parallel.pipeline.actions import stage_of
    items = []
    for c in range(dims.v):
        mine = names[stage_of(dims.pp, rank, c)]
        for x in rank_layers(m, dims, b, seq, ctx, mine):
            passes = ["F", "B", "W"] + (["F0"] if dims.recompute == "full" else [])
            for p in passes:
                for item in x.ops[p]:
                    kernels = [k for ks, _ in item.steps for k in ks] if hasattr(item, "steps") else [item]
                    items += [k for k in kernels if hasattr(k, "kind")] * dims.micro_batches
    return items


@pytest.mark.parametrize("model,dims,stack", PLANS, ids=[f"{s}:{d}" for _, d, s in PLANS])
def test_a_shape_only_run_charges_what_the_planner_sums(model, dims, stack):
    seq, batch = 256, 8 * dims.dp * dims.micro_batches
    g = min(4, dims.world_size)
    pr = run_plan(model, cluster_preset("h100", nodes=dims.world_size // g, gpus_per_node=g), dims, seq, batch * seq,
                  stack=stack)
    want = _totals(declared(model, dims, stack, seq, batch, 0))
    got = charged(pr.run.world, 0)
    opt = [k for name, passes in pr.run.world.charged[0] if name == "optimizer step" for _, ks in passes for k in ks]
    for key, v in _totals(opt).items():  # the update: one kernel per step, declared by the strategy
        got[key] -= v
    assert set(got) == set(want)
    for key in want:
        assert got[key] == pytest.approx(want[key], rel=1e-12), key


def test_every_kernel_a_run_charges_is_declared_and_every_declared_one_charged(monkeypatch):
    """Take a kernel out of the declaration, or add one it never charges: the pass fails,
    naming it."""
    params = nn.TransformerBlock(32, 4, 128).init(np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((2, 8, 32))

    def prog(comm):
        blk = TensorParallelBlock(comm, 32, 4, 128)
        return blk.forward(blk.shard(params), x)

    World(2).run(prog)  # as declared: fine
    real = elementwise.bias_dropout_add

    def extra(*a, **k):
        return real(*a, **k) + (elementwise._m("a kernel no code charges", "residual", 1.0, 1.0),)

    from emulator.parallel.tp_block import declared_block

    monkeypatch.setattr(elementwise, "bias_dropout_add", extra)
    declared_block.cache_clear()
    with pytest.raises(WorkMismatch, match="never charged"):
        World(2).run(prog)
    monkeypatch.setattr(elementwise, "bias_dropout_add", lambda *a, **k: ())
    declared_block.cache_clear()
    with pytest.raises(WorkMismatch, match="does not list"):
        World(2).run(prog)


def test_a_collective_the_declaration_does_not_list_fails_the_pass(monkeypatch):
    from emulator.parallel.tensor_parallel import attention, mlp, regions_work

    params = nn.TransformerBlock(32, 4, 128).init(np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((2, 8, 32))

    def prog(comm):
        blk = TensorParallelBlock(comm, 32, 4, 128)
        return blk.forward(blk.shard(params), x)

    monkeypatch.setattr(regions_work, "region_reduce", lambda s, ctx, part: ())  # the all-reduces left out
    monkeypatch.setattr(attention, "region_reduce", lambda s, ctx, part: ())
    monkeypatch.setattr(mlp, "region_reduce", lambda s, ctx, part: ())
    with pytest.raises(WorkMismatch, match="declared collectives"):
        World(2).run(prog)


def test_data_runs_charge_the_declared_shapes_and_the_bytes_they_send():
    """A data run (float64, every number as its arrays hold it) charges the declaration of
    its shapes: the GEMMs' (m, n, k), and each collective the engine charged carries the
    declared bytes (the pass checks them as it closes)."""
    model = nn.GPT(64, 32, 4, 64, 2, 8, dtype=np.float64)
    from emulator.parallel import run_on_mesh
    from emulator.training import synthetic_batches

    run = run_on_mesh(model, model.init(np.random.default_rng(0)), synthetic_batches(1, 4, 8, 64),
                      D(tp=2, dp=2, sequence_parallel=True), nn.AdamW())
    gemms = {(k.m, k.n, k.k) for _, passes in run.world.charged[0] for _, ks in passes for k in ks if k.kind == "gemm"}
    rows = 2 * 8  # a replica's 2 sequences of 8 positions, gathered
    assert (rows, (4 // 2 + 2 * 4 // 2) * 8, 32) in gemms  # q, k, v: this rank's 2 of 4 heads, 8 wide
    assert (rows, 32, 64 // 2) in gemms  # fc2: this rank's half of d_ff
    calls = [c for c in run.world.calls[0] if c.group == "tp"]
    assert calls and all(c.nbytes % 8 == 0 for c in calls)  # float64 payloads, as the arrays
