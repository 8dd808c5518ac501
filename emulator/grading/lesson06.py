"""Checks for lesson 06 (the mesh and the planner).

Mesh coordinates and groups are compared with :class:`emulator.mesh.Mesh` on many meshes
and every rank; a plan's memory with the ledger of the emulator running it, stage by
stage, and its bytes per axis with the run's trace; a chosen plan is run on the emulator
(it must fit, and be within 15% of the best plan the planner finds); the three-number
trade-off of Exercise 6.4 on splits that break each of its rules, and the napkins, are
called with other numbers too. While a check runs the student's code, the
library's own answer (the mesh's arithmetic, the planner) refuses.
"""

from dataclasses import replace
from functools import lru_cache

import numpy as np
from ml_dtypes import bfloat16

from .. import nn
from ..machine.device import Device
from ..machine.topology import Topology
from ..mesh import Mesh
from ..parallel.dims import ParallelDims
from ..parallel.runtime import run_on_mesh, shape_only_batches
from ..planner import Cluster, ModelSpec, evaluate, inventory, search
from ..planner import memory as planner_memory, ranking, run as planner_run, tradeoff
from .common import CheckFailed, expect, passed
from .lesson06_memory import KINDS, MEMORY_MISTAKES, memory_hint, memory_model, within_one_percent
from .lesson06_napkins import (DP_TOKENS_CASES, LLAMA_CP_CASES, STATE_CASES, dp_compute_bound_tokens,
                               llama_cp_switch, state_per_gpu)
from .lesson06_tradeoff import TRADEOFF_CASES, breaks
from .napkins import variants
from .refuse import refusing

MESH = (Mesh.coords, Mesh.coord, Mesh.group_ranks, Mesh.groups, Mesh.rank_of, Mesh.layout, ParallelDims.groups_of)
PLANNER = (evaluate, planner_memory.stage_peaks, planner_memory.Units, planner_run.run_plan)
SEARCH = (search, ranking.enumerate_plans)


# ----------------------------------------------------------------- Exercise 6.1
def check_mesh_coords(fn):
    """Exercise 6.1: fn(rank, sizes) -> (coords, groups): ``sizes`` maps axis -> size, outermost first."""
    what = "Exercise 6.1"
    meshes = [{"tp": 4}, {"dp": 2, "tp": 4}, {"pp": 2, "dp": 4, "tp": 8}, {"pp": 3, "dp": 2, "cp": 2, "tp": 2},
              {"dp": 3, "pp": 5}, {"tp": 2, "dp": 3}]
    for sizes in meshes:
        mesh = Mesh(sizes)
        answers = []
        for rank in range(mesh.size):
            with refusing(what, *MESH):
                got = fn(rank, dict(sizes))
            expect(isinstance(got, tuple) and len(got) == 2, f"{what}: return (coords, groups), two dicts")
            answers.append(got)
        for rank, (coords, _) in enumerate(answers):  # every rank's coordinates first: they say the axis order
            want_c = mesh.coords(rank)
            expect(dict(coords) == want_c, f"{what}, mesh {sizes}, rank {rank}: coordinates {dict(coords)}, expected "
                                           f"{want_c}; the last axis is innermost (it changes fastest with the rank)")
        for rank, (_, groups) in enumerate(answers):
            for a in sizes:
                want_g = list(mesh.group_ranks(a, rank))
                g = [int(x) for x in groups.get(a, [])]
                expect(g == want_g, f"{what}, mesh {sizes}, rank {rank}: group along {a!r} is {g}, expected "
                                    f"{want_g} (the ranks that differ from {rank} only in {a}, in order)")
    passed(what, f"coordinates and groups of every rank of {len(meshes)} meshes (3 and 5 included, 4 axes)")


