"""The course GPT as torch modules on a device mesh: FSDP2 over ``dp``, tensor and
sequence parallelism over ``tp`` (``parallelize_module``), and pipeline stages over ``pp``
(``torch.distributed.pipelining``), the way torchtitan composes them.

* :class:`GPT` builds ``emulator.nn.GPT``'s layers from its parameters (``x @ w`` there,
  ``nn.Linear`` here): the embedding, the blocks (pre-norm attention and GELU MLP, with
  biases), the final norm and output layer.
* :func:`tensor_parallel` splits each block over ``tp`` with sequence parallelism:
  q, k, v and fc1 column-parallel, o and fc2 row-parallel with their outputs split along
  the sequence (a reduce-scatter), the norms on each rank's slice of the sequence, an
  all-gather before attention and the MLP. The embedding and the output layer stay whole
  on every tp rank; the sequence is cut after the embedding and gathered before the head.
* :func:`fully_shard_layers` shards each block, then the rest, over ``dp`` (FSDP2).
* :class:`Stage` is one pipeline stage's run of layers: it takes and returns this rank's
  slice of the sequence between blocks (what the emulator's pipeline sends under
  sequence parallelism), the token ids on the first stage and the logits on the last.
"""

import numpy as np
import torch
import torch.nn.functional as F

try:
    from torch.distributed.tensor import DTensor, Replicate, Shard
except ImportError:  # torch 2.4 keeps DTensor in a private module
    from torch.distributed._tensor import DTensor, Replicate, Shard


def _linear(params, key, bias=True, device=None, dtype=None):
    w = params[f"{key}.w"]
    lin = torch.nn.Linear(w.shape[0], w.shape[1], bias=bias, device=device, dtype=dtype)
    with torch.no_grad():
        lin.weight.copy_(torch.tensor(np.ascontiguousarray(w.T)))
        if bias:
            lin.bias.copy_(torch.tensor(params[f"{key}.b"]))
    return lin


def _norm(params, key, device, dtype):
    g = params[f"{key}.g"]
    ln = torch.nn.LayerNorm(len(g), eps=1e-5, device=device, dtype=dtype)
    with torch.no_grad():
        ln.weight.copy_(torch.tensor(g))
        ln.bias.copy_(torch.tensor(params[f"{key}.b"]))
    return ln


class Attention(torch.nn.Module):
    def __init__(self, params, pre, n_heads, device, dtype):
        super().__init__()
        for n in "qkvo":
            setattr(self, n, _linear(params, f"{pre}{n}", device=device, dtype=dtype))
        self.head_dim = params[f"{pre}q.w"].shape[1] // n_heads

    def forward(self, a):
        b, s = a.shape[:2]  # this rank's heads: as many as its columns of q, k, v hold
        q, k, v = (getattr(self, n)(a).reshape(b, s, -1, self.head_dim).transpose(1, 2) for n in "qkv")
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(o.transpose(1, 2).reshape(b, s, -1))


class MLP(torch.nn.Module):
    def __init__(self, params, pre, device, dtype):
        super().__init__()
        self.fc1, self.fc2 = (_linear(params, f"{pre}{n}", device=device, dtype=dtype) for n in ("fc1", "fc2"))

    def forward(self, a):
        return self.fc2(F.gelu(self.fc1(a), approximate="tanh"))


class Block(torch.nn.Module):
    def __init__(self, params, pre, n_heads, device, dtype):
        super().__init__()
        self.ln1, self.ln2 = _norm(params, pre + "ln1", device, dtype), _norm(params, pre + "ln2", device, dtype)
        self.attn = Attention(params, pre + "attn.", n_heads, device, dtype)
        self.mlp = MLP(params, pre + "mlp.", device, dtype)

    def forward(self, x):
        h = x + self.attn(self.ln1(x))
        return h + self.mlp(self.ln2(h))


