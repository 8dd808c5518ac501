"""Lesson 07 on real hardware: sharded checkpoints, resharding, and a restart after a crash.

    torchrun --standalone --nproc-per-node 4 -m gpu_labs.07_checkpoint --fresh
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun --standalone --nproc-per-node 4 --max-restarts 1 \
        -m gpu_labs.07_checkpoint --fresh --kill-rank 1 --kill-step 5

Trains the course GPT (``emulator.nn.GPT``'s parameters) with FSDP2 (``fully_shard``: every
parameter, and AdamW's state, sharded along dim 0 over the ranks) on a global batch split
over them, and saves a checkpoint with ``torch.distributed.checkpoint`` every ``--every``
steps into ``--ckpt-dir``/step_NNNNNNNN: each rank its shards, the coordinator the
``.metadata`` manifest, last. At start it resumes from the newest complete save in
``--ckpt-dir``, whatever number of ranks wrote it (DCP reads, for each of this rank's
shards, the parts of the saved chunks that overlap it; the lab checks that the emulator's
``reshard.overlap`` finds the same regions as DCP's planner). So:

* ``--stop-after K`` stops after step K (a planned stop); run again with another
  ``--nproc-per-node`` to go on resharded (4 ranks, then 2);
* ``--kill-rank R --kill-step S``: on the first attempt, rank R kills itself (SIGKILL) in
  the middle of step S, after its forward and before the gradients' reduce-scatter. The
  others wait in that collective; ``torchrun --max-restarts 1``'s elastic agent sees a
  worker die, stops every worker and starts them again; the new workers resume from the
  last complete checkpoint on their own. ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` gives each
  attempt a store of its own: by default torchrun's workers share its rendezvous store,
  where the restarted workers can find the dead ones' addresses and fail to connect
  (pytorch/pytorch issue 135712; the lab refuses to start without it).

After the last step the parameters are compared with a single-process run of every step
(AdamW in torch, the whole batch), and the lab prints what each save wrote and took
beside the emulator's cost of that save on Llama 3's storage (2 TB/s shared by 16,384
GPUs). NCCL on GPUs, gloo on the CPU (``--backend`` overrides).
"""

if not __package__:  # started by its path: its imports are relative to the gpu_labs package
    raise SystemExit(f"start {__file__.rsplit('/', 1)[-1]} as a module, from the course's folder: "
                     f"torchrun --standalone --nproc-per-node 4 -m gpu_labs.{__file__.rsplit('/', 1)[-1][:-3]}")

import os
import shutil
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # torch 2.4 keeps FSDP2 in a private module
    from torch.distributed._composable.fsdp import fully_shard

from .common import ARTIFACTS, TORCH_VERSION, add_dtype_option, base_parser, fail, finish, init, lab_dtype, say
from .torch_parallel.checkpointing import CourseGPT, latest_complete, load, overlaps, save, saved_bytes

from emulator import nn
from emulator.nn import torch_reference as R
from emulator.parallel.checkpoint import Storage
from emulator.training import synthetic_batches

V, D, H, FF, L, S = 16, 32, 2, 64, 2, 16
ADAMW = dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def parse():
    ap = base_parser(__doc__)
    ap.add_argument("--steps", type=int, default=8, help="steps of the whole training")
    ap.add_argument("--every", type=int, default=2, help="save a checkpoint every this many steps")
    ap.add_argument("--batch", type=int, default=12, help="global batch (a multiple of every world size used)")
    ap.add_argument("--ckpt-dir", default=os.path.join(ARTIFACTS, "07_checkpoint"),
                    help="a folder every node sees (default: %(default)s under the current folder)")
    ap.add_argument("--fresh", action="store_true", help="start from step 0: remove --ckpt-dir first")
    ap.add_argument("--stop-after", type=int, default=None, help="stop after this step (then run again)")
    ap.add_argument("--kill-rank", type=int, default=None)
    ap.add_argument("--kill-step", type=int, default=None, help="0-based step in which --kill-rank dies")
    ap.add_argument("--self-test-fault", action="store_true",
                    help="zero Adam's first moments after resuming, to prove the final check catches a bad restart")
    add_dtype_option(ap)
    return ap.parse_args()


def loss_fn(logits, y):
    return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))


def reference(params0, batches, device, dtype):
    """Every step on one process, the whole batch: the run that never stopped."""
    p = {k: torch.tensor(v, device=device, dtype=dtype, requires_grad=True) for k, v in params0.items()}
    opt = torch.optim.AdamW(p.values(), **ADAMW)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(R.gpt(p, x, L, H), y).backward()
        opt.step()
    return {k: v.detach() for k, v in p.items()}


