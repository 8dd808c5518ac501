"""run_on_mesh against train_single: every strategy composed on one mesh equals one device
(float64, relative 1e-9), in float32 within a stated bound; each axis talks where it
should; the checks fail when a piece is removed; ParallelDims says everything wrong."""

import numpy as np
import pytest

from emulator import ConfigError, nn
from emulator.parallel import ParallelDims, run_on_mesh
from emulator.parallel import runtime as R
from emulator.training import synthetic_batches, train_single

DENSE = dict(vocab=16, d_model=16, n_heads=4, d_ff=32, n_layers=4, max_seq=8)


def dense(**kw):
    return nn.GPT(**{**DENSE, **kw}, dtype=kw.pop("dtype", np.float64))


def moe(cf=1.0, aux=0.1, **kw):
    return nn.GPT(16, 16, 4, 32, 2, 8, dtype=np.float64, n_kv_heads=2, n_experts=4, top_k=2, capacity_factor=cf,
                  aux_loss_coef=aux, **kw)


def relative_error(got, want):
    """Largest difference per parameter over that parameter's scale (at least 1e-3: the
    key biases' gradients are zero in exact arithmetic, so their values are round-off)."""
    return max(float(np.max(np.abs(got[k].astype(np.float64) - want[k])) / max(1e-3, np.max(np.abs(want[k]))))
               for k in want)


def compare(model, dims, clip=None, steps=2, batch=8, seq=8, lr=1e-2, stack=None):
    params = model.init(np.random.default_rng(0))
    batches = synthetic_batches(steps, batch, seq, model.vocab, seed=1)
    run = run_on_mesh(model, params, batches, dims, nn.AdamW(lr=lr), clip_grad_norm=clip, stack=stack)
    ref, ref_losses = train_single(model, params, batches, nn.AdamW(lr=lr), clip_grad_norm=clip,
                                   micro_batches=dims.dp * dims.micro_batches)
    assert sorted(run.params) == sorted(ref)
    return run, relative_error(run.params, ref), np.max(np.abs(np.subtract(run.losses, ref_losses)))


FAST = [
    (dense, ParallelDims(dp=2)), (dense, ParallelDims(tp=2)), (dense, ParallelDims(pp=2, micro_batches=2)),
    (dense, ParallelDims(cp=2)), (lambda: moe(), ParallelDims(dp=2, ep=2)),
    (dense, ParallelDims(dp=2, tp=2, pp=2, zero_stage=1, micro_batches=2)),
    (lambda: moe(), ParallelDims(dp=2, tp=2, pp=2, ep=2, sequence_parallel=True, zero_stage=3, micro_batches=2)),
]
GRID = [
    # every axis alone, and the variants of each
    (dense, ParallelDims(dp=4, zero_stage=2)), (dense, ParallelDims(tp=4, sequence_parallel=True)),
    (dense, ParallelDims(pp=4, micro_batches=4)), (dense, ParallelDims(cp=4, cp_layout="contiguous")),
    (dense, ParallelDims(cp=2, cp_attention="ulysses")), (lambda: moe(None, 0.0), ParallelDims(dp=4, ep=4)),
    # pairs
    (dense, ParallelDims(dp=2, tp=2, sequence_parallel=True)), (dense, ParallelDims(dp=2, pp=2, micro_batches=2)),
    (dense, ParallelDims(dp=2, cp=2)), (dense, ParallelDims(tp=2, pp=2, micro_batches=2)),
    (dense, ParallelDims(tp=2, cp=2, sequence_parallel=True)), (dense, ParallelDims(pp=2, cp=2, micro_batches=2)),
    (lambda: moe(), ParallelDims(cp=2, ep=2)), (lambda: moe(), ParallelDims(tp=2, ep=2, dp=2)),
    (lambda: moe(), ParallelDims(pp=2, ep=2, dp=2, micro_batches=2)),
    # DP x TP x PP, x CP, x EP
    (dense, ParallelDims(dp=2, tp=2, pp=2, micro_batches=2)),
    (lambda: dense(n_kv_heads=2, mlp="swiglu"), ParallelDims(dp=2, tp=2, pp=2, cp=2, micro_batches=2,
                                                             sequence_parallel=True)),
    (lambda: moe(), ParallelDims(dp=2, tp=2, pp=2, ep=2, micro_batches=2)),
    (lambda: moe(), ParallelDims(dp=2, tp=2, pp=2, cp=2, ep=4, micro_batches=2)),
    # every ZeRO stage inside pipeline stages, every schedule
    (dense, ParallelDims(dp=2, pp=2, zero_stage=1, schedule="gpipe", micro_batches=2)),
    (dense, ParallelDims(dp=2, pp=2, zero_stage=2, schedule="1f1b", micro_batches=3)),
    (dense, ParallelDims(dp=2, pp=2, zero_stage=3, schedule="zb_h1", micro_batches=3)),
    (dense, ParallelDims(dp=2, pp=2, v=2, zero_stage=3, schedule="interleaved_1f1b", micro_batches=2)),
    # recomputation, SP on and off, GQA and SwiGLU
    (dense, ParallelDims(tp=2, pp=2, recompute="full", micro_batches=2)),
    (lambda: dense(n_kv_heads=2), ParallelDims(tp=2, dp=2, recompute="selective", sequence_parallel=True)),
    # dropless and capacity-limited MoE with the auxiliary loss, micro-batches
    (lambda: moe(None, 0.2), ParallelDims(dp=2, ep=2, micro_batches=2, zero_stage=2)),
    (lambda: moe(0.75, 0.2), ParallelDims(dp=4, ep=2, micro_batches=2)),
]


