"""Lesson 04 on real hardware: ring attention, forward and backward, over point-to-point
calls, against attention on the whole sequence.

    torchrun --standalone --nproc-per-node C -m gpu_labs.04_context_parallel

C ranks split one sequence (the emulator's ``split_sequence``, contiguous or zigzag). Ring
attention (``gpu_labs/torch_parallel/ring_attention.py``) runs forward and backward with
``batch_isend_irecv``, causal and not, in both layouts; outputs and the gradients of q, k
and v must equal ``torch.nn.functional.scaled_dot_product_attention`` on the whole
sequence (exits non-zero naming the case and rank otherwise; a missing gradient fails).
The calls of every case must be the emulator's ring's (``emulator.parallel.context_parallel``),
call for call; those of the causal zigzag case go to ``--out``/04_context_parallel.calls.json.
Then the ring's forward is timed three ways at a larger size (compute only, transfers
only, both; warm-ups, then the median of several batches) and the share of the shorter
one hidden is printed beside the emulator's model of one step. On GPUs, torch's
experimental ``context_parallel`` is compared too, forward and backward; the lab says
plainly when it did not run, and why. NCCL on GPUs, gloo on the CPU (``--backend``
overrides); ``--dtype bfloat16`` runs the ring in bf16 (it accumulates in float32).
"""

if not __package__:  # started by its path: its imports are relative to the gpu_labs package
    raise SystemExit(f"start {__file__.rsplit('/', 1)[-1]} as a module, from the course's folder: "
                     f"torchrun --standalone --nproc-per-node 4 -m gpu_labs.{__file__.rsplit('/', 1)[-1][:-3]}")

import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from .call_trace import Recorder
from .checks import expect_match, expect_same_calls, gather_calls
from .common import (add_dtype_option, base_parser, dtype_name, finish, header, init, lab_dtype, reference_dtype,
                    say, timed)
from .torch_parallel.ring_attention import compute_only, ring_attention

from emulator import Topology, World
from emulator.parallel import context_parallel as cp
from emulator.parallel.context_parallel import LAYOUTS, split_sequence
from emulator.records.calls import Call

B, H, S_PER_RANK, D = 2, 4, 16, 8


def parse():
    ap = base_parser(__doc__)
    add_dtype_option(ap)
    ap.add_argument("--iters", type=int, default=5, help="timed forwards per batch")
    ap.add_argument("--self-test-fault", choices=["drop-gradient", "wrong-output", "drop-call"],
                    help="damage the last rank's causal zigzag result, to prove a check catches it")
    return ap.parse_args()


def shards(x, c, layout, rank, device, dtype, grad=False):
    part = split_sequence(x, c, layout)[rank]
    return torch.tensor(part, device=device, dtype=dtype, requires_grad=grad)


