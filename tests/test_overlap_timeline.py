"""Overlap as the frameworks schedule it, seen on the emulator's own timeline: gradient
buckets reduced on their own stream while backward still runs, at the stack's bucket
boundaries; the distributed optimizer's and FSDP's parameter gathers running during the
forward of the layers before; Transformer Engine's reduce-scatter pipelined behind its GEMM."""

import numpy as np
import pytest

from emulator import nn
from emulator.machine.stack import Bucket, stack_preset
from emulator.parallel import ParallelDims as D, run_on_mesh, shape_only_batches
from emulator.parallel.buckets import bucket_layers


def _run(dims, stack, layers=6, d=256):
    model = nn.GPT(512, d, 8, 4 * d, layers, 64, dtype=np.float32)
    return run_on_mesh(model, None, shape_only_batches(1, 4 * dims.dp * dims.micro_batches, 64), dims, nn.AdamW(),
                       shape_only=True, fold=(), stack=stack)


def _events(run, rank, stream, kind=None, name=None):
    return sorted((e for e in run.world.timeline().events if e.rank == rank and e.stream == stream
                   and (kind is None or e.kind == kind) and (name is None or e.name.startswith(name))),
                  key=lambda e: e.start)


def _backward_compute(run, rank):
    return [e for e in _events(run, rank, "compute", "compute") if "backward" in e.name or "dgrad" in e.name
            or "wgrad" in e.name]


@pytest.mark.parametrize("bucket_bytes", [2**20, 3 * 2**20])
def test_ddp_buckets_reduce_during_backward_at_the_stacks_boundaries(bucket_bytes):
    stack = stack_preset("pytorch-eager").replace(bucket=Bucket("bytes", bucket_bytes))
    run = _run(D(dp=2), stack)
    reduces = _events(run, 0, "comm dp,cp", "comm", "all_reduce")
    backward_end = max(e.end for e in _backward_compute(run, 0))
    assert len(reduces) > 1 and reduces[0].start < backward_end  # the first bucket goes while backward runs
    # each bucket closes with the tensor that takes it to the stack's size (fp32 gradients here:
    # as many bytes as the weights), the last one holds what is left
    sizes = [c.nbytes for c in run.world.calls[0] if c.op == "all_reduce" and c.group == "dp,cp"]
    params = nn.GPT(512, 256, 8, 1024, 6, 64, dtype=np.float32).init(np.random.default_rng(0))
    largest = max(v.nbytes for v in params.values())
    assert all(bucket_bytes <= n < bucket_bytes + largest for n in sizes[:-1]) and sizes[-1] < bucket_bytes + largest
    assert sum(sizes) == sum(v.nbytes for v in params.values())
    assert len(bucket_layers([v.nbytes for v in params.values()], bucket_bytes)) <= len(sizes)
    flush = _run(D(dp=2), "megatron-2021")  # the 2021 code: one all-reduce after the pipeline has flushed
    late = _events(flush, 0, "comm dp,cp", "comm", "all_reduce")
    assert len(late) == 1 and late[0].start >= max(e.end for e in _backward_compute(flush, 0))


def test_the_distributed_optimizer_gathers_the_next_bucket_during_the_forward():
    """Megatron's distributed optimizer (megatron-core, ZeRO-1): its reduce-scatters start
    before backward ends; in forward, a bucket's all-gather runs while the layers of the
    bucket before it compute."""
    stack = stack_preset("megatron-core").replace(bucket=Bucket("params", 2_000_000))
    run = _run(D(dp=2, zero_stage=1), stack)
    gathers = _events(run, 0, "comm dp,cp", "comm", "all_gather")
    forward = [e for e in _events(run, 0, "compute", "compute") if not ("backward" in e.name or "grad" in e.name)]
    assert len(gathers) > 1
    assert any(g.start < f.end and f.start < g.end for g in gathers[1:] for f in forward)  # beside forward compute
    scatters = _events(run, 0, "comm dp,cp", "comm", "reduce_scatter")
    assert scatters and scatters[0].start < max(e.end for e in _backward_compute(run, 0))
    sizes = {c.nbytes for c in run.world.calls[0] if c.group == "dp,cp" and c.op == "reduce_scatter"}
    assert all(n % 4 == 0 for n in sizes)  # fp32 gradients (--bf16 forces them; the arrays here are fp32 anyway)


def test_fsdp_prefetches_the_next_layer_while_one_computes():
    run = _run(D(dp=2, zero_stage=3), "pytorch-eager", d=1024)
    gathers = _events(run, 0, "comm dp,cp", "comm", "all_gather")
    forward = [e for e in _events(run, 0, "compute", "compute") if e.name.startswith(("attention", "mlp", "ln"))]
    assert any(g.start < f.end and f.start < g.end for g in gathers for f in forward)
    without = _run(D(dp=2, zero_stage=3), stack_preset("pytorch-eager").replace(fsdp_prefetch=False), d=1024)
    assert without.step_time() > run.step_time()


def test_transformer_engine_pipelines_the_reduce_scatter_behind_its_gemm():
    dims = D(tp=2, sequence_parallel=True)
    run = _run(dims, "megatron-core")
    proj = _events(run, 0, "compute", "compute", "attention: output projection")
    rs = _events(run, 0, "comm tp", "comm", "reduce_scatter")
    first = proj[0]
    following = [e for e in rs if e.start >= first.start]
    assert following and following[0].start < first.end  # it starts before its GEMM ends
    plain = _run(dims, stack_preset("megatron-core").replace(tp_comm_overlap=False))
    p_proj = _events(plain, 0, "compute", "compute", "attention: output projection")[0]
    p_rs = [e for e in _events(plain, 0, "comm tp", "comm", "reduce_scatter") if e.start >= p_proj.start][0]
    assert p_rs.start >= p_proj.end  # without the overlap it waits for the whole GEMM