@pytest.mark.parametrize("make,dims", FAST, ids=[str(d) for _, d in FAST])
def test_composed_runs_equal_one_device(make, dims):
    _, err, loss = compare(make(), dims, batch=4 * dims.dp if dims.micro_batches > 1 else 2 * dims.dp)
    assert err < 1e-9 and loss < 1e-12, (err, loss)


@pytest.mark.slow
@pytest.mark.parametrize("make,dims", GRID, ids=[str(d) for _, d in GRID])
def test_the_grid_equals_one_device(make, dims):
    batch = dims.dp * dims.micro_batches * 2
    _, err, loss = compare(make(), dims, batch=batch, seq=8)
    assert err < 1e-9 and loss < 1e-12, (err, loss)


@pytest.mark.parametrize("make,dims", [
    (dense, ParallelDims(dp=2, pp=2, zero_stage=3, micro_batches=3)),
    (dense, ParallelDims(dp=2, pp=2, zero_stage=3, schedule="zb_h1", micro_batches=3)),
    (dense, ParallelDims(dp=2, pp=2, v=2, zero_stage=3, schedule="interleaved_1f1b", micro_batches=2)),
    (lambda: moe(), ParallelDims(dp=2, tp=2, pp=2, ep=2, sequence_parallel=True, zero_stage=3, micro_batches=2))])
def test_fsdp_inside_a_pipeline_equals_one_device_and_gathers_each_layer_once(make, dims):
    """The PyTorch stacks' ZeRO-3 under pipeline parallelism (FSDP2 in torch's pipelining):
    each layer all-gathered once per step and reduce-scattered once, after the flush, where
    Megatron's stack (plain ZeRO-3) reduce-scatters every micro-batch's backward."""
    batch = 2 * dims.dp * dims.micro_batches
    counts = {}
    for stack in ("pytorch-eager", "megatron-core"):
        run, err, loss = compare(make(), dims, batch=batch, clip=1.0, stack=stack)
        assert err < 1e-9 and loss < 1e-12, (stack, err, loss)
        calls = [c for c in run.world.calls[0] if c.group in ("dp,cp", "edp")]
        counts[stack] = {op: sum(c.op == op for c in calls) for op in ("all_gather", "reduce_scatter")}
    steps, m = 2, dims.micro_batches
    units = counts["megatron-core"]["reduce_scatter"] // (steps * m)  # stage 0's layers, by gradient group
    assert units > 0 and counts["megatron-core"]["reduce_scatter"] == units * steps * m
    assert counts["pytorch-eager"] == {"all_gather": units * steps, "reduce_scatter": units * steps}, counts


