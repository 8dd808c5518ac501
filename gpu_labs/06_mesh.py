"""Lesson 06 on real hardware: data, tensor and pipeline parallelism on one device mesh with
PyTorch's own pieces, against one process and against the emulator's run of the same plan.

    torchrun --standalone --nproc-per-node 4 -m gpu_labs.06_mesh            # dp 2 x tp 2
    torchrun --standalone --nproc-per-node 8 -m gpu_labs.06_mesh --pp 2     # pp 2 x dp 2 x tp 2

The course GPT (``emulator.nn.GPT``'s parameters, as torch modules:
``gpu_labs/torch_parallel/mesh.py``) trains for ``--steps`` steps on a mesh from
``init_device_mesh``, the last axis innermost as in the lesson (``dp, tp``, or ``pp, dp,
tp``):

* ``tp`` (``--tp``, default 2): ``parallelize_module`` splits each block, q/k/v and fc1
  column-parallel, o and fc2 row-parallel, with sequence parallelism (``SequenceParallel``
  norms, the sequence gathered before attention and the MLP and reduce-scattered after);
* ``dp`` (the rest): FSDP2's ``fully_shard`` on each block and on the rest, parameters,
  gradients and optimizer state sharded (the lesson's ZeRO-3);
* ``pp`` (``--pp``, default 1): ``torch.distributed.pipelining``, each rank a
  ``PipelineStage`` of whole blocks under ``Schedule1F1B``, two micro-batches per stage,
  passing each rank's slice of the sequence between stages.

Checks: after the steps every parameter equals single-process training of the same model
on the same batches (within the dtype's tolerance; exits non-zero naming the parameter and
rank otherwise, a missing one included). The last step's calls are recorded at the
dispatcher (DTensor's, FSDP2's, the pipeline's), written to ``--out``/06_mesh.calls.json
and set beside the emulator's run of the same plan (``run_on_mesh`` with ``ParallelDims(dp,
tp, pp, zero_stage=3, sequence_parallel=True)``), axis by axis (``gpu_labs/mesh_calls.py``):
the pipeline's sends and receives must be the emulator's, call for call; the data axis
must gather and reduce-scatter the same layers, with FSDP2's padding; the tensor axis
differs where the two implementations choose differently, and the lab prints by how much
and why. On GPUs it also times a step beside the planner's prediction for the plan. NCCL
on GPUs, gloo on CPU (``--backend``).
"""

if not __package__:  # started by its path: its imports are relative to the gpu_labs package
    raise SystemExit(f"start {__file__.rsplit('/', 1)[-1]} as a module, from the course's folder: "
                     f"torchrun --standalone --nproc-per-node 4 -m gpu_labs.{__file__.rsplit('/', 1)[-1][:-3]}")

import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from .call_trace import Recording
from .checks import expect_match, gather_calls
from .common import Stopwatch, add_dtype_option, base_parser, dtype_name, fail, finish, header, init, lab_dtype, say
from .mesh_calls import compare, emulator_calls, tensor_axis_note
from .torch_parallel.mesh import GPT, Stage, fully_shard_layers, tensor_parallel

from emulator import nn
from emulator.parallel import ParallelDims
from emulator.records.calls import save
from emulator.training import synthetic_batches

V, D, H, FF, L, S, B_MICRO = 64, 64, 8, 128, 4, 16, 2
LR = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def parse():
    ap = base_parser(__doc__)
    add_dtype_option(ap)
    ap.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks (divides the 8 heads)")
    ap.add_argument("--pp", type=int, default=1, help="pipeline stages (divides the 4 blocks)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--gpus-per-node", type=int, default=8, help="topology of the planner's prediction")
    ap.add_argument("--self-test-fault", choices=["wrong-gradient", "drop-parameter", "drop-call"],
                    help="damage the result on the last rank, to prove a check catches it")
    return ap.parse_args()


def mesh_of(n, tp, pp, device):
    if H % tp or L % pp or n % (tp * pp) or S % tp:
        fail(f"{n} ranks with --tp {tp} --pp {pp}: TP must divide the {H} heads and the {S} positions, PP the {L} "
             f"blocks, and TP x PP the {n} ranks")
    dp = n // (tp * pp)
    if pp == 1:
        return dp, init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    return dp, init_device_mesh(device.type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))


def loss_fn(logits, targets):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def reference(params, batches, device, dtype):
    """Single-process training of the same model on the whole batches."""
    model = GPT(params, L, H, device, dtype)
    opt = torch.optim.AdamW(model.parameters(), **LR)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model.named(), losses


