"""Lesson 01 on real hardware: DDP and ZeRO-1/2/3 by hand, against torch's own.

    torchrun --standalone --nproc-per-node N -m gpu_labs.01_data_parallel

Trains the lesson's small GPT (the same parameters as ``emulator.nn.GPT``) for a few
steps on a global batch split over N ranks of a one-axis device mesh (``dp``), six ways:
by hand, the four algorithms of ``emulator.parallel`` call for call (DDP, ZeRO-1, ZeRO-2,
ZeRO-3; see ``gpu_labs/torch_parallel/data_parallel.py``), then torch's
``DistributedDataParallel`` and FSDP2's ``fully_shard``.

Each is checked against a single-process run on the whole batch (same losses and
parameters after the steps; exits non-zero naming the variant and rank otherwise). For
the hand-written ones it prints, per rank, the bytes held (parameters, gradients,
optimizer state, from the same ledger the emulator keeps) and sent per step (ring
algorithms, from the sizes of the collectives called), beside the emulator running the
same program in the same dtype, and writes each variant's calls to
``--out``/01_data_parallel.zero<stage>.calls.json (the format of ``emulator.records.calls``),
comparing them with the emulator's, call for call. ``--dtype bfloat16`` trains in bf16
against a float64 reference (the emulator then runs in float32, its bytes halved to
bf16's). Every check covers every parameter: a missing one fails. On GPUs it also prints
``torch.cuda.max_memory_allocated``: everything the caching allocator handed out,
activations, temporaries and the reference runs' tensors included, so it exceeds the
ledger's sum. NCCL on GPUs, gloo on the CPU (``--backend`` overrides).
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

from .call_trace import Recorder
from .checks import differences, error, expect_same_calls_rank0
from .common import (TORCH_VERSION, add_dtype_option, base_parser, dtype_name, fail, fail_everywhere, finish, header, init, lab_dtype,
                    reference_dtype, say, sync)
from .torch_parallel.data_parallel import VARIANTS, Setup

from emulator import World, nn
from emulator.records.memory import MemoryLedger
from emulator.nn import torch_reference as R
from emulator.parallel import NAMES, data_parallel
from emulator.parallel.data_parallel.flat_layout import layouts
from emulator.records.calls import Call
from emulator.training import synthetic_batches, train

V, D, H, FF, L, S = 16, 32, 2, 64, 2, 16


def parse():
    ap = base_parser(__doc__)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8, help="global batch (a multiple of the world size)")
    add_dtype_option(ap)
    ap.add_argument("--self-test-fault", choices=["wrong-gradient", "drop-parameter", "drop-call"],
                    help="damage the hand-written ZeRO-1 on rank 0 (one gradient wrong, one parameter missing from "
                         "its result, one call missing from its trace), to prove a check catches it")
    return ap.parse_args()


def layer_forward(name, p, x):
    if name == "embed":
        return p["tok.w"][x] + p["pos.w"][: x.shape[1]]
    if name == "head":
        return R.layer_norm(p, x, "ln.") @ p["proj.w"]
    return R.block(p, x, "", H)


def loss_fn(logits, y):
    return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))


def adamw():
    return dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)


def reference(params0, batches, device, dtype):
    p = {k: torch.tensor(v, device=device, dtype=dtype, requires_grad=True) for k, v in params0.items()}
    opt = torch.optim.AdamW(p.values(), **adamw())
    losses = []
    for x, y in batches:
        opt.zero_grad()
        loss = loss_fn(R.gpt(p, x, L, H), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {k: v.detach() for k, v in p.items()}, losses


class TorchLayer(torch.nn.Module):
    """One layer of the course GPT as a torch module (the unit FSDP2 shards)."""

    def __init__(self, name, params, device, dtype):
        super().__init__()
        self.name = name
        self.p = torch.nn.ParameterDict({k.replace(".", "__"): torch.nn.Parameter(
            torch.tensor(v, device=device, dtype=dtype)) for k, v in params.items()})

    def forward(self, x):
        return layer_forward(self.name, {k.replace("__", "."): v for k, v in self.p.items()}, x)


class TorchGPT(torch.nn.Module):
    def __init__(self, params0, device, dtype):
        super().__init__()
        names = ["embed"] + [f"blocks.{i}" for i in range(L)] + ["head"]
        self.layers = torch.nn.ModuleList([TorchLayer(name, nn.sub(params0, name), device, dtype) for name in names])

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x

    def named(self, value=lambda t: t.detach()):
        return {f"{layer.name}.{k.replace('__', '.')}": value(v) for layer in self.layers for k, v in layer.p.items()}


def train_module(model, batches, rank, n):
    """Plain training steps on this rank's slice; the wrapper (DDP, FSDP2) does the rest."""
    opt = torch.optim.AdamW(model.parameters(), **adamw())
    for x, y in batches:
        b = len(x) // n
        opt.zero_grad()
        loss_fn(model(x[rank * b:(rank + 1) * b]), y[rank * b:(rank + 1) * b]).backward()
        opt.step()


