"""Lesson 00 on real hardware: collectives measured as nccl-tests does, beside the model.

    torchrun --standalone --nproc-per-node N -m gpu_labs.00_collectives

NCCL on GPUs (one rank per GPU), gloo on the CPU otherwise (``--backend`` overrides).
For all_reduce, reduce_scatter and all_gather over ``--sizes`` (bytes per rank) it prints
time (warm-ups, then the median of several batches of ``--iters`` back-to-back calls, the
slowest rank's), algorithm bandwidth and bus bandwidth as nccl-tests defines them, and beside each
line the emulator's alpha-beta prediction for the same world size on ``--gpus-per-node``
H100/H200 GPUs per node (NVLink inside, one NDR NIC per GPU between nodes, NCCL-like
channels). Then it runs the ring all-reduce of Exercise 0.4, built from point-to-point
calls posted together with ``batch_isend_irecv`` (a send-then-recv ring can hang on NCCL,
NVIDIA/nccl#479: a send waits for its receiver), checks it against ``dist.all_reduce``,
and writes its calls to ``--out``/00_collectives.calls.json, the format of
``emulator.records.calls``, and compares them with the calls ``emulator.algorithms.p2p_ring`` makes. Exits
non-zero with a message naming the rank if any result, or any call, is wrong or missing.

Examples:
    torchrun --standalone --nproc-per-node 8 -m gpu_labs.00_collectives --sizes 1e3,1e6,1e9
    torchrun --standalone --nproc-per-node 4 -m gpu_labs.00_collectives --backend gloo --iters 5
"""

if not __package__:  # started by its path: its imports are relative to the gpu_labs package
    raise SystemExit(f"start {__file__.rsplit('/', 1)[-1]} as a module, from the course's folder: "
                     f"torchrun --standalone --nproc-per-node 4 -m gpu_labs.{__file__.rsplit('/', 1)[-1][:-3]}")

import os
import time

import numpy as np
import torch
import torch.distributed as dist

from .call_trace import Recorder
from .checks import expect_match, expect_same_calls, gather_calls
from .common import all_gather_into_tensor, base_parser, finish, header, init, reduce_scatter_tensor, say, timed

from emulator import World
from emulator.algorithms.p2p_ring import ring_all_reduce_p2p
from emulator.cost import busbw, collective_time
from emulator.machine.topology import Topology


def parse():
    ap = base_parser(__doc__)
    ap.add_argument("--sizes", default=None,
                    help="bytes per rank, comma separated (default: 1e3,1e5,1e7 on CPU; up to 1 GB on GPUs, "
                         "where the bandwidth regime starts above a few hundred MB)")
    ap.add_argument("--iters", type=int, default=20, help="calls per size, timed back to back (nccl-tests' way)")
    ap.add_argument("--gpus-per-node", type=int, default=8, help="topology for the model's prediction")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    ap.add_argument("--self-test-fault", choices=["wrong-value", "drop-output", "drop-call", "stall"],
                    help="damage the last rank's ring result (one value wrong, its last chunk missing) or its "
                         "trace (one call missing), to prove a check catches it; or stall it, to prove the "
                         "others give up after --timeout")
    return ap.parse_args()


def ring_all_reduce(x, rank, n, rec):
    """The ring of Exercise 0.4 (``emulator.algorithms.p2p_ring``) with torch point-to-point:
    reduce-scatter, then all-gather; each step's send and receive posted together."""
    chunks = list(x.clone().chunk(n))
    right, left = (rank + 1) % n, (rank - 1) % n

    def exchange(chunk):
        buf = torch.empty_like(chunk)
        for work in rec.batch_isend_irecv([("send", chunk.contiguous(), right), ("recv", buf, left)]):
            work.wait()
        return buf

    for s in range(n - 1):  # reduce-scatter: pass chunk (r-s-1), add into chunk (r-s-2)
        c = (rank - s - 2) % n
        chunks[c] = chunks[c] + exchange(chunks[(rank - s - 1) % n])
    for s in range(n - 1):  # all-gather: pass the newest complete chunk
        chunks[(rank - s - 1) % n] = exchange(chunks[(rank - s) % n])
    return torch.cat(chunks)