def train_2d(params, batches, mesh, dp_rank, dp, device, dtype, groups):
    """FSDP2 on dp, TP + SP on tp: this replica's slice of each batch."""
    model = fully_shard_layers(tensor_parallel(GPT(params, L, H, device, dtype), mesh["tp"]), mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), **LR)
    rec, watch = Recording(groups), Stopwatch(device)
    for step, (x, y) in enumerate(batches):
        b = len(x) // dp
        xs, ys = x[dp_rank * b:(dp_rank + 1) * b], y[dp_rank * b:(dp_rank + 1) * b]
        opt.zero_grad()
        watch.start()
        if step == len(batches) - 1:
            with rec:
                loss_fn(model(xs), ys).backward()
        else:
            loss_fn(model(xs), ys).backward()
        opt.step()
        seconds = watch.stop()
    return model, rec, seconds


def train_3d(params, batches, mesh, dp_rank, dp, pp, m, device, dtype, groups):
    """Blocks split into pp stages under Schedule1F1B; TP + SP and FSDP2 inside each."""
    import inspect

    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    model = tensor_parallel(GPT(params, L, H, device, dtype), mesh["tp"])
    stage_id = mesh["pp"].get_local_rank()
    per = L // pp
    stage = Stage(model, stage_id, pp, list(model.blocks)[stage_id * per:(stage_id + 1) * per])
    fully_shard_layers(stage, mesh["dp"])
    tp = mesh["tp"].size()
    micro = len(batches[0][0]) // dp // m
    if inspect.signature(PipelineStage.__init__).parameters["input_args"].default is inspect.Parameter.empty:
        # torch 2.4 wants the stage's input and output shapes up front (later releases find them)
        inp = torch.zeros(micro, S, dtype=batches[0][0].dtype, device=device) if stage_id == 0 else \
            torch.zeros(micro, S // tp, D, device=device, dtype=dtype)
        out = torch.zeros(micro, S, V, device=device, dtype=dtype) if stage_id == pp - 1 else \
            torch.zeros(micro, S // tp, D, device=device, dtype=dtype)
        shapes = {"input_args": (inp,), "output_args": (out,)}
    else:
        shapes = {}
    pipe = PipelineStage(stage, stage_id, pp, device, group=mesh["pp"].get_group(), **shapes)
    # torch 2.4 and 2.5 sum the micro-batches' losses' gradients, later releases divide by m
    # unless told not to (scale_grads): the loss is divided here, the same on every release
    cls = Schedule1F1B
    scale = {"scale_grads": False} if "scale_grads" in inspect.signature(cls.__init__).parameters else {}
    schedule = cls(pipe, m, loss_fn=lambda o, t: loss_fn(o, t) / m, **scale)
    opt = torch.optim.AdamW(stage.parameters(), **LR)
    rec, watch = Recording(groups), Stopwatch(device)
    for step, (x, y) in enumerate(batches):
        b = len(x) // dp
        xs, ys = x[dp_rank * b:(dp_rank + 1) * b], y[dp_rank * b:(dp_rank + 1) * b]
        opt.zero_grad()

        def run():
            if stage_id == 0:
                schedule.step(xs)
            elif stage_id == pp - 1:
                schedule.step(target=ys)
            else:
                schedule.step()

        watch.start()
        if step == len(batches) - 1:
            with rec:
                run()
        else:
            run()
        opt.step()
        seconds = watch.stop()
    if stage.first:  # FSDP2 swapped the stage's own parameters for sharded ones: read those
        model.tok, model.pos = stage.tok, stage.pos
    named = {}
    for k, v in model.named().items():  # every rank reports what its stage holds
        layer = k.split(".")[0] if not k.startswith("blocks.") else ".".join(k.split(".")[:2])
        first, last = stage_id * per, (stage_id + 1) * per
        mine = (layer == "embed" and stage_id == 0) or (layer == "head" and stage_id == pp - 1) or \
            (layer.startswith("blocks.") and first <= int(layer.split(".")[1]) < last)
        if mine:
            named[k] = v
    return named, rec, seconds


def main():
    args = parse()
    rank, n, device = init(args.backend, args.timeout)
    dtype, tol = lab_dtype(args.dtype, device)
    dp, mesh = mesh_of(n, args.tp, args.pp, device)
    tp, pp = args.tp, args.pp
    m = 2 * pp if pp > 1 else 1
    dp_rank = mesh["dp"].get_local_rank()
    item = torch.empty((), dtype=dtype).element_size()
    groups = {a: mesh[a].get_group() for a in mesh.mesh_dim_names}
    gpt = nn.GPT(V, D, H, FF, L, S, dtype=np.float64)
    params = gpt.init(np.random.default_rng(0))
    np_batches = synthetic_batches(args.steps, dp * m * B_MICRO, S, V, seed=1)
    batches = [(torch.tensor(x, device=device), torch.tensor(y, device=device)) for x, y in np_batches]
    say(f"# {n} ranks as {' x '.join(f'{a} {mesh[a].size()}' for a in mesh.mesh_dim_names)}, {header(device)}, "
        f"{dtype_name(dtype)}; GPT of {L} blocks (d={D}, {H} heads), {dp * m * B_MICRO} sequences of {S} per step, "
        f"{args.steps} steps; tolerance {tol:g}")
    want, ref_losses = reference(params, batches, device, dtype)
    if pp == 1:
        model, rec, seconds = train_2d(params, batches, mesh, dp_rank, dp, device, dtype, groups)
        got = model.named()
    else:
        got, rec, seconds = train_3d(params, batches, mesh, dp_rank, dp, pp, m, device, dtype, groups)
        want = {k: v for k, v in want.items() if k in got or (args.self_test_fault == "drop-parameter")}
    if rank == n - 1 and args.self_test_fault == "wrong-gradient":
        k = next(k for k in sorted(got) if k.startswith("blocks."))
        got[k] = got[k] + 10 * tol * (1 + got[k].abs().max())
    if rank == n - 1 and args.self_test_fault == "drop-parameter":
        got.pop(next(k for k in sorted(got) if k.startswith("blocks.")))
    if rank == n - 1 and args.self_test_fault == "drop-call":  # a pipeline transfer, or a gradient reduction
        axis, op = ("pp", "send") if pp > 1 else ("dp", "reduce_scatter")
        rec.calls.pop(max(i for i, c in enumerate(rec.calls) if (c.group, c.op) == (axis, op)))
    name = f"{'pp x ' if pp > 1 else ''}FSDP2 x TP/SP"
    err = expect_match(f"{name}: parameters after {args.steps} steps, against one process", got, want, tol, rank)
    say(f"{name}: every parameter equals single-process training after {args.steps} steps (max error {err:.1e})")
    dims = ParallelDims(dp=dp, tp=tp, pp=pp, zero_stage=3, sequence_parallel=True, micro_batches=m)
    emu = emulator_calls(gpt, params, np_batches[-1], dims, nn.AdamW(**LR))
    everyone = gather_calls(rec)
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)
        out = os.path.join(args.out, "06_mesh.calls.json")
        save(out, everyone, lab="06_mesh", world_size=n, dp=dp, tp=tp, pp=pp, dtype=dtype_name(dtype))
    units, blocks = (L // pp + 1, L // pp) if dp > 1 else (0, 0)
    lines, bad = compare(everyone[rank], emu[rank], item, units, blocks, m)
    say(f"the last step's calls of rank 0, beside the emulator's run of {dims}:")
    for line in compare(everyone[0], emu[0], item, units, blocks, m)[0]:
        say(line)
    flag = torch.tensor([len(bad)], device=device)
    dist.all_reduce(flag)
    if bad:
        fail(f"{name}: the calls differ from the emulator's on rank {rank}: " + "; ".join(bad))
    if int(flag):
        fail("another rank's calls differ from the emulator's (see its message)")
    say(tensor_axis_note(everyone[0], emu[0]))
    if device.type == "cuda":
        worst = torch.tensor(seconds, dtype=torch.float64, device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        planner_line(args, dims, float(worst))
    if m > 1:
        say(f"dp: FSDP2 under torch's pipeline reduce-scatters each unit once per step (its gradients accumulated "
            f"unsharded over the {m} micro-batches), the emulator's ZeRO-3 every micro-batch (it keeps no full "
            f"gradient): memory traded for bytes")
    say("OK: the mesh trains as one process does; its pipeline and data-parallel calls agree with the emulator's")
    finish()


def planner_line(args, dims, seconds):
    """A step's measured time beside the planner's prediction for the plan on H100 nodes
    (the course GPT in fp32 here: the planner's ``param_bytes=4, mixed=False``)."""
    from emulator.planner import ModelSpec, cluster_preset, evaluate

    g = min(args.gpus_per_node, dims.world_size)
    cluster = cluster_preset("h100", nodes=max(1, dims.world_size // g), gpus_per_node=g)
    tokens = S * B_MICRO * dims.dp * dims.micro_batches
    est = evaluate(ModelSpec(L, D, H, FF, V), cluster, dims, S, tokens, param_bytes=4, mixed=False)
    say(f"a step took {seconds * 1e3:.3f} ms (slowest rank); the planner predicts {est.step_time * 1e3:.3f} ms for "
        f"this plan on H100s (a model this small is bound by launch overheads the planner charges once per kernel)")


if __name__ == "__main__":
    main()