# ----------------------------------------------------------------- Exercise 6.2
def memory_plans():
    """(model, dims, seq, batch): every ZeRO stage, TP with SP, CP, experts over ``ep``, 1F1B
    over 2 and 4 stages, and a plan without a pipeline."""
    dense, gqa = ModelSpec(4, 128, 4, 512, 1024), ModelSpec(8, 128, 8, 384, 1024, n_kv_heads=2, mlp="swiglu")
    moe = ModelSpec(4, 128, 4, 256, 1024, n_experts=4, top_k=2, mlp="swiglu")
    return [(dense, ParallelDims(dp=2, tp=2, pp=2, micro_batches=4, zero_stage=1, sequence_parallel=True), 256, 16),
            (dense, ParallelDims(dp=4, pp=2, micro_batches=4, zero_stage=0), 256, 32),
            (gqa, ParallelDims(dp=2, pp=4, micro_batches=8, zero_stage=2, recompute="selective"), 256, 32),
            (gqa, ParallelDims(dp=8, tp=1, zero_stage=1, micro_batches=2), 128, 32),
            (dense, ParallelDims(dp=4, pp=2, micro_batches=4, zero_stage=3), 256, 16),
            (dense, ParallelDims(dp=2, cp=2, pp=2, micro_batches=4, zero_stage=2), 256, 8),
            (moe, ParallelDims(dp=4, ep=2, pp=2, micro_batches=4, zero_stage=1), 256, 16),
            (moe, ParallelDims(dp=2, cp=2, ep=4, micro_batches=2, zero_stage=3), 256, 4)]


def _run(model, dims, seq, batch, topology, mixed=True):
    gpt = model.to_gpt(seq, dtype=bfloat16 if mixed else np.float32)
    return run_on_mesh(gpt, None, shape_only_batches(1, batch, seq), dims, nn.AdamW(mixed_precision=mixed),
                       topology=topology, shape_only=True, fold=())


@lru_cache(maxsize=None)
def _ledger_peaks(model, dims, seq, batch):
    """Each pipeline stage's representative's peak bytes by kind in the emulator's ledger, a
    run of the plan shape-only (run once a process: the plans are the check's own)."""
    run = _run(model, dims, seq, batch, Topology.h100(gpus_per_node=4))
    return tuple(tuple(run.world.memory[r * dims.dp * dims.cp * dims.tp].peak_by_kind.items())
                 for r in range(dims.pp))


@lru_cache(maxsize=None)
def _sent_by_axis(model, dims, seq, batch):
    """Bytes each pipeline stage's representative sent per axis (tp, pp, dp) in the trace of
    a shape-only run of the plan in fp32 (run once a process, as :func:`_ledger_peaks`)."""
    stats = _run(model, dims, seq, batch, Topology.h100(gpus_per_node=4), mixed=False).world.stats().bytes_sent_by_group
    out = []
    for r in range(dims.pp):
        rep = r * dims.dp * dims.cp * dims.tp
        want = {"tp": 0, "pp": 0, "dp": 0}
        for (group, _), sent in stats.items():
            want["dp" if group == "dp,cp" else group] += sent[rep]
        out.append(tuple(want.items()))
    return tuple(out)


def check_plan_memory(fn):
    """Exercise 6.2: fn(layers, dims, rank) -> {kind: bytes}: the most of each kind that
    pipeline rank ``rank`` holds in a step, compared with the emulator's ledger kind by kind."""
    what = "Exercise 6.2"
    for model, dims, seq, batch in memory_plans():
        peaks = _ledger_peaks(model, dims, seq, batch)
        for r in range(dims.pp):
            layers = inventory(model, dims, batch, seq, r)
            with refusing(what, *PLANNER):
                got = fn(layers, dims, r)
            led = dict(peaks[r])
            expect(isinstance(got, dict) and set(KINDS) <= set(got), f"{what}: return a dict with the kinds {KINDS}")
            for kind in ("params", "grads", "optimizer", "activations"):
                want, g = led[kind], got[kind]
                number = isinstance(g, (int, float, np.integer, np.floating))
                expect(number and within_one_percent(g, want),
                       f"{what}, {model.n_layers} layers, {dims}, stage {r}: {kind} "
                       f"{format(g, ',.0f') if number else repr(g)} bytes, the ledger holds {want:,.0f}"
                       + (memory_hint(kind, g, layers, dims, r) if number else "; return a number of bytes"))
    passed(what, f"parameters, gradients, optimizer state and activations of every stage of {len(memory_plans())} "
                 f"plans (DDP, ZeRO-1, 2 and 3, TP with SP, CP, experts over ep, 1F1B over 2 and 4 stages) within "
                 f"1% of the emulator's ledger, kind by kind")