@pytest.mark.parametrize("dims", [ParallelDims(dp=2, tp=2, sequence_parallel=True, zero_stage=1),
                                  ParallelDims(dp=2, ep=2, zero_stage=3), ParallelDims(pp=2, cp=2, micro_batches=2)])
def test_clipping_by_the_global_norm_counts_every_parameter_once(dims):
    model = moe() if dims.ep > 1 else dense()
    for clip in (0.05, 1e6):  # clipping hard, and not at all
        _, err, _ = compare(model, dims, clip=clip, batch=4 * dims.micro_batches)
        assert err < 1e-9


def test_float32_is_within_a_stated_bound_of_float64():
    """The same composed run in float32 stays within 1e-5 (relative, per parameter) of its
    float64 twin after two AdamW steps, and its losses within 1e-6. The key projections'
    biases are left out: softmax is invariant to them, so their gradient is zero in exact
    arithmetic (below 1e-15 in float64, checked) and Adam turns round-off of either
    precision into steps of its learning rate."""
    dims = ParallelDims(dp=2, tp=2, pp=2, micro_batches=2, sequence_parallel=True, zero_stage=1)
    runs = {}
    for dtype in (np.float64, np.float32):
        model = nn.GPT(**DENSE, dtype=dtype)
        params = nn.GPT(**DENSE, dtype=np.float64).init(np.random.default_rng(0))
        params = {k: v.astype(dtype) for k, v in params.items()}
        runs[dtype] = run_on_mesh(model, params, synthetic_batches(2, 8, 8, 16, seed=1), dims, nn.AdamW(lr=1e-3))
    f32, f64 = runs[np.float32], runs[np.float64]
    assert all(f32.params[k].dtype == np.float32 for k in f32.params)
    keys = [k for k in f64.params if not k.endswith("attn.k.b")]
    assert relative_error({k: f32.params[k] for k in keys}, {k: f64.params[k] for k in keys}) < 1e-5
    assert np.max(np.abs(np.subtract(f32.losses, f64.losses))) < 1e-6
    model = nn.GPT(**DENSE, dtype=np.float64)
    params = model.init(np.random.default_rng(0))
    x, y = synthetic_batches(1, 8, 8, 16, seed=1)[0]
    logits, cache = model.forward(params, x)
    _, grads = model.backward(params, cache, nn.cross_entropy_backward(nn.cross_entropy(logits, y)[1]))
    assert max(np.max(np.abs(g)) for k, g in grads.items() if k.endswith("attn.k.b")) < 1e-15


def test_each_axis_talks_on_its_own_group_and_link():
    model = moe()
    dims = ParallelDims(dp=2, tp=2, pp=2, ep=2, micro_batches=2, zero_stage=1)
    run, err, _ = compare(model, dims, batch=8)
    assert err < 1e-9
    mesh, trace = dims.mesh(), run.world.trace
    by_group = {}
    for rec in trace:
        by_group.setdefault(rec.group, set()).add(rec.link)
    assert by_group["tp"] == {"nvlink"}  # consecutive ranks: one node
    for rec in trace:
        if rec.group == "pp":  # pipeline: point to point between neighbouring stages only
            assert abs(mesh.coord(rec.src, "pp") - mesh.coord(rec.dst, "pp")) == 1
            assert rec.op == "send"
        if rec.group in ("dp,cp", "ep", "edp"):  # data-parallel and expert groups: same pp and tp
            assert mesh.coord(rec.src, "pp") == mesh.coord(rec.dst, "pp")
            assert mesh.coord(rec.src, "tp") == mesh.coord(rec.dst, "tp")
    ops = {(c.op, c.group) for calls in run.world.calls for c in calls}
    assert ("all_to_all_single", "ep") in ops and ("reduce_scatter", "dp,cp") in ops
    assert ("reduce_scatter", "edp") in ops  # the experts' gradients: over the ranks holding the same experts


