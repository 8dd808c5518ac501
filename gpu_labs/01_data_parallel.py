"""Lesson 01 on real hardware: DDP and ZeRO-1/2/3 by hand, against torch's own.

    torchrun --standalone --nproc-per-node N gpu_labs/01_data_parallel.py

Trains the lesson's small GPT (the same parameters as ``emulator.nn.GPT``) for a few
steps on a global batch split over N ranks, six ways:

* by hand: DDP (one all-reduce per layer bucket), ZeRO-1 (reduce-scatter, update my
  slice, all-gather), ZeRO-2 (each layer's gradients reduce-scattered from a
  post-accumulate-grad hook as soon as backward finishes them, then dropped), ZeRO-3
  (layer by layer: all-gather, forward, free; in backward all-gather again, recompute the
  layer, backward, reduce-scatter, free);
* torch's ``DistributedDataParallel`` and FSDP2's ``fully_shard``.

Each is checked against a single-process run on the whole batch (same losses and
parameters after the steps; exits non-zero naming the variant and rank otherwise). For
the hand-written ones it prints, per rank, the bytes it held (parameters, gradients,
optimizer state, peak, from the same ledger the emulator keeps) and the bytes it sent
per step (ring algorithms, from the sizes of the collectives it called), beside the
emulator running the same program; on GPUs also ``torch.cuda.max_memory_allocated``.
NCCL on GPUs, gloo on the CPU (``--backend`` overrides).
"""

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from common import base_parser, fail, finish, init, say, sync

from emulator import World, nn
from emulator.cost import BUS_FACTOR
from emulator import data_parallel as DP
from emulator.memory import MemoryLedger
from emulator.nn import torch_reference as R

V, D, H, FF, L, S = 16, 32, 2, 64, 2, 16


def parse():
    ap = base_parser(__doc__)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8, help="global batch (a multiple of the world size)")
    ap.add_argument("--dtype", choices=["auto", "float64", "float32"], default="auto",
                    help="float64 on CPU (exact checks), float32 on GPU (default auto)")
    ap.add_argument("--self-test-fault", action="store_true",
                    help="perturb one gradient in the hand-written ZeRO-1, to prove the check catches it")
    return ap.parse_args()


def layer_forward(name, p, x):
    if name == "embed":
        return p["tok.w"][x] + p["pos.w"][: x.shape[1]]
    if name == "head":
        return R.layer_norm(p, x, "ln.") @ p["proj.w"]
    return R.block(p, x, "", H)


def loss_fn(logits, y):
    return F.cross_entropy(logits.reshape(-1, V), y.reshape(-1))


class Traffic:
    """Bytes this rank sends per collective under a ring algorithm: the collective's size
    (nccl-tests' convention: the gathered output for all_gather) times its bus factor."""

    def __init__(self, n):
        self.n, self.sent = n, 0

    def _count(self, op, t):
        self.sent += BUS_FACTOR[op](self.n) * t.numel() * t.element_size()

    def all_reduce(self, t):
        self._count("all_reduce", t)
        dist.all_reduce(t)

    def reduce_scatter(self, out, t):
        self._count("reduce_scatter", t)
        dist.reduce_scatter_single(out, t)

    def all_gather(self, out, t):
        self._count("all_gather", out)
        dist.all_gather_single(out, t)


class Flat:
    """A layer's tensors in the emulator's FlatLayout order (same padding, same slices)."""

    def __init__(self, layout, device, dtype):
        self.lay, self.device, self.dtype = layout, device, dtype

    def flatten(self, tensors):
        flat = torch.zeros(self.lay.padded, device=self.device, dtype=self.dtype)
        for k, off in zip(self.lay.names, self.lay.offsets):
            flat[off:off + tensors[k].numel()] = tensors[k].reshape(-1)
        return flat

    def unflatten(self, flat):
        return {k: flat[off:off + int(np.prod(s))].view(s)
                for k, off, s in zip(self.lay.names, self.lay.offsets, self.lay.shapes)}


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