def torch_ddp(params0, batches, device, dtype, rank, n):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(TorchGPT(params0, device, dtype), device_ids=[device.index] if device.type == "cuda" else None)
    train_module(model, batches, rank, n)
    return model.module.named()


def torch_fsdp2(params0, batches, device, dtype, rank, n, mesh):
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.4 keeps FSDP2 in a private module
        from torch.distributed._composable.fsdp import fully_shard

    model = TorchGPT(params0, device, dtype)
    for layer in model.layers:  # each layer its own unit, then the root, as the lesson shards
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    train_module(model, batches, rank, n)
    return model.named(lambda v: v.full_tensor().detach())


def emulator_run(params0, batches, n, zero_stage, dtype):
    """The lesson's algorithm on the emulator, same model, data and dtype (float32 for a
    bf16 run): (memory report, bytes sent per step by rank, calls by rank)."""
    np_dtype = np.float64 if dtype == torch.float64 else np.float32
    model = nn.GPT(V, D, H, FF, L, S, dtype=np_dtype)
    p = {k: v.astype(np_dtype) for k, v in params0.items()}
    world = World(mesh={"dp": n})
    np_batches = [(x.cpu().numpy(), y.cpu().numpy()) for x, y in batches]
    world.run(lambda c: train(c, model, data_parallel(zero_stage, c.group("dp"), model, p, nn.AdamW(**adamw())),
                              np_batches))
    return world.memory_report(), [b / len(batches) for b in world.stats().bytes_sent], world.calls


