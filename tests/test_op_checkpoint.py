"""torchtitan's per-op selective checkpointing (``recompute="op"``): the rule read off a
block's declaration; the tensor-parallel block under it equal to the single-device block;
what it keeps equal to what the planner counts; in backward the kept ops replayed (not
computed, not charged, their reduce-scatters not sent again); the plans it cannot run
refused by name."""

import numpy as np
import pytest

from emulator import ConfigError, World, nn
from emulator.engine.charging import WorkMismatch
from emulator.machine.stack import stack_preset
from emulator.parallel.attention_cores import RingCore
from emulator.parallel import ParallelDims
from emulator.parallel.tensor_parallel import op_checkpoint
from emulator.parallel.tp_block import TensorParallelBlock
from emulator.planner import ModelSpec, cluster_preset, evaluate
from emulator.planner.layers import rank_layers
from emulator.planner.precision_of import plan_context

D, A, KV, FF, B, S = 32, 8, 4, 48, 2, 8
LLAMA = ModelSpec(4, 256, 8, 768, 2048, n_kv_heads=2, mlp="swiglu", positions="rope", norm="rmsnorm", bias=False)


@pytest.fixture(autouse=True)
def fresh_declarations():
    from emulator.parallel.tp_block import declared_block

    declared_block.cache_clear()
    yield
    declared_block.cache_clear()


def _names(items):
    return [x.name for x in items]


def block_ops(dims, stack="pytorch-eager", model=LLAMA):
    return rank_layers(model.with_seq(512), dims, 2, 512, plan_context(stack), ["blocks.0"])[0]


def test_every_second_gemm_of_a_llama_block_runs_again_and_the_attention_kernel_is_kept():
    kept, again = op_checkpoint.split_forward(block_ops(ParallelDims(recompute="op")).ops["F"])
    # wq, wk, wv, wo, w1, w3, w2 in torchtitan's order: the 1st, 3rd, 5th and 7th kept
    assert _names(kept) == ["attention: qkv: q", "attention: qkv: v", "attention: core", "mlp: fc1: gate", "mlp: fc2"]
    assert {"attention: qkv: k", "attention: output projection", "mlp: fc1: up"} <= set(_names(again))
    assert all(x.kind == "memory" for x in again if x.kind != "gemm")  # norms, RoPE, SiLU, *, adds: all again
    sp = block_ops(ParallelDims(tp=2, sequence_parallel=True, recompute="op"))
    kept, again = op_checkpoint.split_forward(sp.ops["F"])
    comms = [(x.name, x.op) for x in kept if not hasattr(x, "kind")]
    assert comms == [("attention: reduce output", "reduce_scatter"), ("mlp: reduce output", "reduce_scatter")]
    assert sorted(x.op for x in again if not hasattr(x, "kind")) == ["all_gather", "all_gather"]


def test_backward_runs_the_unkept_ops_first_and_the_planner_times_them():
    none, op, full = (block_ops(ParallelDims(recompute=r)) for r in ("none", "op", "full"))
    again = op_checkpoint.split_forward(op.ops["F"])[1]
    assert op.ops["B"][:len(again)] == again and op.ops["B"][len(again):] == none.ops["B"]
    assert op.ops["F0"] == again
    cluster = cluster_preset("h100", nodes=1, gpus_per_node=8)
    t = {r: evaluate(LLAMA, cluster, ParallelDims(dp=8, zero_stage=3, recompute=r, micro_batches=2), 4096,
                     8 * 4 * 4096, stack="pytorch-eager") for r in ("none", "op", "full")}
    assert t["none"].step_time < t["op"].step_time < t["full"].step_time
    mem = {r: t[r].stage_memory[0][0] for r in t}
    assert mem["full"] < mem["op"] < mem["none"]
    assert full.input < op.kept < none.kept