def main():
    args = parse()
    rank, n, device = init(args.backend, args.timeout)
    dtype = getattr(torch, args.dtype)
    topo = Topology(gpus_per_node=args.gpus_per_node)
    default = "1e3,1e5,1e7,2.56e8,1e9" if device.type == "cuda" else "1e3,1e5,1e7"
    sizes = [int(float(s)) for s in (args.sizes or default).split(",")]
    say(f"# {n} ranks, {header(device)}, {args.dtype}; "
        f"model (the emulator's H100/H200 figures): {args.gpus_per_node} GPUs per node, NVLink "
        f"{topo.nvlink.beta / 1e9:.0f} GB/s, "
        f"a {topo.nic.beta / 1e9:.0f} GB/s NIC per GPU, {topo.channels} channels")
    say(f"{'op':>15} {'bytes':>10} {'time us':>10} {'algbw GB/s':>11} {'busbw GB/s':>11}"
        f" {'model us':>10} {'model busbw':>12}")
    item = torch.empty((), dtype=dtype).element_size()
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        for nbytes in sizes:
            elems = max(n, nbytes // item // n * n)  # divisible by n
            x = torch.full((elems,), float(rank + 1), dtype=dtype, device=device)
            if op == "all_reduce":
                def run():
                    dist.all_reduce(x)
                size = elems * item
            elif op == "reduce_scatter":
                out = torch.empty(elems // n, dtype=dtype, device=device)

                def run():
                    reduce_scatter_tensor(out, x)
                size = elems * item
            else:
                shard = x[: elems // n].clone()
                out = torch.empty(elems, dtype=dtype, device=device)

                def run():
                    all_gather_into_tensor(out, shard)
                size = elems * item  # nccl-tests' size for all_gather: the gathered result
            t = timed(run, device, args.iters)
            model = collective_time(op, size, n, topo)
            model_bw = busbw(op, size, n, model) / 1e9 if model > 0 else float("nan")
            say(f"{op:>15} {size:>10} {t * 1e6:>10.1f} {size / t / 1e9:>11.3f} {busbw(op, size, n, t) / 1e9:>11.3f}"
                f" {model * 1e6:>10.1f} {model_bw:>12.1f}")
    if args.self_test_fault == "stall" and rank == n - 1:  # a rank that never joins the next collective
        time.sleep(10 * args.timeout)
    # correctness: our reduce_scatter/all_gather results, and the hand-written ring
    g = torch.Generator(device="cpu").manual_seed(1234 + rank)
    x = torch.randn(64 * n, generator=g, dtype=torch.float64).to(device)
    ref = x.clone()
    dist.all_reduce(ref)
    rec = Recorder()
    ours = ring_all_reduce(x, rank, n, rec)
    if rank == n - 1 and args.self_test_fault == "wrong-value":
        ours[0] += 1.0
    if rank == n - 1 and args.self_test_fault == "drop-output":
        ours = ours[:-64]
    if rank == n - 1 and args.self_test_fault == "drop-call":
        rec.calls.pop()
    expect_match("ring all-reduce from point-to-point calls, against dist.all_reduce,", {"result": ours},
                 {"result": ref}, 1e-12, rank)
    rs = torch.empty(64, dtype=torch.float64, device=device)
    reduce_scatter_tensor(rs, x)
    expect_match("reduce_scatter_tensor, against the matching slice of all_reduce,", {"slice": rs},
                 {"slice": ref[rank * 64:(rank + 1) * 64]}, 1e-12, rank)
    world = World(n)  # the lesson's ring on the emulator, same size
    world.run(lambda comm: ring_all_reduce_p2p(comm, np.zeros(64 * n)))
    calls = expect_same_calls("the ring all-reduce", gather_calls(rec), world.calls)
    path = rec.save(os.path.join(args.out, "00_collectives.calls.json"), lab="00_collectives", elements=64 * n,
                    dtype="float64")
    say(f"OK: ring all-reduce (batch_isend_irecv, {2 * (n - 1)} steps) matches dist.all_reduce on every rank; "
        f"reduce_scatter matches all_reduce's slices; {calls}; calls written to {path}")
    finish()


if __name__ == "__main__":
    main()
