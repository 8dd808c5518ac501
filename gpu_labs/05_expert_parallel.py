"""Lesson 05 on real hardware: an expert-parallel MoE layer over all_to_all_single, against
the dense layer in one process.

    torchrun --standalone --nproc-per-node N -m gpu_labs.05_expert_parallel

N ranks form a device mesh: expert-parallel groups of ``--ep`` ranks inside a node
(default: the node's ranks, at most the 8 experts) and ``dp = N / ep`` copies of them
across nodes, whose expert gradients are summed over ``dp`` (so a 2 x 8 SLURM job runs
EP 8 inside each node and DP 2 across). The layer (``gpu_labs/torch_parallel/
expert_parallel.py``) routes each rank's tokens, exchanges the per-expert counts, dispatches
the rows with ``all_to_all_single`` and split sizes, runs its experts, and combines; autograd
runs the backward (two more all-to-alls). Outputs, input gradients and every parameter
gradient must equal the whole layer run in one process on every rank's tokens (exits
non-zero naming the tensor and rank otherwise; a missing one fails), and the calls must
be the emulator's expert-parallel layer's, call for call (written to
``--out``/05_expert_parallel.calls.json). Then the dispatch and combine all-to-alls of a
larger layer are timed alone, with that layer's split sizes (warm-ups, then the median
of several batches; no expert compute inside, so no waiting for a slower rank's
experts), beside the emulator's prediction for the same split sizes. NCCL on GPUs, gloo
on the CPU (``--backend`` overrides); ``--dtype bfloat16`` runs the layer in bf16.
"""

if not __package__:  # started by its path: its imports are relative to the gpu_labs package
    raise SystemExit(f"start {__file__.rsplit('/', 1)[-1]} as a module, from the course's folder: "
                     f"torchrun --standalone --nproc-per-node 4 -m gpu_labs.{__file__.rsplit('/', 1)[-1][:-3]}")

import os

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from .call_trace import Recorder
from .checks import expect_match, expect_same_calls, gather_calls
from .common import (add_dtype_option, base_parser, dtype_name, fail, finish, header, init, lab_dtype, reference_dtype,
                    say, timed)
from .torch_parallel.expert_parallel import ep_moe

from emulator import Topology, World, nn
from emulator.nn import torch_reference as R
from emulator.nn.moe import route
from emulator.parallel import expert_parallel as ep
from emulator.parallel.expert_parallel import shard_experts
from emulator.records.calls import Call

E, K, D, FF, T_PER_RANK = 8, 2, 16, 32, 12


def parse():
    ap = base_parser(__doc__)
    add_dtype_option(ap)
    ap.add_argument("--iters", type=int, default=5, help="timed dispatch-and-combine pairs per batch")
    ap.add_argument("--ep", type=int, default=0, help="ranks per expert-parallel group (default: the ranks of a "
                                                      "node, at most 8); the rest of the world is data parallel")
    ap.add_argument("--self-test-fault", choices=["drop-gradient", "wrong-output", "drop-call"],
                    help="damage the last rank's result, to prove a check catches it")
    return ap.parse_args()


def mesh_shape(n, ep_size, local_ranks):
    """(dp, ep) for ``n`` ranks: ``ep`` as asked, else the node's ranks (at most the 8
    experts); it must divide both n and the experts."""
    ep_size = ep_size or min(local_ranks, E)
    if E % ep_size or n % ep_size:
        fail(f"{n} ranks with --ep {ep_size}: EP must divide the {E} experts and the {n} ranks; "
             f"pass --ep with one of {[e for e in (1, 2, 4, 8) if n % e == 0]}")
    return n // ep_size, ep_size


def layer_params(d, ff, np_dtype, seed=0):
    moe = nn.MoE(d, ff, E, K, dtype=np_dtype)
    p = moe.init(np.random.default_rng(seed))
    p["router.w"] = (p["router.w"] * 40).astype(np_dtype)  # an uneven router: uneven split sizes
    return moe, p


def emulator_calls(dp, ep_size, np_dtype, item):
    """The emulator's expert-parallel layer on the same mesh, layer and tokens."""
    moe, p = layer_params(D, FF, np_dtype)
    rng = np.random.default_rng(1)
    x, dy = (rng.standard_normal((dp * ep_size * T_PER_RANK, D)).astype(np_dtype) for _ in range(2))

    def prog(comm):
        g = comm.group("ep")
        local = ep.shard_experts(p, ep_size, g.rank)
        mine = slice(comm.rank * T_PER_RANK, (comm.rank + 1) * T_PER_RANK)
        y, cache = ep.forward(g, moe, local, x[mine])
        ep.backward(g, moe, local, cache, dy[mine])

    world = World(mesh={"dp": dp, "ep": ep_size})
    world.run(prog)
    scale = item / np.dtype(np_dtype).itemsize  # rows in the lab's dtype; the first call exchanges int64 counts
    return [[Call(c.op, c.group, c.nbytes if i == 0 else int(c.nbytes * scale), c.peer) for i, c in enumerate(per_rank)]
            for per_rank in world.calls]