def test_expert_gradients_reduced_over_the_wrong_group_are_caught(monkeypatch):
    """Averaging the experts over every data-parallel rank (as plain DDP over dp x ep would)
    mixes different experts: the run must not equal one device."""
    real = R.groups

    def wrong(comm, dims):
        out = real(comm, dims)
        out["edp"] = out["dp,cp"]
        return out

    monkeypatch.setattr(R, "groups", wrong)
    _, err, _ = compare(moe(), ParallelDims(dp=2, ep=2))
    assert err > 1e-3


def test_a_missing_tensor_parallel_reduction_is_caught(monkeypatch):
    """Without summing the sequence-parallel norms' partial gradients over tp, the tp
    replicas of the norms drift apart: unshard refuses, naming the ranks."""
    monkeypatch.setattr(R.MeshHooks, "grads_ready", lambda self, layer, grads, last: [
        self.strategies[g].grads_ready(u, {k: grads[k] for k in keys}, last) for g, u, keys in self._units_of(layer)])
    with pytest.raises(ConfigError, match="hold different copies"):
        compare(dense(), ParallelDims(tp=2, sequence_parallel=True))


def test_the_aux_loss_must_be_scaled_for_the_groups(monkeypatch):
    """The auxiliary loss is one number per token group: with its gradient scaled like the
    cross-entropy's (by 1/cp too) the run differs from one device."""
    from emulator.parallel import pipeline

    real = pipeline.PipelineStage.__init__

    def unscaled(self, *a, **kw):
        kw["aux_factor"] = 1.0
        real(self, *a, **kw)

    monkeypatch.setattr(pipeline.PipelineStage, "__init__", unscaled)
    _, err, _ = compare(moe(None, 0.5), ParallelDims(cp=2, ep=2), lr=1e-1)
    assert err > 1e-6


def test_parallel_dims_names_every_problem():
    model = moe()
    dims = ParallelDims(tp=3, ep=3, pp=4, schedule="interleaved_1f1b", micro_batches=3, v=1, cp=2, dp=1)
    with pytest.raises(ConfigError) as info:
        dims.validate(model, seq_len=6, batch=5)
    text = str(info.value)
    for words in ["tp=3 must divide the 4 attention heads", "K/V heads", "d_ff=32", "vocabulary",
                  "stages need at least as many layers", "needs v >= 2", "ep=3 must divide the 4 experts",
                  "ep=3 must divide dp x cp", "divide into 4 equal pieces", "global batch (5 sequences)"]:
        assert words in text, words
    with pytest.raises(ConfigError, match="zero_stage=4"):
        ParallelDims(zero_stage=4)
    with pytest.raises(ConfigError, match="needs a mixture-of-experts"):
        ParallelDims(ep=2, dp=2).validate(dense())
    assert ParallelDims(dp=2, tp=2).validate(dense(), 8, 4).world_size == 4


def test_groups_follow_torchtitans_order_and_ep_borrows_from_dp_cp():
    dims = ParallelDims(dp=2, cp=2, tp=2, pp=2, ep=2)
    assert dims.mesh().axes == ("pp", "dp", "cp", "tp")
    g = dims.groups_of(5)  # pp0, dp1, cp0, tp1
    assert g["tp"] == (4, 5) and g["cp"] == (5, 7) and g["dp"] == (1, 5) and g["pp"] == (5, 13)
    assert g["dp,cp"] == (1, 3, 5, 7) and g["ep"] == (5, 7) and g["edp"] == (1, 5)
    every = [dims.groups_of(r) for r in range(16)]
    for r, gr in enumerate(every):  # expert groups partition dp x cp; each edp group holds one per expert group
        assert r in gr["ep"] and r in gr["edp"] and len(set(gr["ep"]) & set(gr["edp"])) == 1