def emulator_calls(c, causal, layout, item):
    """The emulator's ring, forward and backward, on the lab's shard shape."""
    x = np.zeros((B, H, S_PER_RANK, D), np.float32)

    def prog(comm):
        o, cache = cp.ring_attention(comm, x, x, x, causal=causal, layout=layout)
        cp.ring_attention_backward(comm, cache, o)

    world = World(c)
    world.run(prog)
    return [[Call(k.op, k.group, k.nbytes // 4 * item, k.peer) for k in per_rank] for per_rank in world.calls]


def check_case(causal, layout, rank, c, device, dtype, tol, rec, fault=None):
    rng = np.random.default_rng(7)
    q, k, v, do = (rng.standard_normal((B, H, S_PER_RANK * c, D)) for _ in range(4))
    ref_dtype = reference_dtype(dtype)
    full = [torch.tensor(a, device=device, dtype=ref_dtype, requires_grad=True) for a in (q, k, v)]
    ref = F.scaled_dot_product_attention(*full, is_causal=causal)
    ref.backward(torch.tensor(do, device=device, dtype=ref_dtype))
    mine = [shards(a, c, layout, rank, device, dtype, grad=True) for a in (q, k, v)]
    out = ring_attention(*mine, causal=causal, layout=layout, rec=rec)
    out.backward(shards(do, c, layout, rank, device, dtype))
    got = {"output": out, "dq": mine[0].grad, "dk": mine[1].grad, "dv": mine[2].grad}
    if fault == "drop-gradient":
        got["dk"] = None
    if fault == "wrong-output":
        got["output"] = out + 1.0
    if fault == "drop-call":
        rec.calls.pop()
    want = {"output": ref, "dq": full[0].grad, "dk": full[1].grad, "dv": full[2].grad}
    want = {key: shards(w.detach().cpu().numpy(), c, layout, rank, device, ref_dtype) for key, w in want.items()}
    name = f"{'causal' if causal else 'full'}, {layout}"
    err = expect_match(f"ring attention ({name}), against attention on the whole sequence,", got, want, tol, rank)
    say(f"{'ring attention, ' + name:>34s}: output, dq, dk, dv match the whole-sequence attention (max error "
        f"{err:.1e})")
    item = torch.empty((), dtype=dtype).element_size()
    say(expect_same_calls(f"{'ring attention, ' + name:>34s}", gather_calls(rec),
                          emulator_calls(c, causal, layout, item)))


def torch_context_parallel(c, device, dtype, tol):
    """torch's experimental context_parallel (flash / memory-efficient SDPA on CUDA only),
    forward and backward, against SDPA on the whole sequence. Returns a line to print."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel  # not in torch 2.4: reached only when present
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard  # not in torch 2.4: likewise

    mesh = init_device_mesh("cuda", (c,), mesh_dim_names=("cp",))
    rng = np.random.default_rng(8)
    q, k, v, do = (torch.tensor(rng.standard_normal((B, H, 128 * c, 64)), device=device, dtype=dtype)
                   for _ in range(4))
    full = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ref = F.scaled_dot_product_attention(*full, is_causal=True)
    ref.backward(do)
    qs, ks, vs, dos = (t.clone() for t in (q, k, v, do))  # context_parallel shards these in place
    with context_parallel(mesh, buffers=[qs, ks, vs, dos], buffer_seq_dims=[2, 2, 2, 2]):
        leaves = [t.requires_grad_(True) for t in (qs, ks, vs)]
        out = F.scaled_dot_product_attention(*leaves, is_causal=True)
        out.backward(dos)
    got = context_parallel_unshard(mesh, [out.detach()] + [t.grad for t in leaves], [2, 2, 2, 2])
    want = [ref.detach()] + [t.grad for t in full]
    err = expect_match("torch's context_parallel, against attention on the whole sequence,",
                       dict(zip(("output", "dq", "dk", "dv"), got)), dict(zip(("output", "dq", "dk", "dv"), want)),
                       10 * tol, dist.get_rank())
    return (f"{'torch context_parallel (causal)':>34s}: output, dq, dk, dv match the whole-sequence attention "
            f"(max error {err:.1e})")


def try_torch_context_parallel(c, device, dtype, tol):
    """Run :func:`torch_context_parallel` where it can run; else say why not. A run that
    starts and gives a wrong answer fails the lab; only a missing or refusing API is
    reported and skipped."""
    if device.type != "cuda":
        return "torch's context_parallel: not run: it needs CUDA (flash or memory-efficient attention)"
    try:
        from torch.distributed.tensor.experimental import context_parallel  # noqa: F401  # not in torch 2.4: checked here
    except ImportError as exc:
        return f"torch's context_parallel: not run: this torch ({torch.__version__}) has none ({exc})"
    try:
        return torch_context_parallel(c, device, dtype, tol)
    except (NotImplementedError, RuntimeError, TypeError, ValueError) as exc:
        # an experimental API that refuses these shapes, this dtype or this GPU: say so, all ranks agree below
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    reasons = [None] * c
    dist.all_gather_object(reasons, reason)
    return f"torch's context_parallel: did NOT run, so it was not compared: {reasons[0]}"


def timing(c, rank, device, dtype, iters):
    """Forward of the ring at a larger size: compute only, transfers only, both (each the
    median of several timed batches after warm-ups, the slowest rank's)."""
    n, heads, d = (4096, 16, 128) if device.type == "cuda" else (256, 4, 32)
    x = torch.randn(3, 1, heads, n, d, device=device, dtype=dtype)
    q, k, v = x[0], x[1], x[2]
    kv = torch.stack([k, v])
    right, left = (rank + 1) % c, (rank - 1) % c

    def compute():
        compute_only(q, k, v, c)

    def transfer():
        for _ in range(c - 1):
            buf = torch.empty_like(kv)
            for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, right), dist.P2POp(dist.irecv, buf, left)]):
                w.wait()

    def both():
        ring_attention(q, k, v, rec=Recorder())

    times = {name: timed(fn, device, iters) for name, fn in (("compute", compute), ("transfer", transfer),
                                                             ("both", both))}
    topo = Topology()
    flops_step = 4 * heads * n * n * d
    bytes_step = kv.numel() * kv.element_size()
    model_compute, model_transfer = flops_step / topo.flops, (topo.nvlink.time(bytes_step) if c > 1 else 0.0)
    if c == 1:
        overlap = "one rank: nothing travels, so there is no overlap to measure"
    else:
        hidden = max(0.0, times["compute"] + times["transfer"] - times["both"]) / min(times["compute"],
                                                                                      times["transfer"])
        overlap = f"{min(hidden, 1):.0%} of the shorter one hidden"
    say(f"ring forward, {c} ranks x {n} positions, {heads} heads of {d}: compute {times['compute'] * 1e3:.2f} ms, "
        f"transfers {times['transfer'] * 1e3:.2f} ms, together {times['both'] * 1e3:.2f} ms: {overlap} | "
        f"emulator's model of one step on H100/H200 figures: compute {model_compute * 1e6:.2f} us, transfer "
        f"{model_transfer * 1e6:.1f} us over NVLink, so the "
        f"{'compute' if model_compute >= model_transfer else 'transfer'} bounds the step")


def main():
    args = parse()
    rank, c, device = init(args.backend, args.timeout)
    dtype, tol = lab_dtype(args.dtype, device)
    say(f"# {c} ranks, {header(device)}, {dtype}; b={B}, heads={H}, {S_PER_RANK} positions per rank, d={D}; "
        f"tolerance {tol:g} (relative)")
    dist.barrier()
    for causal in (False, True):
        for layout in LAYOUTS:
            rec = Recorder()
            fault = args.self_test_fault if causal and layout == "zigzag" and rank == c - 1 else None
            check_case(causal, layout, rank, c, device, dtype, tol, rec, fault)
            if causal and layout == "zigzag":
                rec.save(os.path.join(args.out, "04_context_parallel.calls.json"), lab="04_context_parallel",
                         world_size=c, dtype=dtype_name(dtype))
    say(try_torch_context_parallel(c, device, dtype, tol))
    timing(c, rank, device, dtype, args.iters)
    say("OK: ring attention forward and backward match attention on the whole sequence, call for call; calls "
        "written to " + args.out)
    finish()


if __name__ == "__main__":
    main()