# ----------------------------------------------------------------- Exercise 6.3
def comm_plans():
    small = ModelSpec(4, 64, 4, 256, 512)
    return [(small, ParallelDims(dp=2, tp=2, pp=2, micro_batches=2), 64, 8),
            (small, ParallelDims(dp=4, pp=2, micro_batches=2, zero_stage=1), 64, 16),
            (small, ParallelDims(tp=4, pp=2, micro_batches=3), 32, 6),
            (ModelSpec(2, 48, 3, 96, 96), ParallelDims(dp=3, tp=3), 24, 6),
            (ModelSpec(2, 8, 2, 20, 14), ParallelDims(dp=7, zero_stage=1), 8, 7)]  # layers of ~700: padding counts


def _unpadded_dp(model, dims, seq, batch, rank):
    """The data axis's bytes without ZeRO's padding to a multiple of n (a mistake to name)."""
    n = dims.dp * dims.cp
    return sum(2 * (n - 1) / n * sum(x["params"].values()) * 4
               for x in inventory(model, dims, batch, seq, rank, param_bytes=4)) if n > 1 else 0


def check_comm_bytes(fn):
    """Exercise 6.3: fn(model, dims, seq_len, batch, rank) -> {axis: bytes the representative of
    pipeline rank ``rank`` sends per step}, axes "tp", "pp", "dp"."""
    what = "Exercise 6.3"
    for model, dims, seq, batch in comm_plans():
        sent = _sent_by_axis(model, dims, seq, batch)
        for r in range(dims.pp):
            want = dict(sent[r])
            with refusing(what, *PLANNER):
                got = fn(model, dims, seq, batch, r)
            expect(isinstance(got, dict), f"{what}: return a dict axis -> bytes")
            for axis in ("tp", "pp", "dp"):
                g = float(got.get(axis, 0))
                hint = _hint(axis)
                if axis == "dp" and dims.zero_stage and abs(g - _unpadded_dp(model, dims, seq, batch, r)) < 1:
                    hint = (": ZeRO-1 reduce-scatters each layer's flat gradient padded to a multiple of the "
                            f"{dims.dp * dims.cp} ranks, so that every rank's slice is the same size; you left the "
                            f"padding out")
                expect(abs(g - want[axis]) <= 0.001 * max(want[axis], 1),
                       f"{what}, {dims}, stage {r}: {axis} sends {want[axis]:,} bytes in the trace, you said {g:,.0f}"
                       + hint)
    passed(what, f"bytes per axis equal the trace's, every stage of {len(comm_plans())} plans (DDP, ZeRO-1 with its "
                 f"padding, tp = 3, pp x tp x dp)")


def _hint(axis):
    return {"tp": ": per micro-batch, each block all-reduces its (b, s, d) output twice in forward and its input "
                  "gradient twice in backward; the embedding once, the output layer's input gradient once, and the "
                  "loss three (b, s) tensors; a ring all-reduce sends 2(t-1)/t of the buffer",
            "pp": ": per micro-batch, activations to the next stage and gradients to the previous one",
            "dp": ": the gradients once per step, 2(n-1)/n of their bytes (ZeRO-1 pads each layer to a multiple of "
                  "n)"}[axis]