def main():
    args = parse()
    rank, n, device = init(args.backend, args.timeout)
    dtype, tol = lab_dtype(args.dtype, device)
    shrink = torch.empty((), dtype=dtype).element_size() / (8 if dtype == torch.float64 else 4)  # emulator -> lab bytes
    if args.batch % n:
        fail(f"--batch {args.batch} does not split over {n} ranks; use a multiple of {n}")
    mesh = init_device_mesh(device.type, (n,), mesh_dim_names=("dp",))
    group = mesh.get_group("dp")
    model = nn.GPT(V, D, H, FF, L, S, dtype=np.float64)
    params0 = model.init(np.random.default_rng(0))
    batches = [(torch.tensor(x, device=device), torch.tensor(y, device=device))
               for x, y in synthetic_batches(args.steps, args.batch, S, V, seed=1)]
    ref, ref_losses = reference(params0, batches, device, reference_dtype(dtype))
    psi = sum(v.size for v in params0.values())
    say(f"# {n} ranks, {header(device)}, {dtype}; GPT with {psi:,d} parameters, "
        f"{args.steps} steps of a global batch of {args.batch}; tolerance {tol:g} (relative)")
    say(f"{'variant':>10} {'rank':>4} {'max|dp-ref|':>12} {'params B':>10} {'grads B':>9} {'optim B':>9}"
        f" {'sent B/step':>12} | {'emulator: params':>16} {'grads':>8} {'optim':>8} {'sent':>9}")

    def check(name, params):
        """Every parameter against the single-process run, on every rank; all ranks stop if one is wrong."""
        wrong = differences(params, ref, tol)
        bad = torch.tensor([float(bool(wrong))], dtype=torch.float64, device=device)
        dist.all_reduce(bad)
        if wrong:
            fail(f"{name}: parameters differ from the single-process run on rank {rank}: " + "; ".join(wrong[:3]))
        fail_everywhere(f"{name}: another rank's parameters differ from the single-process run", bad.item() > 0)
        return max(error(params[k], ref[k]) for k in ref)

    for zero_stage, name in NAMES.items():
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        setup = Setup([n_ for n_, _ in model.layers], layouts(model, params0, n), params0, layer_forward, loss_fn,
                      lambda ts: torch.optim.AdamW(ts, **adamw()), device, dtype, group, Recorder({"dp": group}),
                      MemoryLedger(rank))
        fault = args.self_test_fault if zero_stage == 1 and rank == 0 else None
        extra = {"fault": fault == "wrong-gradient"} if zero_stage == 1 else {}
        params, losses = VARIANTS[zero_stage](setup, batches, **extra)
        if fault == "drop-parameter":
            params.pop(sorted(params)[0])
        if fault == "drop-call":
            setup.rec.calls.pop()
        sync(device)
        err = check(f"hand-written {name}", params)
        mean_loss = torch.tensor(losses, dtype=torch.float64, device=device)
        dist.all_reduce(mean_loss)
        if len(losses) != len(ref_losses) or not np.allclose(mean_loss.cpu().numpy() / n, ref_losses,
                                                              rtol=max(tol, 1e-6)):
            fail(f"hand-written {name}: losses {mean_loss.cpu().numpy() / n} differ from {ref_losses}")
        led, sent = setup.led, setup.rec.sent / len(batches)
        mine = [led.peak_by_kind["params"], led.peak_by_kind["grads"], led.peak_by_kind["optimizer"], sent, err]
        if device.type == "cuda":
            mine.append(torch.cuda.max_memory_allocated(device))
        rows = [None] * n
        dist.all_gather_object(rows, mine)
        setup.rec.save(os.path.join(args.out, f"01_data_parallel.zero{zero_stage}.calls.json"),
                       lab="01_data_parallel", zero_stage=zero_stage, world_size=n, steps=args.steps,
                       batch=args.batch, dtype=dtype_name(dtype))
        emu_calls = None
        if rank == 0:
            emu, emu_sent, emu_calls = emulator_run(params0, batches, n, zero_stage, dtype)
            emu = [{k: int(v * shrink) if k.startswith("peak_") else v for k, v in r.items()} for r in emu]
            emu_sent = [b * shrink for b in emu_sent]
            emu_calls = [[Call(c.op, c.group, int(c.nbytes * shrink), c.peer) for c in per_rank]
                         for per_rank in emu_calls]
            for r, row in enumerate(rows):
                line = (f"{name:>10} {r:>4} {row[4]:>12.2e} {row[0]:>10,d} {row[1]:>9,d} {row[2]:>9,d}"
                        f" {row[3]:>12,.0f} | {emu[r]['peak_params']:>16,d} {emu[r]['peak_grads']:>8,d}"
                        f" {emu[r]['peak_optimizer']:>8,d} {emu_sent[r]:>9,.0f}")
                if device.type == "cuda":
                    line += f"  cuda max allocated {row[5]:,d} B"
                say(line)
                if tuple(row[:3]) != (emu[r]["peak_params"], emu[r]["peak_grads"], emu[r]["peak_optimizer"]) \
                        or abs(row[3] - emu_sent[r]) > 1:
                    fail(f"hand-written {name}, rank {r}: bytes held or sent differ from the emulator's prediction")
        say(expect_same_calls_rank0(f"{name:>10}", setup.rec, emu_calls))
    say(f"{'torch DDP':>10} {check('torch DDP', torch_ddp(params0, batches, device, dtype, rank, n)):>12.2e}")
    if device.type == "cpu" and TORCH_VERSION < (2, 5):
        say(f"{'FSDP2':>10} not run: torch {torch.__version__}'s fully_shard makes CUDA streams, so it needs GPUs")
    else:
        fsdp = torch_fsdp2(params0, batches, device, dtype, rank, n, mesh)
        say(f"{'FSDP2':>10} {check('FSDP2 fully_shard', fsdp):>12.2e}")
    say("OK: every variant matches the single-process run; hand-written memory and traffic match the emulator; "
        f"calls written to {args.out}")
    finish()


if __name__ == "__main__":
    main()
