"""The planner against the emulator: each rank's memory within 3% of its ledger's peak and
the step within 10% of the timeline, over plans with every axis, every ZeRO stage, every
schedule and every recomputation mode; the pieces it is made of against the emulator's
own (ring collective times, all-to-all times, groups, ring attention's blocks); its model
presets; long pipelines extended exactly; the comm table's exposed seconds (its problems in
words: tests/test_planner_problems.py; the search and the command line:
tests/test_planner_search.py)."""

import numpy as np
import pytest

from emulator import ConfigError
from emulator.cost import collective_time
from emulator.machine.topology import Topology
from emulator.parallel import ParallelDims as D
from emulator.parallel.context_parallel.ring import blocks, step_blocks
from emulator.planner import ModelSpec, cluster_preset, evaluate, inventory, model_preset, run_plan
from emulator.planner.layers import _busiest_cp_rank
from emulator.machine.stack import stack_preset
from emulator.planner.collective_times import ring_collective_time
from emulator.planner.timer import Timer


DENSE = ModelSpec(8, 256, 8, 1024, 2048)
GQA = ModelSpec(8, 256, 8, 768, 2048, n_kv_heads=2, mlp="swiglu")
MOE = ModelSpec(4, 256, 8, 512, 2048, mlp="swiglu", n_experts=8, top_k=2)
SMALL = ModelSpec(4, 64, 4, 256, 512)

SHAPE_ONLY = [  # bf16, mixed-precision Adam, the real programs without values
    (DENSE, D(dp=8)),
    (DENSE, D(dp=4, zero_stage=3)),
    (DENSE, D(dp=2, zero_stage=2, micro_batches=2)),
    (DENSE, D(tp=4, dp=2, sequence_parallel=True)),
    (DENSE, D(tp=4, dp=2, recompute="selective")),
    (DENSE, D(pp=4, micro_batches=8, schedule="gpipe")),
    (DENSE, D(pp=4, dp=2, micro_batches=8, schedule="zb_h1")),
    (DENSE, D(pp=2, dp=2, v=2, micro_batches=4, schedule="interleaved_1f1b")),
    (DENSE, D(pp=2, tp=2, dp=2, micro_batches=4, recompute="full", sequence_parallel=True)),
    (DENSE, D(cp=4, dp=2, cp_attention="ulysses")),
    (GQA, D(tp=2, pp=2, dp=2, micro_batches=4, zero_stage=1, sequence_parallel=True)),
    (GQA, D(pp=2, dp=2, micro_batches=4, zero_stage=3, schedule="zb_h1", recompute="selective")),
    (MOE, D(dp=4, ep=4)),
    (MOE, D(dp=4, ep=2, tp=2, zero_stage=1, sequence_parallel=True)),
    # a split backward holds what B leaves for W: the output gradients, and the cache rebuilt under recomputation
    (DENSE, D(pp=2, tp=2, dp=2, micro_batches=4, sequence_parallel=True, recompute="full", schedule="zb_h1")),
    (MOE, D(pp=2, dp=2, ep=2, micro_batches=4, schedule="zb_h1")),
]
PYTORCH = [  # a PyTorch stack: torchtitan's per-op checkpointing, the gathered input kept under SP
    (GQA, D(dp=4, zero_stage=3, recompute="op")),
    (GQA, D(tp=2, dp=4, sequence_parallel=True, recompute="op")),
    (DENSE, D(pp=2, tp=2, dp=2, micro_batches=4, zero_stage=1, recompute="op")),
    (GQA, D(tp=2, dp=4, sequence_parallel=True)),
    (DENSE, D(pp=2, tp=2, dp=2, micro_batches=4, recompute="full", sequence_parallel=True)),
    (GQA, D(pp=2, dp=2, micro_batches=4, zero_stage=3, schedule="zb_h1")),  # the last stage keeps its layers gathered
    (GQA, D(pp=2, tp=2, micro_batches=4, sequence_parallel=True, recompute="op", schedule="zb_h1")),
    (GQA, D(pp=2, dp=2, micro_batches=8, zero_stage=3, schedule="interleaved_1f1b", v=2)),
]
DATA = [  # ring attention runs with data (fp32): the planner in fp32 too
    (SMALL, D(cp=2, tp=2, dp=2, sequence_parallel=True)),
    (SMALL, D(cp=2, pp=2, micro_batches=2, cp_layout="contiguous")),
    (SMALL, D(cp=4, dp=2)),
]
DATA_PYTORCH = [  # what B leaves for W with data: the kept ops B frees must not hide a gradient it keeps
    (SMALL, D(pp=2, dp=2, micro_batches=2, schedule="zb_h1", recompute="op")),
    (SMALL, D(pp=2, tp=2, micro_batches=2, schedule="zb_h1", recompute="op", sequence_parallel=True)),
]


