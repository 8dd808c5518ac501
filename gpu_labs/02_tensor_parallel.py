"""Lesson 02 on real hardware: Megatron tensor (and sequence) parallelism by hand, against
the dense block and PyTorch's DTensor.

    torchrun --standalone --nproc-per-node N -m gpu_labs.02_tensor_parallel

N ranks form a device mesh: ``tp`` ranks inside a node (``--tp``, default: every rank of
the node, up to the 8 heads), and ``dp = N / tp`` copies of that across nodes, each
taking its share of the batch, their gradients summed over ``dp``. So a 2 x 8 SLURM job
runs TP 8 inside each node and DP 2 across. A transformer block (the parameters of
``emulator.nn.TransformerBlock``) runs three ways:

* by hand (``gpu_labs/torch_parallel/tensor_parallel.py``): q/k/v and fc1 column-parallel,
  o and fc2 row-parallel, the f/g operators as autograd functions; then again with
  sequence parallelism (all-gather and reduce-scatter along the sequence, the norms'
  gradients all-reduced);
* with DTensor (``gpu_labs/tp_dtensor.py``): ``parallelize_module`` with
  ``ColwiseParallel``, ``RowwiseParallel`` and, for sequence parallelism,
  ``SequenceParallel`` on the norms;
* densely on every rank, the reference.

Outputs, input gradients and every parameter gradient must agree with the dense block
(exits non-zero naming the variant and rank otherwise; a missing gradient fails). The
hand-written variants' calls go to ``--out``/02_tensor_parallel.<tp|sp>.calls.json, in the
format of ``emulator.records.calls``, and must be the calls ``emulator.parallel.tensor_parallel.block``
makes on the same mesh; DTensor's calls are recorded at the dispatcher and must be the
same all-reduces, except that DTensor all-reduces each column-parallel layer's input
gradient apart (q, k and v: three calls where Megatron sums and makes one). Last, the
time of a layer's four TP all-reduces at a realistic size (bf16, b=1, s=4096, h=8192 on
GPUs) beside the emulator's prediction. NCCL on GPUs, gloo on the CPU (``--backend``
overrides); ``--dtype bfloat16`` runs the blocks in bf16.
"""

if not __package__:  # started by its path: its imports are relative to the gpu_labs package
    raise SystemExit(f"start {__file__.rsplit('/', 1)[-1]} as a module, from the course's folder: "
                     f"torchrun --standalone --nproc-per-node 4 -m gpu_labs.{__file__.rsplit('/', 1)[-1][:-3]}")

import os
import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from .call_trace import Recorder, Recording
from .checks import expect_match, expect_same_calls, gather_calls
from .common import (add_dtype_option, base_parser, dtype_name, fail, finish, header, init, lab_dtype, reference_dtype,
                    say, timed)
from .torch_parallel.tensor_parallel import TPBlock
from .tp_dtensor import as_sets, dtensor_expected, dtensor_run

from emulator import Topology, World, nn
from emulator.cost import collective_time
from emulator.nn import torch_reference as R
from emulator.parallel.tensor_parallel.block import TensorParallelBlock
from emulator.records.calls import Call

D, A, FF, B_PER_DP, S = 64, 8, 256, 2, 16


def parse():
    ap = base_parser(__doc__)
    add_dtype_option(ap)
    ap.add_argument("--iters", type=int, default=10, help="timed all-reduces")
    ap.add_argument("--gpus-per-node", type=int, default=8, help="topology for the model's prediction")
    ap.add_argument("--tp", type=int, default=0, help="ranks per tensor-parallel group (default: the ranks of a "
                                                      "node, at most 8); the rest of the world is data parallel")
    ap.add_argument("--self-test-fault", choices=["drop-gradient", "wrong-output", "drop-call"],
                    help="damage the hand-written TP block's result on the last rank, to prove a check catches it")
    return ap.parse_args()