def hand_written(stage, params0, batches, device, dtype, rank, n, fault=False):
    """One of DDP / ZeRO-1 / ZeRO-2 / ZeRO-3, on this rank. Returns (full params, local
    losses, ledger, bytes sent)."""
    model = nn.GPT(V, D, H, FF, L, S)
    lays = DP.layouts(model, params0, n)
    flats = {name: Flat(lay, device, dtype) for name, lay in lays.items()}
    names = list(lays)
    led, traffic = MemoryLedger(rank), Traffic(n)
    full = {name: {k: torch.tensor(v, device=device, dtype=dtype) for k, v in nn.sub(params0, name).items()}
            for name in names}
    shard_len = {name: lays[name].padded // n for name in names}
    shards = {name: flats[name].flatten(full[name])[rank * shard_len[name]:(rank + 1) * shard_len[name]].clone()
              .requires_grad_(True) for name in names}
    if stage == 0:
        for p in full.values():
            for t in p.values():
                t.requires_grad_(True)
        opt = torch.optim.AdamW([t for p in full.values() for t in p.values()], **adamw())
    else:
        opt = torch.optim.AdamW([shards[name] for name in names], **adamw())
    if stage == 3:
        full = None
        led.hold("params", {k: s.detach() for k, s in shards.items()}, "params")
    else:
        for p in full.values():
            for t in p.values():
                t.requires_grad_(True)
        led.hold("params", {f"{a}.{k}": t.detach() for a, p in full.items() for k, t in p.items()}, "params")
    losses = []
    for step, (x, y) in enumerate(batches):
        b = len(x) // n
        xl, yl = x[rank * b:(rank + 1) * b], y[rank * b:(rank + 1) * b]
        if stage < 3:
            hooks = []
            if stage == 2:  # reduce-scatter a layer as soon as all its gradients exist
                remaining = {name: len(full[name]) for name in names}

                def make_hook(name):
                    def hook(_):
                        remaining[name] -= 1
                        if remaining[name]:
                            return
                        flat = flats[name].flatten({k: t.grad for k, t in full[name].items()})
                        led.hold(f"fullgrad:{name}", flat, "buffers")
                        out = torch.empty(shard_len[name], device=device, dtype=dtype)
                        traffic.reduce_scatter(out, flat)
                        shards[name].grad = out / n
                        led.hold(f"grads:{name}", shards[name].grad, "grads")
                        led.release(f"fullgrad:{name}")
                        for t in full[name].values():
                            t.grad = None
                    return hook

                for name in names:
                    for t in full[name].values():
                        hooks.append(t.register_post_accumulate_grad_hook(make_hook(name)))
            p = {f"{a}.{k}": t for a, pp in full.items() for k, t in pp.items()}
            loss = loss_fn(R.gpt(p, xl, L, H), yl)
            loss.backward()
            for h in hooks:
                h.remove()
            if stage in (0, 1):
                for name in names:
                    led.hold(f"grads:{name}", [t.grad for t in full[name].values()], "grads")
            if stage == 0:
                for name in names:
                    flat = flats[name].flatten({k: t.grad for k, t in full[name].items()})
                    traffic.all_reduce(flat)
                    for k, g in flats[name].unflatten(flat / n).items():
                        full[name][k].grad = g.clone()
                opt.step()  # torch creates the optimizer state on the first step
                if step == 0:
                    led.hold("optimizer", opt_state_bytes(opt), "optimizer")
                opt.zero_grad()
            else:
                if stage == 1:
                    for name in names:
                        flat = flats[name].flatten({k: t.grad for k, t in full[name].items()})
                        if fault and rank == 0 and name == "head":
                            flat[0] += 1.0
                        out = torch.empty(shard_len[name], device=device, dtype=dtype)
                        traffic.reduce_scatter(out, flat)
                        shards[name].grad = out / n
                        for t in full[name].values():
                            t.grad = None
                opt.step()
                if step == 0:
                    led.hold("optimizer", opt_state_bytes(opt), "optimizer")
                opt.zero_grad()
                with torch.no_grad():
                    for name in names:
                        gathered = torch.empty(lays[name].padded, device=device, dtype=dtype)
                        traffic.all_gather(gathered, shards[name].detach())
                        for k, t in flats[name].unflatten(gathered).items():
                            full[name][k].copy_(t)
        else:
            loss = zero3_step(names, flats, shards, shard_len, lays, xl, yl, device, dtype, n, led, traffic)
            opt.step()
            if step == 0:
                led.hold("optimizer", opt_state_bytes(opt), "optimizer")
            opt.zero_grad()
        for name in names:
            if led.holds(f"grads:{name}"):
                led.release(f"grads:{name}")
        losses.append(loss.item())
    if stage == 3:
        result = {}
        for name in names:
            gathered = torch.empty(lays[name].padded, device=device, dtype=dtype)
            dist.all_gather_single(gathered, shards[name].detach())  # for the check only: not counted
            result.update({f"{name}.{k}": t for k, t in flats[name].unflatten(gathered).items()})
    else:
        result = {f"{a}.{k}": t.detach() for a, p in full.items() for k, t in p.items()}
    return result, losses, led, traffic.sent / len(batches)


def opt_state_bytes(opt):
    return sum(v.numel() * v.element_size() for st in opt.state.values() for k, v in st.items()
               if torch.is_tensor(v) and k != "step")


def zero3_step(names, flats, shards, shard_len, lays, x, y, device, dtype, n, led, traffic):
    """ZeRO-3 with per-layer recomputation: forward keeps only each layer's input."""

    def gather(name):
        full = torch.empty(lays[name].padded, device=device, dtype=dtype)
        traffic.all_gather(full, shards[name].detach())
        led.hold(f"gathered:{name}", full, "buffers")
        return full

    inputs, h = {}, x
    with torch.no_grad():
        for name in names:  # forward: gather, compute, free
            inputs[name] = h
            h = layer_forward(name, flats[name].unflatten(gather(name)), h)
            led.release(f"gathered:{name}")
    h = h.detach().requires_grad_(True)
    loss = loss_fn(h, y)
    (dy,) = torch.autograd.grad(loss, h)
    for name in reversed(names):  # backward: gather again, recompute, backward, reduce-scatter, free
        flat = gather(name).requires_grad_(True)
        xin = inputs.pop(name)
        xin = xin.detach().requires_grad_(xin.is_floating_point())
        out = layer_forward(name, flats[name].unflatten(flat), xin)
        wanted = [flat] + ([xin] if xin.requires_grad else [])
        grads = torch.autograd.grad(out, wanted, dy)
        led.release(f"gathered:{name}")
        shard = torch.empty(shard_len[name], device=device, dtype=dtype)
        traffic.reduce_scatter(shard, grads[0].contiguous())
        shards[name].grad = shard / n
        led.hold(f"grads:{name}", shards[name].grad, "grads")
        dy = grads[1] if len(grads) > 1 else None
    return loss


class TorchGPT(torch.nn.Module):
    def __init__(self, params0, device, dtype):
        super().__init__()
        self.p = torch.nn.ParameterDict({k.replace(".", "__"): torch.nn.Parameter(
            torch.tensor(v, device=device, dtype=dtype)) for k, v in params0.items()})

    def forward(self, x):
        return R.gpt({k.replace("__", "."): v for k, v in self.p.items()}, x, L, H)


def torch_ddp(params0, batches, device, dtype, rank, n):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(TorchGPT(params0, device, dtype), device_ids=[device.index] if device.type == "cuda" else None)
    train_module(model, batches, rank, n)
    return {k.replace("__", "."): v.detach() for k, v in model.module.p.items()}


def train_module(model, batches, rank, n):
    """Plain training steps on this rank's slice; the wrapper (DDP, FSDP2) does the rest."""
    opt = torch.optim.AdamW(model.parameters(), **adamw())
    for x, y in batches:
        b = len(x) // n
        opt.zero_grad()
        loss_fn(model(x[rank * b:(rank + 1) * b]), y[rank * b:(rank + 1) * b]).backward()
        opt.step()


def torch_fsdp2(params0, batches, device, dtype, rank, n):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    model = TorchGPT(params0, device, dtype)
    fully_shard(model, mesh=init_device_mesh(device.type, (n,)))
    train_module(model, batches, rank, n)
    return {k.replace("__", "."): v.full_tensor().detach() for k, v in model.p.items()}


def emulator_prediction(params0, batches, n, stage):
    """The same program on the emulator: per rank, bytes held (peak, by kind) and sent per step."""
    model = nn.GPT(V, D, H, FF, L, S, dtype=np.float64)
    world = World(n)
    np_batches = [(x.cpu().numpy(), y.cpu().numpy()) for x, y in batches]
    world.run(lambda c: DP.data_parallel_train(c, model, params0, np_batches, nn.AdamW(**adamw()), stage=stage))
    return world.memory_report(), [b / len(batches) for b in world.stats().bytes_sent]


def main():
    args = parse()
    rank, n, device = init(args.backend)
    dtype = {"auto": torch.float32 if device.type == "cuda" else torch.float64,
             "float64": torch.float64, "float32": torch.float32}[args.dtype]
    if args.batch % n:
        fail(f"--batch {args.batch} does not split over {n} ranks; use a multiple of {n}")
    tol = 1e-9 if dtype == torch.float64 else 2e-4
    params0 = nn.GPT(V, D, H, FF, L, S, dtype=np.float64).init(np.random.default_rng(0))
    batches = [(torch.tensor(x, device=device), torch.tensor(y, device=device))
               for x, y in DP.synthetic_batches(args.steps, args.batch, S, V, seed=1)]
    ref, ref_losses = reference(params0, batches, device, dtype)
    psi = sum(v.size for v in params0.values())
    say(f"# {n} ranks, backend {dist.get_backend()}, {dtype}; GPT with {psi:,d} parameters, "
        f"{args.steps} steps of a global batch of {args.batch}; tolerance {tol:g}")
    say(f"{'variant':>10} {'rank':>4} {'max|dp-ref|':>12} {'params B':>10} {'grads B':>9} {'optim B':>9} {'peak B':>9}"
        f" {'sent B/step':>12} | {'emulator: params':>16} {'grads':>8} {'optim':>8} {'sent':>9}")

    def check(name, params):
        err = max(float((params[k].double() - ref[k].double()).abs().max()) for k in ref)
        bad = torch.tensor([1.0 if err > tol else 0.0], dtype=torch.float64, device=device)
        dist.all_reduce(bad)
        if err > tol:
            fail(f"{name}: parameters differ from the single-process run by {err:.3g} (tolerance {tol:g})")
        if bad.item():
            fail(f"{name}: another rank's parameters differ from the single-process run")
        return err

    for stage, name in enumerate(["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]):
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        params, losses, led, sent = hand_written(stage, params0, batches, device, dtype, rank, n,
                                                 fault=args.self_test_fault and stage == 1)
        sync(device)
        err = check(f"hand-written {name}", params)
        mean_loss = torch.tensor(losses, dtype=torch.float64, device=device)
        dist.all_reduce(mean_loss)
        if not np.allclose(mean_loss.cpu().numpy() / n, ref_losses, rtol=1e-6 if dtype == torch.float64 else 1e-3):
            fail(f"hand-written {name}: losses {mean_loss.cpu().numpy() / n} differ from {ref_losses}")
        mine = [led.peak_by_kind["params"], led.peak_by_kind["grads"], led.peak_by_kind["optimizer"], led.peak, sent, err]
        if device.type == "cuda":
            mine.append(torch.cuda.max_memory_allocated(device))
        rows = [None] * n
        dist.all_gather_object(rows, mine)
        if rank == 0:
            emu, emu_sent = emulator_prediction(params0, batches, n, stage)
            for r, row in enumerate(rows):
                line = (f"{name:>10} {r:>4} {row[5]:>12.2e} {row[0]:>10,d} {row[1]:>9,d} {row[2]:>9,d} {row[3]:>9,d}"
                        f" {row[4]:>12,.0f} | {emu[r]['peak_params']:>16,d} {emu[r]['peak_grads']:>8,d}"
                        f" {emu[r]['peak_optimizer']:>8,d} {emu_sent[r]:>9,.0f}")
                if device.type == "cuda":
                    line += f"  cuda max allocated {row[6]:,d} B"
                say(line)
                if tuple(row[:3]) != (emu[r]["peak_params"], emu[r]["peak_grads"], emu[r]["peak_optimizer"]) \
                        or abs(row[4] - emu_sent[r]) > 1:
                    fail(f"hand-written {name}, rank {r}: bytes held or sent differ from the emulator's prediction")
        dist.barrier()
    say(f"{'torch DDP':>10} {check('torch DDP', torch_ddp(params0, batches, device, dtype, rank, n)):>12.2e}")
    say(f"{'FSDP2':>10} {check('FSDP2 fully_shard', torch_fsdp2(params0, batches, device, dtype, rank, n)):>12.2e}")
    say("OK: every variant matches the single-process run; hand-written memory and traffic match the emulator")
    finish()


if __name__ == "__main__":
    main()
