"""Lesson 05 on real hardware: an expert-parallel MoE layer over all_to_all_single, against
the dense layer in one process.

    torchrun --standalone --nproc-per-node N gpu_labs/05_expert_parallel.py

N ranks form one expert-parallel group. The layer (``gpu_labs/torch_parallel/
expert_parallel.py``) routes each rank's tokens, exchanges the per-expert counts, dispatches
the rows with ``all_to_all_single`` and split sizes, runs its experts, and combines; autograd
runs the backward (two more all-to-alls). Outputs, input gradients and every parameter
gradient must equal the whole layer run in one process on every rank's tokens (exits
non-zero naming the tensor and rank otherwise). The calls go to
``--out``/05_expert_parallel.calls.json (the format of ``emulator.records.calls``); a test checks
they are the emulator's expert-parallel layer's calls. Then the dispatch and combine of a
larger layer are timed, beside the emulator's prediction for the same split sizes. NCCL
on GPUs, gloo on the CPU (``--backend`` overrides); N must divide 8 (the experts).
"""

import contextlib
import os
import time

import numpy as np
import torch
import torch.distributed as dist

from common import add_dtype_option, base_parser, fail, finish, init, lab_dtype, say, sync
from torch_parallel.expert_parallel import ep_moe
from trace import Recorder

from emulator import Topology, World, nn
from emulator.nn import torch_reference as R
from emulator.nn.moe import route
from emulator.parallel.expert_parallel import shard_experts

E, K, D, FF, T_PER_RANK = 8, 2, 16, 32, 12


def parse():
    ap = base_parser(__doc__)
    add_dtype_option(ap)
    ap.add_argument("--iters", type=int, default=5, help="timed layers")
    return ap.parse_args()


def layer_params(d, ff, np_dtype, seed=0):
    moe = nn.MoE(d, ff, E, K, dtype=np_dtype)
    p = moe.init(np.random.default_rng(seed))
    p["router.w"] = (p["router.w"] * 40).astype(np_dtype)  # an uneven router: uneven split sizes
    return moe, p


class Clock:
    """Time spent in all-to-alls on this rank (CUDA events on a GPU, wall time on a CPU)."""

    def __init__(self, device):
        self.device, self.spans = device, []

    @contextlib.contextmanager
    def __call__(self, name):
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self.spans.append((start, end))
        else:
            t = time.perf_counter()
            yield
            self.spans.append(time.perf_counter() - t)

    def seconds(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
            return sum(s.elapsed_time(e) / 1e3 for s, e in self.spans)
        return sum(self.spans)


def check(rank, n, device, dtype, tol, out_dir):
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    moe, p = layer_params(D, FF, np_dtype)
    rng = np.random.default_rng(1)
    x, dy = (rng.standard_normal((n * T_PER_RANK, D)).astype(np_dtype) for _ in range(2))
    full = {k: torch.tensor(v, device=device, requires_grad=True) for k, v in p.items()}
    xt = torch.tensor(x, device=device, requires_grad=True)
    ref = R.moe(full, xt, K)
    ref.backward(torch.tensor(dy, device=device))
    mine = {k: torch.tensor(v, device=device, requires_grad=True) for k, v in shard_experts(p, n, rank).items()}
    sl = slice(rank * T_PER_RANK, (rank + 1) * T_PER_RANK)
    xl = torch.tensor(x[sl], device=device, requires_grad=True)
    rec = Recorder()
    y = ep_moe(mine, xl, E, K, rec)
    y.backward(torch.tensor(dy[sl], device=device))
    per = E // n
    checks = {"output": (y, ref[sl]), "input gradient": (xl.grad, xt.grad[sl])}
    for k in p:
        want = full[k].grad if k == "router.w" else full[k].grad[rank * per:(rank + 1) * per]
        got = mine[k].grad
        if k == "router.w":  # this rank's part: the sum over ranks is the whole gradient
            got = got.clone()
            dist.all_reduce(got)
        checks[f"gradient of {k}"] = (got, want)
    for name, (got, want) in checks.items():
        err = float((got.detach() - want.detach()).abs().max())
        if err > tol:
            fail(f"expert parallel layer: the {name} on rank {rank} differs from the dense layer by {err:.3g}")
    say(f"{'expert parallel, ' + str(n) + ' ranks':>28s}: output, input gradient and {len(p)} parameter gradients "
        f"match the dense layer")
    rec.save(os.path.join(out_dir, "05_expert_parallel.calls.json"), lab="05_expert_parallel", world_size=n,
             dtype=str(dtype).removeprefix("torch."))


def timing(rank, n, device, dtype, iters):
    """All-to-all time of a larger layer's forward (dispatch and combine), beside the
    emulator running the same all-to-alls (same split sizes) on H100 nodes."""
    tokens, d = (4096, 1024) if device.type == "cuda" else (512, 64)
    np_dtype = np.float32
    moe, p = layer_params(d, 4 * d if device.type == "cuda" else d, np_dtype, seed=2)
    mine = {k: torch.tensor(v, device=device, dtype=dtype) for k, v in shard_experts(p, n, rank).items()}
    x = torch.tensor(np.random.default_rng(3 + rank).standard_normal((tokens, d)), device=device, dtype=dtype)
    for i in range(iters + 1):
        clock = Clock(device)
        sync(device)
        dist.barrier()
        with torch.no_grad():
            ep_moe(mine, x, E, K, Recorder(), clock=clock)
        if i == 0:
            continue  # warm-up
        seconds = clock.seconds()
    worst = torch.tensor(seconds, dtype=torch.float64, device=device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    # the emulator runs the same two all-to-alls (every rank's split sizes) on H100 nodes
    idx, _, _ = route(p["router.w"], x.detach().cpu().numpy().astype(np_dtype), K)
    send = np.bincount(idx.ravel(), minlength=E).reshape(n, E // n).sum(1)
    every = [None] * n
    dist.all_gather_object(every, send.tolist())
    if rank == 0:
        sends = np.array(every)  # [from rank, to rank] rows

        def dispatch_and_combine(comm):
            mine, theirs = sends[comm.rank].tolist(), sends[:, comm.rank].tolist()
            rows = comm.all_to_all_single(np.zeros((sum(mine), d), np.float32), theirs, mine)
            comm.all_to_all_single(rows, mine, theirs)

        world = World(n, topology=Topology())
        world.run(dispatch_and_combine)
        say(f"dispatch + combine of {tokens} tokens per rank, d={d}, top-{K} of {E} experts: measured "
            f"{float(worst) * 1e3:.3f} ms (slowest rank) | emulator's model on H100 NVLink "
            f"{max(world.stats().time) * 1e3:.3f} ms (float32 rows, the same split sizes)")


def main():
    args = parse()
    rank, n, device = init(args.backend)
    if E % n:
        fail(f"{n} ranks: the lab's {E} experts need a number of ranks that divides {E}")
    dtype, tol = lab_dtype(args.dtype, device)
    say(f"# {n} ranks, backend {dist.get_backend()}, {dtype}; MoE d={D}, d_ff={FF}, {E} experts, top-{K}, "
        f"{T_PER_RANK} tokens per rank; tolerance {tol:g}")
    dist.barrier()
    check(rank, n, device, dtype, tol, args.out)
    timing(rank, n, device, dtype, args.iters)
    say("OK: the expert-parallel layer matches the dense layer; calls written to " + args.out)
    finish()


if __name__ == "__main__":
    main()