def mesh_shape(n, tp, local_ranks):
    """(dp, tp) for ``n`` ranks: ``tp`` as asked, else the node's ranks (at most 8, the
    heads); it must divide both n and the 8 heads."""
    tp = tp or min(local_ranks, A)
    if A % tp or n % tp:
        fail(f"{n} ranks with --tp {tp}: TP must divide the block's {A} heads and the {n} ranks; "
             f"pass --tp with one of {[t for t in (1, 2, 4, 8) if n % t == 0]}")
    return n // tp, tp


def shard_of(params, rank, n, sp=False):
    """This rank's parameters, cut exactly as the emulator's block cuts them."""
    return TensorParallelBlock.shard_for(params, rank, n, D, A, FF, sequence_parallel=sp)


def emulator_calls(dp, tp, sp, np_dtype, item):
    """The calls of ``emulator.parallel.tensor_parallel.block`` on the same (dp, tp) mesh and shapes."""
    params = {k: v.astype(np_dtype) for k, v in nn.TransformerBlock(D, A, FF, dtype=np.float64).init(
        np.random.default_rng(0)).items()}
    x = np.zeros((B_PER_DP, S, D), np_dtype)

    def prog(comm):
        tb = TensorParallelBlock(comm.group("tp"), D, A, FF, sequence_parallel=sp, act_dtype=np_dtype)
        p = tb.shard(params)
        y, cache = tb.forward(p, x[:, :S // tp] if sp else x)
        tb.backward(p, cache, np.ones_like(y))

    world = World(mesh={"dp": dp, "tp": tp})
    world.run(prog)
    scale = item / np.dtype(np_dtype).itemsize
    return [[Call(c.op, c.group, int(c.nbytes * scale), c.peer) for c in per_rank] for per_rank in world.calls]


def main():
    args = parse()
    rank, n, device = init(args.backend, args.timeout)
    dp, tp = mesh_shape(n, args.tp, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    dtype, tol = lab_dtype(args.dtype, device)
    ref_dtype = reference_dtype(dtype)
    item = torch.empty((), dtype=dtype).element_size()
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    mesh = init_device_mesh(device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    group, dp_group = mesh.get_group("tp"), mesh.get_group("dp")
    tp_rank, dp_rank = dist.get_rank(group), dist.get_rank(dp_group)
    B = B_PER_DP * dp
    params = nn.TransformerBlock(D, A, FF, dtype=np.float64).init(np.random.default_rng(0))
    x = torch.tensor(np.random.default_rng(1).standard_normal((B, S, D)), device=device, dtype=ref_dtype)
    dy = torch.tensor(np.random.default_rng(2).standard_normal((B, S, D)), device=device, dtype=ref_dtype)
    p = {k: torch.tensor(v, device=device, dtype=ref_dtype, requires_grad=True) for k, v in params.items()}
    xr = x.clone().requires_grad_(True)
    y_ref = R.block(p, xr, n_heads=A)
    (y_ref * dy).sum().backward()
    g_ref = {k: v.grad.detach() for k, v in p.items()}
    rows = slice(dp_rank * B_PER_DP, (dp_rank + 1) * B_PER_DP)  # this replica's share of the batch
    xb, dyb = x[rows].to(dtype), dy[rows].to(dtype)
    say(f"# {n} ranks as dp {dp} x tp {tp}, {header(device)}, {dtype}; block d={D}, heads={A}, d_ff={FF}, "
        f"b={B_PER_DP} per replica, s={S}; tolerance {tol:g} (relative)")

    def check(name, y, dx, grads, sl, sharded):
        want = {"output": y_ref[rows, sl], "input gradient": xr.grad[rows, sl]}
        cut = shard_of({k: v.cpu().double().numpy() for k, v in g_ref.items()}, tp_rank, tp) if sharded else g_ref
        want.update({f"grad {k}": v for k, v in cut.items()})
        got = {"output": y, "input gradient": dx}
        got.update({f"grad {k}": grads.get(k) for k in grads})
        err = expect_match(name, got, want, tol, rank)
        say(f"{name:>26s}: output, input gradient and {len(cut)} parameter gradients match (max error {err:.1e})")

    def sum_over_dp(grads):
        for g in grads.values():
            if g is not None:
                dist.all_reduce(g, group=dp_group)  # the data-parallel sum, outside the TP algorithm's trace
        return grads

    hand = {}
    for sp in (False, True):
        rec = Recorder({"tp": group})  # the dp sum below is the harness, not the algorithm
        shard = {k: torch.tensor(v, device=device, dtype=dtype) for k, v in shard_of(params, tp_rank, tp, sp).items()}
        block = TPBlock(shard, A, rec, group, tp, sequence_parallel=sp)
        sl = slice(tp_rank * S // tp, (tp_rank + 1) * S // tp) if sp else slice(None)
        xin = xb[:, sl].clone().requires_grad_(True)
        y = block(xin)
        y.backward(dyb[:, sl])
        block.sync_sequence_parallel_grads()
        grads = sum_over_dp({k: None if block.w(k).grad is None else block.w(k).grad.clone() for k in shard})
        if rank == n - 1 and args.self_test_fault == "drop-gradient":
            grads["mlp.fc1.w"] = None
        if rank == n - 1 and args.self_test_fault == "wrong-output":
            y = y + 1.0
        if rank == n - 1 and args.self_test_fault == "drop-call":
            rec.calls.pop()
        name = "by hand" + (", SP" if sp else "")
        check(name, y.detach(), xin.grad, grads, sl, sharded=True)
        hand[sp] = gather_calls(rec)
        say(expect_same_calls(f"{name:>26s}", hand[sp], emulator_calls(dp, tp, sp, np_dtype, item)))
        rec.save(os.path.join(args.out, f"02_tensor_parallel.{'sp' if sp else 'tp'}.calls.json"),
                 lab="02_tensor_parallel", sequence_parallel=sp, world_size=n, dp=dp, tp=tp,
                 dtype=dtype_name(dtype))
    for sp in (False, True):
        sl = slice(tp_rank * S // tp, (tp_rank + 1) * S // tp) if sp else slice(None)
        rec = Recording({"tp": group})
        y, dx, grads = dtensor_run(params, A, xb, dyb, mesh["tp"], sp, device, dtype, dp_group, rec)
        name = "DTensor" + (", SequenceParallel" if sp else "")
        check(name, y, dx, grads, sl, sharded=False)
        mine, hand_bytes = as_sets(gather_calls(rec)), sum(c.nbytes for c in hand[sp][0])
        line = expect_same_calls(f"{name:>26s}", mine, as_sets(dtensor_expected(n, tp, sp, B_PER_DP * S * D * item)),
                                 "each rank's as a set", ("DTensor", "plan"))
        say(f"{line} ({sum(c.nbytes for c in mine[0])} B passed in by rank 0; the hand-written block {hand_bytes} B)")
    # the TP all-reduces of one layer, timed, beside the model
    b, s, h = (1, 4096, 8192) if device.type == "cuda" else (1, 256, 512)
    act = torch.zeros(b * s * h, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32, device=device)
    t = timed(lambda: dist.all_reduce(act, group=group), device, args.iters, group=group)
    model = collective_time("all_reduce", act.numel() * act.element_size(), tp,
                            Topology(gpus_per_node=args.gpus_per_node))
    say(f"TP all-reduce of {act.numel() * act.element_size() / 1e6:.1f} MB over {tp} ranks (b={b}, s={s}, h={h}): "
        f"{t * 1e6:.1f} us; four per layer {4 * t * 1e3:.3f} ms | emulator's model {4 * model * 1e3:.3f} ms")
    say("OK: the hand-written TP and SP blocks and DTensor's match the dense block; calls written to " + args.out)
    finish()


if __name__ == "__main__":
    main()