# ----------------------------------------------------------------- Exercise 6.5
def small_hbm_cluster(nodes=2, gpus_per_node=4, hbm=1.0e9):
    """H100 nodes whose GPUs have ``hbm`` bytes: a small model must be split as a big one is."""
    device = replace(Device.h100(), hbm_bytes=hbm)
    return Cluster(f"{nodes} nodes of {gpus_per_node} H100 with {hbm / 1e9:g} GB", nodes,
                   Topology.h100(gpus_per_node=gpus_per_node, device=device))


CHOICES = [(ModelSpec(8, 512, 8, 2048, 4096), 512, 32, 0.25e9), (ModelSpec(6, 384, 6, 1536, 3072), 512, 32, 0.15e9)]
MARGIN = 0.15


def check_choose_plan(fn):
    """Exercise 6.5: fn(model, cluster, seq_len, batch_tokens) -> ParallelDims, run on the
    emulator: it must fit, and its tokens per second be within 15% of the best plan's."""
    what = "Exercise 6.5"
    lines = []
    for model, seq, batch, hbm in CHOICES:
        cluster = small_hbm_cluster(hbm=hbm)
        best = search(model, cluster, seq, batch * seq, top=1)[0][1]
        with refusing(what, *SEARCH):
            dims = fn(model, cluster, seq, batch * seq)
        expect(isinstance(dims, ParallelDims), f"{what}: return a ParallelDims, got {type(dims).__name__}")
        est = evaluate(model, cluster, dims, seq, batch * seq)
        hard = [p for p in est.problems if not p.startswith(("slow:", "does not fit"))]
        expect(not hard, f"{what}: {dims} cannot run here: " + "; ".join(hard))
        run = _run(model, dims, seq, batch, cluster.topology)
        peak = max(m.peak for m in run.world.memory)
        expect(peak <= cluster.hbm_bytes, f"{what}: {dims} needs {peak / 1e9:.2f} GB on its fullest GPU (measured), "
                                          f"the GPUs have {cluster.hbm_bytes / 1e9:g} GB")
        rate = batch * seq / run.step_time() / dims.world_size
        short = 1 - rate / best.tokens_per_s_per_gpu
        expect(rate >= (1 - MARGIN) * best.tokens_per_s_per_gpu,
               f"{what}: {dims} runs {rate:,.0f} tokens/s per GPU on the emulator; the best plan found "
               f"({best.dims}) gives {best.tokens_per_s_per_gpu:,.0f}: you are {short:.0%} below (allowed "
               f"{MARGIN:.0%})")
        lines.append(f"{rate:,.0f} tokens/s/GPU ({rate / best.tokens_per_s_per_gpu:.0%} of the best) in "
                     f"{peak / 1e9:.2f} GB of {cluster.hbm_bytes / 1e9:g}")
    passed(what, "ran on the emulator: " + "; ".join(lines))