def run_block(t, sp, recompute, P, x, dy, stack="pytorch-eager", kind="swiglu", act=np.float64):
    def prog(comm):
        tb = TensorParallelBlock(comm, D, A, FF, sequence_parallel=sp, act_dtype=act, recompute=recompute,
                                 n_kv_heads=KV, mlp=kind)
        p = tb.shard(P)
        sl = slice(comm.rank * S // t, (comm.rank + 1) * S // t) if sp else slice(None)
        y, c = tb.forward(p, x[:, sl])
        held = nn.cache_bytes(c)
        dx, g = tb.backward(p, c, dy[:, sl])
        return y, dx, g, tb, held

    w = World(t, stack=stack)
    out = w.run(prog)
    cat = (lambda i: np.concatenate([o[i] for o in out], axis=1)) if sp else (lambda i: out[0][i])
    return w, out, cat(0), cat(1)


@pytest.mark.parametrize("t,sp", [(1, False), (2, False), (2, True), (4, True)])
@pytest.mark.parametrize("kind", ["swiglu", "gelu"])
def test_equals_the_single_device_block(t, sp, kind):
    blk = nn.TransformerBlock(D, A, FF, n_kv_heads=KV, mlp=kind, dtype=np.float64)
    P = blk.init(np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((B, S, D))
    y_ref, cache = blk.forward(P, x)
    dy = np.random.default_rng(2).standard_normal(y_ref.shape)
    dx_ref, g_ref = blk.backward(P, cache, dy)
    w, out, y, dx = run_block(t, sp, "op", P, x, dy, kind=kind)
    assert np.allclose(y, y_ref) and np.allclose(dx, dx_ref)
    for _, _, g, tb, _ in out:
        want = tb.shard(g_ref)
        assert all(np.allclose(g[k], want[k]) for k in want), [k for k in want if not np.allclose(g[k], want[k])]
    ops = [c.op for c in w.calls[0]]
    if sp:  # the forward's all-gathers run again in backward, its reduce-scatters are replayed, not sent; the
        # weight gradients read the input gathered again there (PyTorch's autograd keeps it: no third gather)
        forward = ["all_gather", "reduce_scatter"] * 2
        backward = ["all_gather", "reduce_scatter"] * 2  # the output gradient gathered, the input's scattered
        assert ops == forward + ["all_gather", "all_gather"] + backward + ["all_reduce"]
    elif t > 1:  # torchtitan's list keeps no all-reduce: both run again
        assert ops == ["all_reduce"] * 6


@pytest.mark.parametrize("t,sp", [(1, False), (2, True)])
def test_it_keeps_what_the_planner_counts(t, sp):
    P = nn.TransformerBlock(D, A, FF, n_kv_heads=KV, mlp="swiglu").init(np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((B, S, D)).astype(np.float32)
    _, out, _, _ = run_block(t, sp, "op", P, x, x, act=np.float32)
    _, ref, _, _ = run_block(t, sp, "none", P, x, x, act=np.float32)
    model = ModelSpec(1, D, A, FF, 64, n_kv_heads=KV, mlp="swiglu")
    layer = rank_layers(model.with_seq(S), ParallelDims(tp=t, sequence_parallel=sp, recompute="op"), B, S,
                        plan_context("pytorch-eager", param_bytes=4), ["blocks.0"])[0]
    held = sum(out[0][4].values())
    assert held == pytest.approx(layer.kept, rel=1e-12)
    assert held < sum(ref[0][4].values())
    names = set(out[0][4])
    assert "layer input" in names and any(n.startswith("kept ops.attention: core") for n in names)


def test_a_replay_that_computes_again_fails_the_pass(monkeypatch):
    """Without the replay (the kept ops computed and charged again), the pass charges what
    its declaration does not list, and fails."""
    P = nn.TransformerBlock(D, A, FF, n_kv_heads=KV, mlp="swiglu", dtype=np.float64).init(np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((B, S, D))
    real = op_checkpoint.SavedOps.__call__

    def no_replay(self, name, compute, save=None, restore=None):
        return compute() if self.replaying else real(self, name, compute, save, restore)

    monkeypatch.setattr(op_checkpoint.SavedOps, "__call__", no_replay)
    with pytest.raises(WorkMismatch, match="attention: core"):
        run_block(1, False, "op", P, x, x)


def test_a_kept_op_the_forward_never_runs_fails_the_forward(monkeypatch):
    P = nn.TransformerBlock(D, A, FF, n_kv_heads=KV, mlp="swiglu", dtype=np.float64).init(np.random.default_rng(0))
    x = np.random.default_rng(1).standard_normal((B, S, D))
    split = op_checkpoint.split_forward
    from emulator.machine.work import Gemm

    def one_more(forward):
        kept, again = split(forward)
        return kept + (Gemm("attention: qkv: z", 1, 1, 1),), again

    monkeypatch.setattr("emulator.parallel.tensor_parallel.block.split_forward", one_more)
    with pytest.raises(WorkMismatch, match="qkv: z"):
        run_block(1, False, "op", P, x, x)


@pytest.mark.parametrize("stack,dims,why", [
    ("megatron-core", ParallelDims(dp=8, recompute="op"), "no per-op checkpointing"),
    ("pytorch-eager", ParallelDims(dp=4, cp=2, recompute="op"), "context parallelism"),
    (stack_preset("megatron-core").replace(op_checkpoint=True), ParallelDims(dp=8, recompute="op"), "fuses q, k, v"),
])
def test_plans_it_cannot_run_are_refused_by_name(stack, dims, why):
    cluster = cluster_preset("h100", nodes=1, gpus_per_node=8)
    est = evaluate(LLAMA, cluster, dims, 4096, 8 * 4096, stack=stack)
    assert est.step_time is None and any(why in p and p.startswith("recompute='op'") for p in est.problems)
    wrong_size = evaluate(LLAMA, cluster_preset("h100", nodes=2), dims, 4096, 16 * 4096, stack=stack)
    assert len(wrong_size.problems) >= 2 and any(why in p for p in wrong_size.problems)  # every problem at once
    with pytest.raises(ConfigError, match=why):
        World(dims.cp, stack=stack).run(lambda comm: TensorParallelBlock(  # (a ring over cp ranks as its core)
            comm, D, A, FF, recompute="op", core=None if dims.cp == 1 else RingCore(comm)))
    moe = ModelSpec(4, 256, 8, 512, 2048, mlp="swiglu", n_experts=8, top_k=2)
    est = evaluate(moe, cluster, ParallelDims(dp=8, ep=8, recompute="op"), 4096, 8 * 4096, stack="pytorch-eager")
    assert any("experts" in p for p in est.problems)


def test_a_torch_lab_cuts_the_same_shards_whatever_it_recomputes():
    P = nn.TransformerBlock(D, A, FF, n_kv_heads=KV, mlp="swiglu").init(np.random.default_rng(0))
    shards = [TensorParallelBlock.shard_for(P, 1, 2, D, A, FF, n_kv_heads=KV, mlp="swiglu", recompute=r)
              for r in ("none", "op")]
    assert shards[0].keys() == shards[1].keys() and all(np.array_equal(shards[0][k], shards[1][k]) for k in shards[0])


@pytest.mark.parametrize("dims", [ParallelDims(dp=2, tp=2, pp=2, micro_batches=2, zero_stage=3, sequence_parallel=True,
                                               recompute="op"),
                                  ParallelDims(tp=2, pp=2, micro_batches=2, schedule="zb_h1", recompute="op")])
def test_a_mesh_run_with_it_equals_one_device(dims):
    """run_on_mesh with per-op checkpointing (two steps of AdamW) against train_single."""
    from emulator.parallel import run_on_mesh
    from emulator.training import synthetic_batches, train_single

    model = nn.GPT(16, 16, 4, 32, 4, 8, dtype=np.float64, n_kv_heads=2, mlp="swiglu")
    params = model.init(np.random.default_rng(0))
    batches = synthetic_batches(2, 4 * dims.dp, 8, model.vocab, seed=1)
    run = run_on_mesh(model, params, batches, dims, nn.AdamW(lr=1e-2), stack="pytorch-eager")
    ref, ref_losses = train_single(model, params, batches, nn.AdamW(lr=1e-2), micro_batches=dims.dp * dims.micro_batches)
    assert np.allclose(run.losses, ref_losses, rtol=0, atol=1e-12)
    assert all(np.allclose(run.params[k], ref[k], rtol=1e-9, atol=1e-12) for k in ref)
    again = [[k.name for k in kernels] for what, passes in run.world.charged[0] if "backward" in what
             for name, kernels in passes if name == "attention: qkv"]
    assert again and all(names == ["attention: qkv: k"] for names in again)  # backward ran wk again, only wk