class GPT(torch.nn.Module):
    """``emulator.nn.GPT`` (``params``: its parameters, numpy) as torch modules."""

    def __init__(self, params, n_layers, n_heads, device, dtype):
        super().__init__()
        self.tok = torch.nn.Parameter(torch.tensor(params["embed.tok.w"], device=device, dtype=dtype))
        self.pos = torch.nn.Parameter(torch.tensor(params["embed.pos.w"], device=device, dtype=dtype))
        self.blocks = torch.nn.ModuleList([Block(params, f"blocks.{i}.", n_heads, device, dtype)
                                           for i in range(n_layers)])
        self.ln = _norm(params, "head.ln", device, dtype)
        self.proj = _linear(params, "head.proj", bias=False, device=device, dtype=dtype)
        self.tp_mesh = None  # set by tensor_parallel

    def embed(self, ids):
        return self.tok[ids] + self.pos[: ids.shape[1]]

    def head(self, x):
        return self.proj(self.ln(x))

    def cut(self, x):
        """A whole (b, s, d) tensor, the same on every tp rank -> this rank's slice of the
        sequence (backward: the slices' gradients all-gathered)."""
        if self.tp_mesh is None:
            return x
        return DTensor.from_local(x, self.tp_mesh, [Replicate()]).redistribute(self.tp_mesh, [Shard(1)])

    def join(self, x):
        """This rank's slice -> the whole sequence on every tp rank (an all-gather)."""
        if self.tp_mesh is None:
            return x
        return x.redistribute(self.tp_mesh, [Replicate()]).to_local()

    def forward(self, ids):
        x = self.cut(self.embed(ids))
        for block in self.blocks:
            x = block(x)
        return self.head(self.join(x))

    def named(self):
        """{"layer.key": full tensor} in the emulator's names and ``x @ w`` layout."""
        def full(t):
            t = t.detach()
            return t.full_tensor() if hasattr(t, "full_tensor") else t

        out = {"embed.tok.w": full(self.tok), "embed.pos.w": full(self.pos), "head.ln.g": full(self.ln.weight),
               "head.ln.b": full(self.ln.bias), "head.proj.w": full(self.proj.weight).T}
        for i, blk in enumerate(self.blocks):
            pre = f"blocks.{i}."
            for key, ln in (("ln1", blk.ln1), ("ln2", blk.ln2)):
                out[f"{pre}{key}.g"], out[f"{pre}{key}.b"] = full(ln.weight), full(ln.bias)
            for key, lin in [(f"attn.{n}", getattr(blk.attn, n)) for n in "qkvo"] + [("mlp.fc1", blk.mlp.fc1),
                                                                                    ("mlp.fc2", blk.mlp.fc2)]:
                out[f"{pre}{key}.w"], out[f"{pre}{key}.b"] = full(lin.weight).T, full(lin.bias)
        return out


def tensor_parallel(model, tp_mesh, blocks=None):
    """Split ``model``'s blocks (or ``blocks``) over ``tp_mesh`` with sequence parallelism."""
    from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                                   SequenceParallel, parallelize_module)

    row = dict(output_layouts=Shard(1), use_local_output=False)
    plan = {"ln1": SequenceParallel(), "ln2": SequenceParallel(),
            "attn": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            **{f"attn.{n}": ColwiseParallel() for n in "qkv"}, "attn.o": RowwiseParallel(**row),
            "mlp.fc1": ColwiseParallel(), "mlp.fc2": RowwiseParallel(**row)}
    for block in (model.blocks if blocks is None else blocks):
        parallelize_module(block, tp_mesh, plan)
    model.tp_mesh = tp_mesh
    return model


def fully_shard_layers(model, dp_mesh):
    """FSDP2 over ``dp_mesh``: each block its own unit, then the rest (embedding, head)."""
    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError:  # torch 2.4 keeps FSDP2 in a private module
        from torch.distributed._composable.fsdp import fully_shard

    for block in model.blocks:
        fully_shard(block, mesh=dp_mesh)
    fully_shard(model, mesh=dp_mesh)
    return model


class Stage(torch.nn.Module):
    """Pipeline stage ``index`` of ``count``: the model's blocks ``blocks`` (the embedding
    before them on the first, the head after them on the last). Between stages it takes
    and returns this rank's slice of the sequence (local tensors, as pipelining sends).
    It holds only its own parameters: what FSDP2 shards and the optimizer updates."""

    def __init__(self, model, index, count, blocks):
        super().__init__()
        self.first, self.last, self.tp_mesh = index == 0, index == count - 1, model.tp_mesh
        self.blocks = torch.nn.ModuleList(blocks)
        if self.first:
            self.tok, self.pos = model.tok, model.pos
        if self.last:
            self.ln, self.proj = model.ln, model.proj

    def forward(self, x):
        if self.first:
            x = self.tok[x] + self.pos[: x.shape[1]]
            if self.tp_mesh is not None:
                x = DTensor.from_local(x, self.tp_mesh, [Replicate()]).redistribute(self.tp_mesh, [Shard(1)])
        elif self.tp_mesh is not None:
            x = DTensor.from_local(x, self.tp_mesh, [Shard(1)])
        for block in self.blocks:
            x = block(x)
        if self.last:
            if self.tp_mesh is not None:
                x = x.redistribute(self.tp_mesh, [Replicate()]).to_local()
            return self.proj(self.ln(x))
        return x.to_local() if self.tp_mesh is not None else x
