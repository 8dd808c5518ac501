"""Lesson 02 on real hardware: Megatron tensor (and sequence) parallelism by hand, against
the dense block and PyTorch's DTensor.

    torchrun --standalone --nproc-per-node N gpu_labs/02_tensor_parallel.py

N ranks form a one-axis device mesh (``tp``). A transformer block (the parameters of
``emulator.nn.TransformerBlock``) runs three ways:

* by hand (``gpu_labs/torch_parallel/tensor_parallel.py``): q/k/v and fc1 column-parallel,
  o and fc2 row-parallel, the f/g operators as autograd functions; then again with
  sequence parallelism (all-gather and reduce-scatter along the sequence, the norms'
  gradients all-reduced);
* with DTensor: ``parallelize_module`` with ``ColwiseParallel``, ``RowwiseParallel`` and,
  for sequence parallelism, ``SequenceParallel`` on the norms;
* densely on every rank, the reference.

Outputs, input gradients and every parameter gradient must agree with the dense block
(exits non-zero naming the variant and rank otherwise). The hand-written variants' calls
go to ``--out``/02_tensor_parallel.<tp|sp>.calls.json, in the format of ``emulator.records.calls``;
a test checks they are the calls ``emulator.parallel.tp_block`` makes. Last, the time of a
layer's four TP all-reduces at a realistic size (bf16, b=1, s=4096, h=8192 on GPUs) beside
the emulator's prediction. NCCL on GPUs, gloo on the CPU (``--backend`` overrides); N must
divide 8.
"""

import os
from types import SimpleNamespace

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from common import add_dtype_option, base_parser, fail, finish, init, lab_dtype, say, timed
from torch_parallel.tensor_parallel import TPBlock
from trace import Recorder

from emulator import Topology, nn
from emulator.cost import collective_time
from emulator.nn import torch_reference as R
from emulator.parallel.tp_block import TensorParallelBlock

D, A, FF, B, S = 64, 8, 256, 2, 16


def parse():
    ap = base_parser(__doc__)
    add_dtype_option(ap)
    ap.add_argument("--iters", type=int, default=10, help="timed all-reduces")
    ap.add_argument("--gpus-per-node", type=int, default=8, help="topology for the model's prediction")
    return ap.parse_args()


def shard_of(params, rank, n, sp=False):
    """This rank's parameters, cut exactly as the emulator's block cuts them."""
    return TensorParallelBlock(SimpleNamespace(size=n, rank=rank), D, A, FF, sequence_parallel=sp).shard(params)


class DenseBlock(torch.nn.Module):
    """The block as torch modules (for DTensor's parallelize_module); x @ w layout."""

    def __init__(self, params, device, dtype):
        super().__init__()

        def linear(key, d_in, d_out):
            lin = torch.nn.Linear(d_in, d_out, device=device, dtype=dtype)
            with torch.no_grad():
                lin.weight.copy_(torch.tensor(params[f"{key}.w"].T))
                lin.bias.copy_(torch.tensor(params[f"{key}.b"]))
            return lin

        def norm(key):
            ln = torch.nn.LayerNorm(D, eps=1e-5, device=device, dtype=dtype)
            with torch.no_grad():
                ln.weight.copy_(torch.tensor(params[f"{key}.g"]))
                ln.bias.copy_(torch.tensor(params[f"{key}.b"]))
            return ln

        self.ln1, self.ln2 = norm("ln1"), norm("ln2")
        self.attn = torch.nn.Module()
        for n in "qkvo":
            setattr(self.attn, n, linear(f"attn.{n}", D, D))
        self.attn.n_heads = A
        self.mlp = torch.nn.Module()
        self.mlp.fc1, self.mlp.fc2 = linear("mlp.fc1", D, FF), linear("mlp.fc2", FF, D)
        self.attn.forward, self.mlp.forward = self._attention, self._mlp

    def _attention(self, a):
        b, s = a.shape[:2]
        q, k, v = (getattr(self.attn, n)(a).reshape(b, s, self.attn.n_heads, -1).transpose(1, 2) for n in "qkv")
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.attn.o(o.transpose(1, 2).reshape(b, s, -1))

    def _mlp(self, a):
        return self.mlp.fc2(F.gelu(self.mlp.fc1(a), approximate="tanh"))

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.mlp(self.ln2(h))

    def grads(self):
        """Gradients keyed as the emulator's parameters (x @ w layout), full tensors."""
        def full(t):
            return t.full_tensor() if hasattr(t, "full_tensor") else t

        out = {"ln1.g": self.ln1.weight.grad, "ln1.b": self.ln1.bias.grad, "ln2.g": self.ln2.weight.grad,
               "ln2.b": self.ln2.bias.grad}
        for key, lin in [(f"attn.{n}", getattr(self.attn, n)) for n in "qkvo"] + [("mlp.fc1", self.mlp.fc1),
                                                                                 ("mlp.fc2", self.mlp.fc2)]:
            out[f"{key}.w"], out[f"{key}.b"] = lin.weight.grad, lin.bias.grad
        out = {k: full(v) for k, v in out.items()}
        return {k: v.T if k.endswith(".w") and not k.startswith("ln") else v for k, v in out.items()}


