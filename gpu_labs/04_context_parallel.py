"""Lesson 04 on real hardware: ring attention, forward and backward, over point-to-point
calls, against attention on the whole sequence.

    torchrun --standalone --nproc-per-node C gpu_labs/04_context_parallel.py

C ranks split one sequence (the emulator's ``split_sequence``, contiguous or zigzag). Ring
attention (``gpu_labs/torch_parallel/ring_attention.py``) runs forward and backward with
``batch_isend_irecv``, causal and not, in both layouts; outputs and the gradients of q, k
and v must equal ``torch.nn.functional.scaled_dot_product_attention`` on the whole
sequence (exits non-zero naming the case and rank otherwise). The calls of the causal
zigzag case go to ``--out``/04_context_parallel.calls.json (the format of
``emulator.records.calls``); a test checks they are the emulator's ring's calls. Then the ring's
forward is timed three ways at a larger size (compute only, transfers only, both) and
the overlap achieved is printed beside the emulator's model of one step. On GPUs, torch's
experimental ``context_parallel`` is compared too when it runs. NCCL on GPUs, gloo on the
CPU (``--backend`` overrides).
"""

import os

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from common import add_dtype_option, base_parser, fail, finish, init, lab_dtype, say, sync
from torch_parallel.ring_attention import compute_only, ring_attention
from trace import Recorder

from emulator import Topology
from emulator.parallel.context_parallel import LAYOUTS, split_sequence

B, H, S_PER_RANK, D = 2, 4, 16, 8


def parse():
    ap = base_parser(__doc__)
    add_dtype_option(ap)
    ap.add_argument("--iters", type=int, default=5, help="timed forwards")
    return ap.parse_args()


def shards(x, c, layout, rank, device, grad=False):
    part = split_sequence(x, c, layout)[rank]
    return torch.tensor(part, device=device, requires_grad=grad)


def check_case(causal, layout, rank, c, device, dtype, tol, rec):
    rng = np.random.default_rng(7)
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    q, k, v, do = (rng.standard_normal((B, H, S_PER_RANK * c, D)).astype(np_dtype) for _ in range(4))
    full = [torch.tensor(a, device=device, requires_grad=True) for a in (q, k, v)]
    ref = F.scaled_dot_product_attention(*full, is_causal=causal)
    ref.backward(torch.tensor(do, device=device))
    mine = [shards(a, c, layout, rank, device, grad=True) for a in (q, k, v)]
    out = ring_attention(*mine, causal=causal, layout=layout, rec=rec)
    out.backward(shards(do, c, layout, rank, device))
    got = {"output": out, "dq": mine[0].grad, "dk": mine[1].grad, "dv": mine[2].grad}
    want = {"output": ref, "dq": full[0].grad, "dk": full[1].grad, "dv": full[2].grad}
    name = f"{'causal' if causal else 'full'}, {layout}"
    for key in got:
        w = shards(want[key].detach().cpu().numpy(), c, layout, rank, device)
        err = float((got[key].detach() - w).abs().max())
        if err > tol:
            fail(f"ring attention ({name}): the {key} of rank {rank} differs from attention on the whole sequence "
                 f"by {err:.3g} (tolerance {tol:g})")
    say(f"{'ring attention, ' + name:>34s}: output, dq, dk, dv match the whole-sequence attention")


def torch_context_parallel(c, device, dtype, tol):
    """torch's experimental context_parallel (flash / memory-efficient SDPA on CUDA only)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel
    from torch.distributed.tensor.experimental._attention import context_parallel_unshard

    mesh = init_device_mesh("cuda", (c,), mesh_dim_names=("cp",))
    rng = np.random.default_rng(8)
    q, k, v = (torch.tensor(rng.standard_normal((B, H, 128 * c, 64)), device=device, dtype=dtype) for _ in range(3))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    qs, ks, vs = (t.clone() for t in (q, k, v))
    with context_parallel(mesh, buffers=[qs, ks, vs], buffer_seq_dims=[2, 2, 2]):
        out = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True)
    (whole,) = context_parallel_unshard(mesh, [out], [2])
    err = float((whole - ref).abs().max())
    if err > 10 * tol:
        fail(f"torch's context_parallel differs from attention on the whole sequence by {err:.3g}")
    say(f"{'torch context_parallel (causal)':>34s}: matches the whole-sequence attention (max error {err:.1e})")


def timing(c, rank, device, dtype, iters):
    """Forward of the ring at a larger size: compute only, transfers only, both."""
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

    times = {}
    for name, fn in (("compute", compute), ("transfer", transfer), ("both", both)):
        fn()
        dist.barrier()
        sync(device)
        t0 = torch.cuda.Event(enable_timing=True) if device.type == "cuda" else None
        if t0 is not None:
            t1 = torch.cuda.Event(enable_timing=True)
            t0.record()
        else:
            import time
            start = time.perf_counter()
        for _ in range(iters):
            fn()
        if t0 is not None:
            t1.record()
            t1.synchronize()
            seconds = t0.elapsed_time(t1) / 1e3 / iters
        else:
            seconds = (time.perf_counter() - start) / iters
        worst = torch.tensor(seconds, dtype=torch.float64, device=device)
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        times[name] = float(worst)
    hidden = max(0.0, times["compute"] + times["transfer"] - times["both"]) / max(1e-12, min(times["compute"],
                                                                                            times["transfer"]))
    topo = Topology()
    flops_step = 4 * heads * n * n * d
    bytes_step = kv.numel() * kv.element_size()
    model_compute, model_transfer = flops_step / topo.flops, topo.nvlink.time(bytes_step)
    say(f"ring forward, {c} ranks x {n} positions, {heads} heads of {d}: compute {times['compute'] * 1e3:.2f} ms, "
        f"transfers {times['transfer'] * 1e3:.2f} ms, together {times['both'] * 1e3:.2f} ms: {min(hidden, 1):.0%} of the "
        f"shorter one hidden | emulator's model of one step on H100s: compute {model_compute * 1e6:.1f} us, transfer "
        f"{model_transfer * 1e6:.1f} us over NVLink, so the {'compute' if model_compute >= model_transfer else 'transfer'}"
        f" bounds the step")


def main():
    args = parse()
    rank, c, device = init(args.backend)
    dtype, tol = lab_dtype(args.dtype, device)
    say(f"# {c} ranks, backend {dist.get_backend()}, {dtype}; b={B}, heads={H}, {S_PER_RANK} positions per rank, "
        f"d={D}; tolerance {tol:g}")
    dist.barrier()
    for causal in (False, True):
        for layout in LAYOUTS:
            rec = Recorder()
            check_case(causal, layout, rank, c, device, dtype, tol, rec)
            if causal and layout == "zigzag":
                rec.save(os.path.join(args.out, "04_context_parallel.calls.json"), lab="04_context_parallel",
                         world_size=c, dtype=str(dtype).removeprefix("torch."))
    if device.type == "cuda":
        try:
            torch_context_parallel(c, device, dtype, tol)
        except Exception as exc:  # noqa: BLE001 -- an experimental API: say why it did not run
            say(f"torch's experimental context_parallel did not run here: {type(exc).__name__}: {exc}")
    timing(c, rank, device, dtype, args.iters)
    say("OK: ring attention forward and backward match attention on the whole sequence; calls written to " + args.out)
    finish()


if __name__ == "__main__":
    main()