# ----------------------------------------------------------------- Exercise 6.4
def check_mesh_tradeoff(fn):
    """Exercise 6.4: fn(n_params, gpus, tp, pp, gpus_per_node, global_batch, micro_batch=1)
    -> {"valid", "state_bytes", "bubble"}."""
    what = "Exercise 6.4"
    for case in TRADEOFF_CASES:
        want = tradeoff.mesh_tradeoff(*case)
        args = case if case[-1] > 1 else case[:-1]  # micro_batch=1 by its default
        with refusing(what, tradeoff.mesh_tradeoff):
            got = fn(*args)
        expect(isinstance(got, dict) and {"valid", "state_bytes", "bubble"} <= set(got),
               f"{what}: return a dict with 'valid', 'state_bytes' and 'bubble'")
        n, gpus, tp, pp, gpn, batch, mb = case
        desc = (f"N={n:g}, {gpus} GPUs, tp={tp}, pp={pp}, {gpn} per node, batch {batch}, micro_batch {mb}")
        broken = breaks(*case)
        if want["valid"]:
            dp = gpus // (tp * pp)
            expect(bool(got["valid"]), f"{what} ({desc}): valid should be True: tp fits in a node, tp x pp = "
                                       f"{tp * pp} divides the GPUs (dp = {dp}) and dp x micro_batch = {dp * mb} "
                                       f"divides the batch")
        else:
            expect(not bool(got["valid"]), f"{what} ({desc}): valid should be False: " + "; ".join(broken)
                   + (" (micro_batch sequences per micro-batch: dp x micro_batch must divide the batch)"
                      if mb > 1 and not any("tp" in b for b in broken) else ""))
        expect(got["state_bytes"] is not None and abs(got["state_bytes"] - want["state_bytes"]) <=
               1e-6 * want["state_bytes"],
               f"{what} ({desc}): state {got['state_bytes']!r} bytes per GPU, expected {want['state_bytes']:.10g} "
               f"(16 bytes per parameter over every GPU: DP x TP x PP)")
        if not want["valid"]:
            expect(got["bubble"] is None, f"{what} ({desc}): bubble {got['bubble']!r} for a split that is not "
                                          f"valid: return None")
            continue
        dp = gpus // (tp * pp)
        m = batch // (dp * mb)
        hint = "(p-1)/(m+p-1) with m micro-batches per replica"
        if mb > 1 and got["bubble"] is not None and abs(got["bubble"] - (pp - 1) / (batch / dp + pp - 1)) < 1e-12:
            hint = (f"you took m = batch / dp = {batch // dp}; with {mb} sequences per micro-batch a replica runs m = "
                    f"batch / (dp x micro_batch) = {m}")
        expect(got["bubble"] is not None and abs(got["bubble"] - want["bubble"]) < 1e-9,
               f"{what} ({desc}): bubble {got['bubble']!r}, expected {want['bubble']!r} (m = {m}): {hint}")
    passed(what, f"{len(TRADEOFF_CASES)} meshes: validity (a node, GPUs and batch that divide, micro-batches of 1 to "
                 f"32 sequences), 16N/G per GPU whatever the split, and the bubble")


# ----------------------------------------------------------------- napkins (their numbers: lesson06_napkins)
def napkin_state(fn):
    """Napkin 6.1: fn(n_params, dp, tp, pp) -> (params+grads GB, optimizer GB) per GPU under ZeRO-1."""
    want = variants("Napkin 6.1", fn, STATE_CASES, state_per_gpu, " GB", ("params and grads", "optimizer"),
                    (state_per_gpu,))
    passed("Napkin 6.1", f"{want[0]:.2f} GB of parameters and gradients, {want[1]:.2f} GB of optimizer state per GPU")


def napkin_dp_tokens(fn):
    """Napkin 6.2: fn(flops, bandwidth, dp, grad_bytes) -> tokens per replica per step that
    keep the data axis compute-bound."""
    want = variants("Napkin 6.2", lambda **kw: (fn(**kw),) if kw else (fn(),), DP_TOKENS_CASES,
                    lambda **kw: (dp_compute_bound_tokens(**kw),), " tokens", ("tokens per replica",),
                    (dp_compute_bound_tokens,), rel=0.02)
    passed("Napkin 6.2", f"{want[0]:,.0f} tokens per replica per step keep the gradient all-reduce behind compute")


def napkin_llama_cp(fn):
    """Napkin 6.3: fn(seq, tokens, positions_per_gpu, gpus, tp, pp) -> (cp, dp, sequences per replica)."""
    want = variants("Napkin 6.3", fn, LLAMA_CP_CASES, llama_cp_switch, "", ("cp", "dp", "sequences per replica"),
                    (llama_cp_switch,), rel=0)
    passed("Napkin 6.3", f"at 131k tokens: CP {want[0]}, DP {want[1]}, {want[2]} sequences per replica: each GPU "
                         f"still holds 8,192 positions")


__all__ = ["check_mesh_coords", "check_plan_memory", "check_comm_bytes", "check_choose_plan", "check_mesh_tradeoff",
           "napkin_state", "napkin_dp_tokens", "napkin_llama_cp", "CheckFailed"]