def dtensor_run(params, x, dy, mesh, sp, device, dtype):
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    block = DenseBlock(params, device, dtype)
    row = dict(output_layouts=Shard(1), use_local_output=False) if sp else {}
    plan = {f"attn.{n}": ColwiseParallel() for n in "qkv"}
    plan.update({"attn.o": RowwiseParallel(**row), "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel(**row)})
    if sp:
        plan.update({"ln1": SequenceParallel(), "ln2": SequenceParallel(),
                     "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                     "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))})
    parallelize_module(block, mesh, plan)
    block.attn.n_heads = A // mesh.size()
    n, r = mesh.size(), mesh.get_local_rank()
    sl = slice(r * S // n, (r + 1) * S // n) if sp else slice(None)
    xin = x[:, sl].clone().requires_grad_(True)
    inp = DTensor.from_local(xin, mesh, [Shard(1)]) if sp else xin
    y = block(inp)
    y_local = y.to_local() if sp else y
    (y_local * dy[:, sl]).sum().backward()
    return y_local.detach(), xin.grad, block.grads()


def main():
    args = parse()
    rank, n, device = init(args.backend)
    if 8 % n:
        fail(f"{n} ranks: the lab's block (8 heads, sequence 16) needs a number of ranks that divides 8")
    dtype, tol = lab_dtype(args.dtype, device)
    mesh = init_device_mesh(device.type, (n,), mesh_dim_names=("tp",))
    group = mesh.get_group("tp")
    params = nn.TransformerBlock(D, A, FF, dtype=np.float64).init(np.random.default_rng(0))
    x = torch.tensor(np.random.default_rng(1).standard_normal((B, S, D)), device=device, dtype=dtype)
    dy = torch.tensor(np.random.default_rng(2).standard_normal((B, S, D)), device=device, dtype=dtype)
    p = {k: torch.tensor(v, device=device, dtype=dtype, requires_grad=True) for k, v in params.items()}
    xr = x.clone().requires_grad_(True)
    y_ref = R.block(p, xr, n_heads=A)
    (y_ref * dy).sum().backward()
    g_ref = {k: v.grad.cpu().numpy() for k, v in p.items()}
    say(f"# {n} ranks, backend {dist.get_backend()}, {dtype}; block d={D}, heads={A}, d_ff={FF}, b={B}, s={S}; "
        f"tolerance {tol:g}")

    def check(name, y, dx, grads, sl):
        errs = {"output": float((y - y_ref[:, sl]).abs().max()), "input gradient": float((dx - xr.grad[:, sl]).abs().max())}
        want = shard_of(g_ref, rank, n) if name != "DTensor" and not name.startswith("DTensor") else g_ref
        for k, v in want.items():
            errs[f"grad {k}"] = float(np.abs(grads[k].detach().cpu().numpy() - v).max())
        worst = max(errs, key=errs.get)
        if errs[worst] > tol:
            fail(f"{name}: the {worst} differs from the dense block by {errs[worst]:.3g} (tolerance {tol:g})")
        say(f"{name:>22s}: output, input gradient and {len(want)} parameter gradients match (max error "
            f"{max(errs.values()):.1e})")

    for sp in (False, True):
        rec = Recorder({"tp": group})
        shard = {k: torch.tensor(v, device=device, dtype=dtype) for k, v in shard_of(params, rank, n, sp).items()}
        block = TPBlock(shard, A, rec, group, n, sequence_parallel=sp)
        sl = slice(rank * S // n, (rank + 1) * S // n) if sp else slice(None)
        xin = x[:, sl].clone().requires_grad_(True)
        y = block(xin)
        y.backward(dy[:, sl])
        block.sync_sequence_parallel_grads()
        check("by hand" + (", SP" if sp else ""), y.detach(), xin.grad,
              {k: block.w(k).grad for k in shard}, sl)
        rec.save(os.path.join(args.out, f"02_tensor_parallel.{'sp' if sp else 'tp'}.calls.json"),
                 lab="02_tensor_parallel", sequence_parallel=sp, world_size=n, dtype=str(dtype).removeprefix("torch."))
    for sp in (False, True):
        sl = slice(rank * S // n, (rank + 1) * S // n) if sp else slice(None)
        y, dx, grads = dtensor_run(params, x, dy, mesh, sp, device, dtype)
        check("DTensor" + (", SequenceParallel" if sp else ""), y, dx, grads, sl)
    # the TP all-reduces of one layer, timed, beside the model
    b, s, h = (1, 4096, 8192) if device.type == "cuda" else (1, 256, 512)
    act = torch.zeros(b * s * h, dtype=torch.bfloat16 if device.type == "cuda" else torch.float32, device=device)
    t = timed(lambda: dist.all_reduce(act, group=group), device, args.iters)
    model = collective_time("all_reduce", act.numel() * act.element_size(), n, Topology(gpus_per_node=args.gpus_per_node))
    say(f"TP all-reduce of {act.numel() * act.element_size() / 1e6:.1f} MB (b={b}, s={s}, h={h}): {t * 1e6:.1f} us; "
        f"four per layer {4 * t * 1e3:.3f} ms | emulator's model {4 * model * 1e3:.3f} ms")
    say("OK: the hand-written TP and SP blocks and DTensor's match the dense block; calls written to " + args.out)
    finish()


if __name__ == "__main__":
    main()
