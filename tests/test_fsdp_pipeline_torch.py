"""ZeRO-3 inside a pipeline against PyTorch's own: FSDP2 (``fully_shard``) inside
``torch.distributed.pipelining`` with torchtitan's setting (``reshard_after_forward=False``
under pipeline parallelism), four gloo ranks on the CPU as a 2 x 2 (pp, dp) mesh, 1F1B and
interleaved 1F1B (two chunks per rank) over four micro-batches. Past the first step (whose
shape inference runs a forward of its own), each rank all-gathers each of its FSDP units
once per step and reduce-scatters each once, as
:class:`emulator.parallel.data_parallel.fsdp_pipeline.FSDPInPipeline` does on the same mesh;
plain ZeRO-3 (the Megatron stacks') would gather twice and reduce-scatter once per
micro-batch."""

import socket

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = torch.distributed
mp = torch.multiprocessing

from emulator import nn  # noqa: E402
from emulator.parallel import ParallelDims, run_on_mesh  # noqa: E402
from emulator.training import synthetic_batches  # noqa: E402

UNITS, MICRO, STEPS = 2, 4, 3  # FSDP units per stage (one per Linear), micro-batches, steps
COLLECTIVES = (("all_gather_single", "all_gather"), ("all_gather_into_tensor", "all_gather"),
               ("reduce_scatter_single", "reduce_scatter"), ("reduce_scatter_tensor", "reduce_scatter"))


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank, world, port, out, v):
    import os

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleaved1F1B

    counts = {"all_gather": 0, "reduce_scatter": 0}
    for name, key in COLLECTIVES:  # FSDP2 calls them as dist.<name>: count each call
        if hasattr(dist, name):
            def counted(*args, _real=getattr(dist, name), _key=key, **kwargs):
                counts[_key] += 1
                return _real(*args, **kwargs)
            setattr(dist, name, counted)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "dp"))
    pp, dp = mesh["pp"], mesh["dp"]
    stages = []
    for c in range(v):  # chunk c of this rank is virtual stage c * pp + rank, UNITS // v layers
        layers = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(UNITS // v)])
        for layer in layers:  # torchtitan's apply_fsdp with pp_enabled
            fully_shard(layer, mesh=dp, reshard_after_forward=False)
        fully_shard(layers, mesh=dp, reshard_after_forward=False)
        stages.append(PipelineStage(layers, c * 2 + pp.get_local_rank(), 2 * v, torch.device("cpu"),
                                    group=pp.get_group()))
    loss = lambda y, t: ((y - t) ** 2).mean()  # noqa: E731
    schedule = Schedule1F1B(stages[0], n_microbatches=MICRO, loss_fn=loss) if v == 1 else \
        ScheduleInterleaved1F1B(stages, n_microbatches=MICRO, loss_fn=loss)
    x, target = torch.randn(2 * MICRO, 8), torch.randn(2 * MICRO, 8)
    per_step = []
    for _ in range(STEPS):
        if pp.get_local_rank() == 0:
            schedule.step(x, target=target)
        else:
            schedule.step(target=target)
        per_step.append(dict(counts))
    out[rank] = per_step
    dist.destroy_process_group()


@pytest.fixture(scope="module", params=[1, 2], ids=["1f1b", "interleaved v=2"])
def torch_counts(request):
    """(chunks per rank, {rank: the collectives counted after each step})."""
    out = mp.Manager().dict()
    mp.spawn(_rank, args=(4, _free_port(), out, request.param), nprocs=4, join=True)
    return request.param, dict(out)


def _per_step_after_the_first(per_step):
    return [{k: b[k] - a[k] for k in a} for a, b in zip(per_step, per_step[1:])]


def test_torch_gathers_and_reduce_scatters_each_unit_once_per_step(torch_counts):
    _, counts = torch_counts
    assert sorted(counts) == [0, 1, 2, 3]
    for rank, per_step in counts.items():
        steps = _per_step_after_the_first(per_step)
        assert steps == [{"all_gather": UNITS, "reduce_scatter": UNITS}] * (STEPS - 1), (rank, per_step)


def test_the_emulator_does_what_torch_does_and_megatron_stacks_do_not(torch_counts):
    v, counts = torch_counts
    model = nn.GPT(vocab=16, d_model=16, n_heads=4, d_ff=32, n_layers=4, max_seq=8, dtype=np.float64)
    dims = ParallelDims(dp=2, pp=2, zero_stage=3, micro_batches=MICRO, v=v,
                        schedule="interleaved_1f1b" if v > 1 else "1f1b")
    got = {}
    for stack in ("pytorch-eager", "megatron-core"):
        run = run_on_mesh(model, model.init(np.random.default_rng(0)), synthetic_batches(STEPS, 2 * 2 * MICRO, 8, 16),
                          dims, nn.AdamW(), stack=stack)
        calls = [c for c in run.world.calls[0] if c.group == "dp,cp"]
        got[stack] = {op: sum(c.op == op for c in calls) / STEPS for op in ("all_gather", "reduce_scatter")}
    units = got["megatron-core"]["reduce_scatter"] / MICRO  # rank 0's layers (the embedding and blocks)
    assert units >= 2 and got["megatron-core"] == {"all_gather": 2 * MICRO * units, "reduce_scatter": MICRO * units}
    torch_rate = {k: n / UNITS for k, n in _per_step_after_the_first(counts[0])[0].items()}
    assert {k: n / units for k, n in got["pytorch-eager"].items()} == torch_rate == {"all_gather": 1, "reduce_scatter": 1}
