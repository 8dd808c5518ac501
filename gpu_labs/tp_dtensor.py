"""Lab 02's second way to split the block: PyTorch's DTensor, and the calls it should make.

* :class:`DenseBlock`: the parameters of ``emulator.nn.TransformerBlock`` as torch modules
  (``Linear`` and ``LayerNorm``), the form ``parallelize_module`` works on.
* :func:`dtensor_run`: the block split over a tp mesh with ``ColwiseParallel`` (q, k, v,
  fc1) and ``RowwiseParallel`` (o, fc2), and for sequence parallelism ``SequenceParallel``
  norms with the sequence sharded between the regions; one forward and backward, watched
  by a :class:`call_trace.Recording`.
* :func:`dtensor_expected`: the calls that plan makes, per rank, for the lab to compare
  with what the recording saw (each rank's as a set: :func:`as_sets`).
"""

import torch
import torch.nn.functional as F

from emulator.records.calls import Call


class DenseBlock(torch.nn.Module):
    """The block as torch modules (for DTensor's parallelize_module); x @ w layout."""

    def __init__(self, params, n_heads, device, dtype):
        super().__init__()
        d = params["ln1.g"].shape[0]

        def linear(key):
            w = params[f"{key}.w"]  # (d_in, d_out)
            lin = torch.nn.Linear(*w.shape, device=device, dtype=dtype)
            with torch.no_grad():
                lin.weight.copy_(torch.tensor(w.T))
                lin.bias.copy_(torch.tensor(params[f"{key}.b"]))
            return lin

        def norm(key):
            ln = torch.nn.LayerNorm(d, eps=1e-5, device=device, dtype=dtype)
            with torch.no_grad():
                ln.weight.copy_(torch.tensor(params[f"{key}.g"]))
                ln.bias.copy_(torch.tensor(params[f"{key}.b"]))
            return ln

        self.ln1, self.ln2 = norm("ln1"), norm("ln2")
        self.attn = torch.nn.Module()
        for n in "qkvo":
            setattr(self.attn, n, linear(f"attn.{n}"))
        self.attn.n_heads = n_heads
        self.mlp = torch.nn.Module()
        self.mlp.fc1, self.mlp.fc2 = linear("mlp.fc1"), linear("mlp.fc2")
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
        out = {k: None if v is None else full(v).contiguous() for k, v in out.items()}
        return {k: v.T.contiguous() if v is not None and k.endswith(".w") and not k.startswith("ln") else v
                for k, v in out.items()}


def dtensor_run(params, n_heads, x, dy, mesh, sp, device, dtype, dp_group, recording):
    """DTensor's block on this replica's batch ``x`` (b, s, d), ``dy`` the output's
    gradient; ``recording`` watches its forward and backward (not the set-up, nor the
    gathering of gradients for the check). Returns this rank's output (its slice of the
    sequence under ``sp``), input gradient and every parameter's full gradient, summed
    over ``dp_group``."""
    try:
        from torch.distributed.tensor import DTensor, Replicate, Shard
    except ImportError:  # torch 2.4 keeps DTensor in a private module
        from torch.distributed._tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    block = DenseBlock(params, n_heads, device, dtype)
    row = dict(output_layouts=Shard(1), use_local_output=False) if sp else {}
    plan = {f"attn.{n}": ColwiseParallel() for n in "qkv"}
    plan.update({"attn.o": RowwiseParallel(**row), "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel(**row)})
    if sp:
        plan.update({"ln1": SequenceParallel(), "ln2": SequenceParallel(),
                     "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
                     "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),))})
    parallelize_module(block, mesh, plan)
    block.attn.n_heads = n_heads // mesh.size()
    n, r, s = mesh.size(), mesh.get_local_rank(), x.shape[1]
    sl = slice(r * s // n, (r + 1) * s // n) if sp else slice(None)
    xin = x[:, sl].clone().requires_grad_(True)
    inp = DTensor.from_local(xin, mesh, [Shard(1)]) if sp else xin
    with recording:
        y = block(inp)
        y_local = y.to_local() if sp else y
        (y_local * dy[:, sl]).sum().backward()
    grads = block.grads()
    for g in grads.values():  # the data-parallel sum over the other replicas' batches
        if g is not None:
            torch.distributed.all_reduce(g, group=dp_group)
    return y_local.detach(), xin.grad, grads


def dtensor_expected(n, tp, sp, act_bytes):
    """The calls DTensor makes for the lab's plan, per rank (a forward and a backward),
    ``act_bytes`` the bytes of a replica's whole activation (b, s, d):

    * TP: the two row-parallel outputs all-reduced in forward (as Megatron's g); in
      backward the input gradient of each column-parallel layer all-reduced on its own
      (q, k, v and fc1: four calls where the hand-written block, summing q, k and v first,
      makes two).
    * SP: in forward an all-gather of the sequence before each column-parallel pair and a
      reduce-scatter after each row-parallel layer; in backward the same two pairs the
      other way. The norms' gradients stay pending sums (``Partial``) until they are read,
      which all-reduces each of them apart (outside the step watched here; the
      hand-written block makes one call for all six in its step). DTensor keeps the
      gathered input for the weight gradients, where the hand-written block (as
      Megatron) gathers it again in backward: memory for bytes."""
    if tp == 1:  # a group of one: nothing to send
        return [[] for _ in range(n)]
    if not sp:
        calls = [Call("all_reduce", "tp", act_bytes)] * 6
    else:
        calls = [Call("all_gather", "tp", act_bytes // tp), Call("reduce_scatter", "tp", act_bytes)] * 4
    return [list(calls) for _ in range(n)]


def as_sets(calls):
    """Each rank's calls in one fixed order: DTensor's order is its own, its set is the plan's."""
    key = lambda c: (c.op, c.group, c.nbytes, -1 if c.peer is None else c.peer)  # noqa: E731
    return [sorted(per_rank, key=key) for per_rank in calls]