def check(rank, n, dp, ep_size, groups, device, dtype, tol, out_dir, fault):
    ref_dtype = reference_dtype(dtype)
    moe, p = layer_params(D, FF, np.float64)
    rng = np.random.default_rng(1)
    x, dy = (rng.standard_normal((n * T_PER_RANK, D)) for _ in range(2))
    full = {k: torch.tensor(v, device=device, dtype=ref_dtype, requires_grad=True) for k, v in p.items()}
    xt = torch.tensor(x, device=device, dtype=ref_dtype, requires_grad=True)
    ref = R.moe(full, xt, K)
    ref.backward(torch.tensor(dy, device=device, dtype=ref_dtype))
    ep_group, dp_group = groups["ep"], groups["dp"]
    ep_rank = dist.get_rank(ep_group)
    mine = {k: torch.tensor(v, device=device, dtype=dtype, requires_grad=True)
            for k, v in shard_experts(p, ep_size, ep_rank).items()}
    sl = slice(rank * T_PER_RANK, (rank + 1) * T_PER_RANK)
    xl = torch.tensor(x[sl], device=device, dtype=dtype, requires_grad=True)
    rec = Recorder({"ep": ep_group})
    y = ep_moe(mine, xl, E, K, rec, group=ep_group)
    y.backward(torch.tensor(dy[sl], device=device, dtype=dtype))
    per = E // ep_size
    got, want = {"output": y, "input gradient": xl.grad}, {"output": ref[sl], "input gradient": xt.grad[sl]}
    for k in p:
        g = mine[k].grad
        if g is not None:  # sum over the ranks that saw other tokens: every rank for the router, dp for experts
            g = g.clone()
            dist.all_reduce(g, group=None if k == "router.w" else dp_group)
        got[f"gradient of {k}"] = g
        want[f"gradient of {k}"] = full[k].grad if k == "router.w" else full[k].grad[ep_rank * per:(ep_rank + 1) * per]
    if fault == "drop-gradient":
        got["gradient of experts.fc1.w"] = None
    if fault == "wrong-output":
        got["output"] = y + 1.0
    if fault == "drop-call":
        rec.calls.pop()
    err = expect_match("expert parallel layer, against the dense layer,", got, want, tol, rank)
    say(f"{'expert parallel, dp ' + str(dp) + ' x ep ' + str(ep_size):>28s}: output, input gradient and {len(p)} "
        f"parameter gradients match the dense layer (max error {err:.1e})")
    item = torch.empty((), dtype=dtype).element_size()
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    say(expect_same_calls(f"{'expert parallel':>28s}", gather_calls(rec), emulator_calls(dp, ep_size, np_dtype, item)))
    rec.save(os.path.join(out_dir, "05_expert_parallel.calls.json"), lab="05_expert_parallel", world_size=n, dp=dp,
             ep=ep_size, dtype=dtype_name(dtype))


def timing(rank, ep_size, ep_group, device, dtype, iters):
    """The dispatch and combine all-to-alls of a larger layer, timed alone with that
    layer's split sizes, beside the emulator running the same two all-to-alls on H100
    nodes."""
    tokens, d = (4096, 1024) if device.type == "cuda" else (512, 64)
    moe, p = layer_params(d, d, np.float32, seed=2)
    x = np.random.default_rng(3 + rank).standard_normal((tokens, d)).astype(np.float32)
    idx, _, _ = route(p["router.w"], x, K)  # the layer's routing, so the split sizes are a real layer's
    send = np.bincount(idx.ravel(), minlength=E).reshape(ep_size, E // ep_size).sum(1)
    every = [None] * ep_size
    dist.all_gather_object(every, send.tolist(), group=ep_group)
    sends = np.array(every)  # [from rank, to rank] rows
    me = dist.get_rank(ep_group)
    mine, theirs = sends[me].tolist(), sends[:, me].tolist()
    rows = torch.randn(sum(mine), d, device=device, dtype=dtype)
    arrived, back = torch.empty(sum(theirs), d, device=device, dtype=dtype), torch.empty_like(rows)

    def dispatch_and_combine():
        dist.all_to_all_single(arrived, rows, theirs, mine, group=ep_group)
        dist.all_to_all_single(back, arrived, mine, theirs, group=ep_group)

    t = timed(dispatch_and_combine, device, iters, group=ep_group)
    if rank == 0:
        item = torch.empty((), dtype=dtype).element_size()
        rows_dtype = {8: np.float64, 4: np.float32, 2: np.float16}[item]  # the model counts bytes: bf16's size

        def emulated(comm):
            a, b = sends[comm.rank].tolist(), sends[:, comm.rank].tolist()
            got = comm.all_to_all_single(np.zeros((sum(a), d), rows_dtype), b, a)
            comm.all_to_all_single(got, a, b)

        world = World(ep_size, topology=Topology())
        world.run(emulated)
        print(f"dispatch + combine of {tokens} tokens per rank, d={d}, top-{K} of {E} experts over {ep_size} ranks: "
              f"measured {t * 1e3:.3f} ms (median, slowest rank, no expert compute inside) | emulator's model on "
              f"H100/H200 NVLink figures {max(world.stats().time) * 1e3:.3f} ms (the same split sizes, "
              f"{dtype_name(dtype)} rows)", flush=True)


def main():
    args = parse()
    rank, n, device = init(args.backend, args.timeout)
    dp, ep_size = mesh_shape(n, args.ep, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    dtype, tol = lab_dtype(args.dtype, device)
    mesh = init_device_mesh(device.type, (dp, ep_size), mesh_dim_names=("dp", "ep"))
    groups = {"dp": mesh.get_group("dp"), "ep": mesh.get_group("ep")}
    say(f"# {n} ranks as dp {dp} x ep {ep_size}, {header(device)}, {dtype}; MoE d={D}, d_ff={FF}, {E} experts, "
        f"top-{K}, {T_PER_RANK} tokens per rank; tolerance {tol:g} (relative)")
    dist.barrier()
    check(rank, n, dp, ep_size, groups, device, dtype, tol, args.out, args.self_test_fault if rank == n - 1 else None)
    timing(rank, ep_size, groups["ep"], device, dtype, args.iters)
    say("OK: the expert-parallel layer matches the dense layer, call for call; calls written to " + args.out)
    finish()


if __name__ == "__main__":
    main()