def test_run_on_mesh_says_what_is_wrong():
    model = dense()
    params = model.init(np.random.default_rng(0))
    batches = synthetic_batches(1, 4, 8, 16)
    with pytest.raises(ConfigError, match="needs the model's params"):
        run_on_mesh(model, None, batches, ParallelDims(), nn.AdamW())
    with pytest.raises(ConfigError, match="fold= needs shape_only=True"):
        run_on_mesh(model, params, batches, ParallelDims(dp=2), nn.AdamW(), fold=("dp",))
    with pytest.raises(ConfigError, match=r"global batch \(4 sequences\) must split"):
        run_on_mesh(model, params, batches, ParallelDims(dp=3), nn.AdamW())
    with pytest.raises(ConfigError, match="clip_grad_norm must be a positive norm"):
        run_on_mesh(model, params, batches, ParallelDims(), nn.AdamW(), clip_grad_norm=0)
    with pytest.raises(ConfigError, match="run_on_mesh needs an nn.GPT"):
        run_on_mesh(nn.MLP(4, 8), params, batches, ParallelDims(), nn.AdamW())
    from emulator import World
    from emulator.errors import MeshError
    with pytest.raises(MeshError, match="cannot fold axis 'xx'"):
        World(mesh={"dp": 2}, fold=("xx",))


def _bad(batches, i, what, value):
    out = [(x.copy(), y.copy()) for x, y in batches]
    (out[i][0] if what == "inputs" else out[i][1])[0, 3] = value
    return out


@pytest.mark.parametrize("change, match", [
    (lambda b: dict(batches=_bad(b, 0, "inputs", 16)), r"batches\[0\]'s inputs must lie in \[0, 16\).*max 16"),
    (lambda b: dict(batches=_bad(b, 1, "inputs", -1)), r"batches\[1\]'s inputs must lie in \[0, 16\).*min -1"),
    (lambda b: dict(batches=_bad(b, 1, "targets", 99)), r"batches\[1\]'s targets must lie in \[0, 16\)"),
    (lambda b: dict(batches=[]), "batches= is empty; pass at least one"),
    (lambda b: dict(batches=[(b[0][0][:0], b[0][1][:0])]), r"batches\[0\] has shape \(0, 8\).*at least one sequence"),
    (lambda b: dict(batches=[(b[0][0], b[0][1][:, :4])]), r"inputs of shape \(4, 8\) and targets of shape \(4, 4\)"),
    (lambda b: dict(batches=[(b[0][0] * 1.0, b[0][1])]), "inputs are float64; token ids are integers"),
    (lambda b: dict(dims={"dp": 2}), r"dims= is a dict.*ParallelDims\(\*\*dims\)"),
    (lambda b: dict(optimizer=None), r"optimizer= is missing.*nn.AdamW"),
    (lambda b: dict(fold=False), r"fold= takes mesh axis names.*got False"),
    (lambda b: dict(fold=True), r"fold= takes mesh axis names.*got True"),
    (lambda b: dict(fold=("dp", 3)), r"fold= takes mesh axis names"),
    (lambda b: dict(fold=("dp", "xx"), shape_only=True), r"fold= names \['xx'\], which are not mesh axes"),
])
def test_run_on_mesh_refuses_bad_input_naming_the_argument(change, match):
    model = dense()
    params = model.init(np.random.default_rng(0))
    batches = synthetic_batches(2, 4, 8, 16)
    args = dict(model=model, params=params, batches=batches, dims=ParallelDims(dp=2), optimizer=nn.AdamW())
    args.update(change(batches))
    with pytest.raises(ConfigError, match=match):
        run_on_mesh(**args)


def test_token_ids_out_of_range_are_refused_as_one_device_refuses_them():
    model = dense()
    params = model.init(np.random.default_rng(0))
    batches = _bad(synthetic_batches(1, 4, 8, 16), 0, "inputs", 16)
    with pytest.raises(ConfigError, match=r"token ids must lie in \[0, 16\)"):
        train_single(model, params, batches, nn.AdamW())
    with pytest.raises(ConfigError, match=r"must lie in \[0, 16\)"):
        run_on_mesh(model, params, batches, ParallelDims(tp=2), nn.AdamW())
    # a fold given as a single axis name, or as a list, is still accepted
    run = run_on_mesh(model, None, synthetic_batches(1, 4, 8, 16), ParallelDims(dp=2, tp=2), nn.AdamW(),
                      shape_only=True, fold="dp")
    assert run.world.fold == ("dp",)