def main():
    args = parse()
    rank, n, device = init(args.backend)
    dtype, tol = lab_dtype(args.dtype, device)
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    root = Path(args.ckpt_dir)
    if args.batch % n:
        fail(f"--batch {args.batch} does not split over {n} ranks; pass a multiple of {n}")
    if args.kill_rank is not None and os.environ.get("TORCH_DISABLE_SHARE_RDZV_TCP_STORE") != "1":
        fail("--kill-rank needs a restart that works: launch as TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 torchrun "
             "--max-restarts 1 ...; otherwise the restarted workers read the dead workers' addresses from the store "
             "torchrun shares with them, and cannot connect (pytorch/pytorch issue 135712)")
    if args.fresh and attempt == 0:
        if rank == 0:
            shutil.rmtree(root, ignore_errors=True)
        dist.barrier()
    if device.type == "cpu" and TORCH_VERSION < (2, 5):
        fail(f"torch {torch.__version__}'s FSDP2 (fully_shard) needs CUDA (it makes CUDA streams); run this lab on "
             f"GPUs, or on the CPU with torch 2.5 or later")
    mesh = init_device_mesh(device.type, (n,), mesh_dim_names=("dp",))
    params0 = nn.GPT(V, D, H, FF, L, S, dtype="float64").init(__import__("numpy").random.default_rng(0))
    batches = [(torch.tensor(x, device=device), torch.tensor(y, device=device))
               for x, y in synthetic_batches(args.steps, args.batch, S, V, seed=1)]
    model = CourseGPT(params0, L, H, device, dtype)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    train = {"step": torch.tensor(0), "world_size": torch.tensor(n), "rng": torch.get_rng_state()}
    say(f"# {n} ranks, backend {dist.get_backend()}, {dtype}, attempt {attempt}; checkpoints in {root}")

    start = 0
    last = latest_complete(root)
    if last is not None:
        train = load(last, model, opt, train)
        start, saved_by = int(train["step"]), int(train["world_size"])
        torch.set_rng_state(train["rng"])
        compared, differ = overlaps(last, model)
        if differ:
            fail(f"the emulator's overlap differs from DCP's planner for {differ[0]}")
        say(f"resumed from {last.name}: step {start}, saved by {saved_by} ranks, loaded on {n}; for rank {rank}'s "
            f"shards, DCP's planner and emulator.parallel.reshard agree on all {compared} (saved chunk, shard) "
            f"overlaps")
        if args.self_test_fault:  # forget Adam's moments after loading: the check below must catch it
            for st in opt.state.values():
                st["exp_avg"].zero_()
    stop = args.steps if args.stop_after is None else min(args.steps, args.stop_after)

    b = args.batch // n
    for step in range(start, stop):
        x, y = batches[step]
        opt.zero_grad()
        loss = loss_fn(model(x[rank * b:(rank + 1) * b]), y[rank * b:(rank + 1) * b])
        if attempt == 0 and rank == args.kill_rank and step == args.kill_step:
            print(f"rank {rank}: killing itself in the middle of step {step}", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        loss.backward()  # FSDP2 reduce-scatters the gradients: averaged over the ranks
        opt.step()
        done = step + 1
        if done % args.every == 0 or done == stop:
            train = {"step": torch.tensor(done), "world_size": torch.tensor(n), "rng": torch.get_rng_state()}
            folder = root / f"step_{done:08d}"
            dist.barrier()
            t = time.perf_counter()
            save(folder, model, opt, train)
            seconds = time.perf_counter() - t
            nbytes = saved_bytes(folder)
            say(f"step {done}: saved {nbytes:,} bytes ({nbytes // n:,} per rank on average) in {seconds * 1e3:.1f} "
                f"ms; on "
                f"Llama 3's storage ({Storage().write_bandwidth / 1e6:.0f} MB/s per GPU) the emulator charges "
                f"{Storage().write_seconds(nbytes / n) * 1e3:.3f} ms synchronous, "
                f"{Storage().copy_seconds(nbytes / n) * 1e6:.1f} us asynchronous")

    if stop == args.steps:
        got = model.full()
        want = reference(params0, batches, device, dtype)
        worst = max(float((got[k] - want[k]).abs().max()) for k in want)
        if worst > tol:
            fail(f"after {args.steps} steps the parameters differ from the single-process run by {worst:.3g} "
                 f"(allowed {tol:g})")
        say(f"OK: after {args.steps} steps (started at step {start}, attempt {attempt}) the parameters equal the "
            f"single-process run's (largest difference {worst:.1e}, allowed {tol:g})")
    else:
        say(f"stopped after step {stop}; run again (with any number of ranks that divides --batch) to go on")
    finish()


if __name__ == "__main__":
    main()