def cluster_for(dims, gpus_per_node=4):
    g = min(gpus_per_node, dims.world_size)
    return cluster_preset("h100", nodes=dims.world_size // g, gpus_per_node=g)


def check_against_emulator(model, dims, seq, batch, shape_only, stack=None):
    pr = run_plan(model, cluster_for(dims), dims, seq, batch * seq, shape_only=shape_only,
                  param_bytes=2 if shape_only else 4, stack=stack)
    est = pr.estimate
    for stage, ((pred, kinds), meas) in enumerate(zip(est.stage_memory, pr.measured_memory())):
        assert abs(pred / meas - 1) < 0.03, f"{dims}: stage {stage} memory {pred:,.0f} predicted, {meas:,.0f} measured"
        led = pr.run.world.memory[pr.representative(stage)]
        assert sum(kinds.values()) == pytest.approx(pred)
        if abs(pred / meas - 1) < 1e-9:  # an exact peak: its parts are the ledger's at that moment
            assert kinds == pytest.approx({k: float(v) for k, v in led.peak_breakdown.items()})
    step = pr.run.step_time()
    assert abs(est.step_time / step - 1) < 0.10, f"{dims}: step {est.step_time:.6f} s predicted, {step:.6f} measured"
    return pr


@pytest.mark.parametrize("model,dims", SHAPE_ONLY, ids=[str(d) for _, d in SHAPE_ONLY])
def test_predictions_match_the_emulator(model, dims):
    pr = check_against_emulator(model, dims, 512, 16, shape_only=True)
    predicted, stage = pr.predicted_sent(), pr.comm_stage()
    measured = {}
    for (axis, _), b in pr.measured_sent(stage).items():
        measured[axis] = measured.get(axis, 0) + b
    assert set(predicted) == set(measured), (predicted, measured)
    for axis in predicted:  # bytes per axis: exact for every collective, within 1% for MoE's routed rows
        assert predicted[axis] == pytest.approx(measured[axis], rel=0.01), axis


@pytest.mark.parametrize("model,dims", PYTORCH, ids=[str(d) for _, d in PYTORCH])
def test_pytorch_stack_predictions_match_the_emulator(model, dims):
    pr = check_against_emulator(model, dims, 512, 16, shape_only=True, stack="pytorch-eager")
    measured = {}
    for (axis, _), b in pr.measured_sent(pr.comm_stage()).items():
        measured[axis] = measured.get(axis, 0) + b
    assert pr.predicted_sent() == pytest.approx(measured, rel=1e-9)  # bytes per axis, every collective exact


@pytest.mark.parametrize("model,dims", DATA, ids=[str(d) for _, d in DATA])
def test_predictions_match_the_emulator_with_data(model, dims):
    check_against_emulator(model, dims, 64, 8, shape_only=False)


@pytest.mark.parametrize("model,dims", DATA_PYTORCH, ids=[str(d) for _, d in DATA_PYTORCH])
def test_pytorch_stack_predictions_match_the_emulator_with_data(model, dims):
    pr = check_against_emulator(model, dims, 64, 8, shape_only=False, stack="pytorch-eager")
    for (pred, _), meas in zip(pr.estimate.stage_memory, pr.measured_memory()):
        assert pred == pytest.approx(meas, rel=2e-3)


def test_a_plan_run_reports_predicted_beside_measured():
    pr = run_plan(DENSE, cluster_for(D(dp=2, tp=2, pp=2)), D(dp=2, tp=2, pp=2, micro_batches=4, zero_stage=1,
                                                                 sequence_parallel=True), 512, 16 * 512)
    rows = {r["quantity"]: r for r in pr.table()}
    assert {"peak memory, stage 0", "peak memory, stage 1", "step time", "pipeline idle share"} <= set(rows)
    assert any(q.startswith("bytes sent, tp") for q in rows) and any(q.startswith("bytes sent, pp") for q in rows)
    assert abs(pr.estimate.bubble - pr.measured_bubble()) < 0.02
    mem, step = pr.worst_errors()
    assert abs(mem) < 0.03 and abs(step) < 0.10


def test_ring_collective_times_equal_the_emulators_closed_form():
    rng = np.random.default_rng(0)
    topologies = [Topology.h100(), Topology.h100(gpus_per_node=4), Topology.a100(),
                  Topology(gpus_per_node=8, nics_per_node=2), Topology(gpus_per_node=8, channels=2)]
    shapes = [(8, 1, 1, 1), (4, 2, 1, 1), (2, 4, 1, 2), (16, 2, 2, 1), (4, 8, 2, 1), (3, 2, 1, 1), (32, 8, 1, 1)]
    for topo in topologies:
        for dp, tp, cp, pp in shapes:
            dims = D(dp=dp, tp=tp, cp=cp, pp=pp)
            for rank in (0, dims.world_size - 1):
                for group in dims.groups_of(rank, topo.gpus_per_node).values():
                    for op in ("all_reduce", "reduce_scatter", "all_gather"):
                        nbytes = float(rng.choice([1e3, 1e6, 3e8]))
                        want = collective_time(op, nbytes, group, topo)
                        assert ring_collective_time(op, nbytes, tuple(group), topo) == pytest.approx(want, rel=1e-12)


def test_groups_and_ring_blocks_are_the_runtimes():
    for dims in (D(dp=4, tp=2, pp=2, cp=2, ep=2), D(dp=2, cp=4, ep=8), D(dp=8, tp=4, pp=4)):
        timer = Timer(cluster_preset("h100", nodes=dims.world_size // 8), dims, stack_preset())
        for r in range(dims.pp):
            rep = r * dims.dp * dims.cp * dims.tp
            shift = rep - rep % 8
            for name, ranks in dims.groups_of(rep, 8).items():
                if name != "pp":
                    assert timer.groups(r)[name] == tuple(x - shift for x in ranks), (dims, r, name)
    for c in (1, 2, 3, 4, 8):
        for layout in ("zigzag", "contiguous"):
            want = tuple(max(sum((q.stop - q.start) * (k.stop - k.start) for q, k, _ in
                                 blocks(rank, (rank - t) % c, c, 8, True, layout)) for rank in range(c))
                         for t in range(c))
            busiest = _busiest_cp_rank(D(cp=c))  # the rank whose ring steps the declared work holds
            got = tuple(sum(q * k for q, k in step) for step in step_blocks(busiest, c, 8, True, layout))
            assert got == want


def test_model_presets_and_specs():
    assert model_preset("llama3-405b").params() == pytest.approx(405.9e9, rel=0.01)
    assert model_preset("gpt3-175b").params() == pytest.approx(175e9, rel=0.03)
    assert model_preset("megatron-h100-462b").params() == pytest.approx(462e9, rel=0.03)
    assert model_preset("megatron-1t").params() == pytest.approx(1008e9, rel=0.03)
    for bad in (dict(n_heads=7), dict(mlp="relu"), dict(n_kv_heads=3), dict(n_experts=2, top_k=3)):
        with pytest.raises(ConfigError, match="ModelSpec"):
            ModelSpec(**{**dict(n_layers=2, d_model=64, n_heads=4, d_ff=128, vocab=100), **bad})
    with pytest.raises(ConfigError, match="no preset 'llama4'"):
        model_preset("llama4")
    with pytest.raises(ConfigError, match="learned position table"):
        model_preset("llama3-8b").to_gpt(4096)
    assert ModelSpec.of(DENSE.to_gpt(512)) == DENSE.replace(max_seq=512)


@pytest.mark.parametrize("dims", [D(pp=4, dp=2, micro_batches=48, zero_stage=1),
                                  D(pp=4, dp=2, micro_batches=48, schedule="interleaved_1f1b", v=2),
                                  D(pp=2, dp=4, micro_batches=40, schedule="zb_h1", zero_stage=3),
                                  D(pp=4, tp=2, micro_batches=36, schedule="gpipe", sequence_parallel=True),
                                  D(pp=8, micro_batches=96, zero_stage=0, recompute="full")])
def test_long_pipelines_are_extended_along_a_line_exactly(dims, monkeypatch):
    """Past 4 micro-batches per stage, the planner plays two lengths and extends the line;
    the whole schedule played gives the same step, bubble and memory."""
    import sys

    c = cluster_for(dims)
    model = GQA if dims.pp <= 4 else ModelSpec(16, 256, 8, 1024, 2048)
    short = evaluate(model, c, dims, 256, dims.dp * dims.micro_batches * 256)
    monkeypatch.setattr(sys.modules["emulator.planner.evaluate"], "steady_cap", lambda p, v=1: 10**6)
    monkeypatch.setattr(sys.modules["emulator.planner.memory"], "walked_micro_batches", lambda p: 10**6)
    whole = evaluate(model, c, dims, 256, dims.dp * dims.micro_batches * 256)
    assert short.step_time == pytest.approx(whole.step_time, rel=1e-9)
    assert short.bubble == pytest.approx(whole.bubble, rel=1e-9)
    assert short.memory_peak == whole.memory_peak
    assert short.stage_memory == whole.stage_memory
    for a, b in zip(short.comm, whole.comm):
        assert a["count"] == b["count"] and a["seconds"] == pytest.approx(b["seconds"], rel=1e-9), (a, b)


@pytest.mark.parametrize("n,gpus_per_node,piece", [(4, 8, 4096), (8, 4, 65536), (16, 8, 256), (6, 2, 1000)])
def test_all_to_all_time_is_the_engines(n, gpus_per_node, piece):
    from emulator import World
    from emulator.planner.collective_times import all_to_all_seconds

    topo = Topology.h100(gpus_per_node=gpus_per_node)
    world = World(n, topology=topo)
    world.run(lambda comm: comm.all_to_all([np.zeros(piece // 4, np.float32) for _ in range(n)]))
    assert all_to_all_seconds(piece, tuple(range(n)), topo) == pytest.approx(max(world.stats().time), rel=1e-9)


@pytest.mark.parametrize("dims,seq", [
    (D(dp=4, tp=4, sequence_parallel=True, micro_batches=2, zero_stage=1), 4096),  # TE hides part of TP
    (D(dp=4, tp=2, cp=2, sequence_parallel=True, zero_stage=1, micro_batches=2), 8192),  # the ring behind attention
    (D(dp=1, tp=8, pp=2, sequence_parallel=True, micro_batches=8), 4096)])
def test_the_comm_tables_exposed_seconds_are_the_breakdowns(dims, seq):
    """The table's exposed column and the step's breakdown tell one story: per axis, the
    exposed seconds of the layers' collectives sum to the breakdown's part, and none is more
    than the collective's own seconds."""
    model, cluster = model_preset("llama3-8b"), cluster_preset("h100", nodes=2)
    e = evaluate(model, cluster, dims, seq, 16 * seq)
    checked = 0
    for axis in ("tp", "cp"):
        rows = [x for x in e.comm if x["axis"] == axis]
        if not rows:
            continue
        checked += 1
        assert sum(x["exposed"] for x in rows) == pytest.approx(e.breakdown[axis], rel=1e-9)
        assert all(x["exposed"] <= x["seconds"] * (1 + 1e-9) for x in rows), rows
        # what the overlap hides is visible in the table: less exposed than sent, for TP under TE
        if axis == "tp":
            assert sum(x["exposed"] for x in rows) < sum(x["seconds"] for x in rows)
    assert checked == 1 + (dims.cp > 1)


def test_the_last_stage_holds_the_loss_gradient_of_the_logits_until_backward():
    """The vocabulary-parallel loss computes its gradient of the logits in the forward and
    keeps it (fp32) until the backward: the ledger holds it, the planner counts it, and each
    of GPipe's micro-batches in flight adds one."""
    model, b, seq, v = SMALL, 2, 64, SMALL.vocab
    for m in (1, 4):
        dims = D(pp=2, micro_batches=m, schedule="gpipe")
        pr = run_plan(model, cluster_for(dims), dims, seq, b * m * seq, shape_only=True, param_bytes=2)
        layers = inventory(model, dims, b * m, seq, 1)
        loss = b * seq * v * 4
        assert [x["name"] for x in layers][-1] == "head"
        led = pr.run.world.memory[pr.representative(1)]
        kept = sum(x["kept"] for x in layers)  # the head's with the loss's
        assert led.peak_by_kind["activations"] == pytest.approx(m * kept, rel=1e-12)
        assert pr.estimate.stage_memory[1][1]["activations"] == pytest.approx(m * kept, rel=1e-12)
        without = kept - loss
        assert m * without < led.peak_by_kind["activations"]  # the loss's share is there, m times


@pytest.mark.parametrize("name,v", [("1f1b", 1), ("gpipe", 1), ("zb_h1", 1), ("interleaved_1f1b", 2)])
def test_zero3_gathers_count_every_pass_that_finds_its_layers_freed(name, v):
    """ZeRO-3's all-gathers per chunk, extended past the ramp, equal the count over the whole
    schedule; a split backward's last stage gathers far fewer than two per micro-batch."""
    from emulator.planner.memory import _actions, zero3_gathers, zero3_held

    for p in (2, 3, 4):
        for m in range(1, 9 * p + 1):
            try:
                acts = _actions(name, p, m, v)
            except ConfigError:
                continue
            for r in range(p):
                want = [0] * v
                for (kind, c), (held, _) in zip(acts[r], zero3_held(acts[r], name == "zb_h1")):
                    want[c] += kind != "W" and not held
                assert zero3_gathers(name, p, m, v, r) == want, (p, m, r)
                if name != "zb_h1":
                    assert want == [2 * m] * v
    assert zero3_gathers("zb_h1", 4, 64, 1, 3) < [2 * 64]


@pytest.mark.parametrize("stack,dims", [
    ("pytorch-eager", D(dp=16, zero_stage=3, recompute="full")),  # FSDP's prefetch hides most of its gathers
    ("pytorch-eager", D(dp=4, pp=4, zero_stage=3, micro_batches=8)),
    ("pytorch-eager", D(dp=4, pp=4, zero_stage=3, micro_batches=8, schedule="zb_h1")),
    ("megatron-core", D(dp=16, zero_stage=3, recompute="full")),
    ("megatron-core", D(dp=2, tp=4, pp=2, zero_stage=1, micro_batches=8, sequence_parallel=True))])
def test_the_breakdown_sums_to_the_step_and_counts_only_what_shows(stack, dims):
    """Every part of the step's breakdown is at least zero and they sum to the step; under
    FSDP's prefetch the data-parallel part is what the gathers add beyond the compute beside
    them, less than the gathers' own seconds."""
    e = evaluate(model_preset("llama3-70b"), cluster_preset("a100", nodes=2), dims, 8192, 32 * 8192, stack=stack)
    assert all(v >= 0 for v in e.breakdown.values()), e.breakdown
    assert sum(e.breakdown.values()) == pytest.approx(e.step_time, rel=1e-9), e.summary()
    rows = [x for x in e.comm if x["axis"] in ("dp,cp", "edp")]
    sent = sum(x["seconds"] for x in rows)
    assert 0 < e.breakdown["dp"] <= sent * (1 + 1e-9)  # no more than was sent
    if stack == "pytorch-eager":  # FSDP's prefetch: the table's exposed column is the breakdown's part
        assert sum(x["exposed"] for x in rows) == pytest.approx(e.breakdown["dp"], rel=1e-9)
        if dims.pp == 1:
            assert e.breakdown["dp"] < 0.5 * sent
