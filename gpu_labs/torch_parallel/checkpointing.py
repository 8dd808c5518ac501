"""Sharded checkpoints with ``torch.distributed.checkpoint`` (DCP): save on one world size,
load on another, find the last complete save after a crash.

* ``CourseGPT``: the course GPT (``emulator.nn.GPT``'s parameters, ``torch_reference.gpt``'s
  math) as one module, for FSDP2's ``fully_shard`` to shard every parameter along dim 0.
* ``save(folder, model, optimizer, train)``: every rank writes its shards of the
  parameters and of AdamW's state (``get_state_dict`` gives them as DTensors), and the
  training state (step, data position, RNG); DCP's coordinator writes ``.metadata`` last.
* ``load(folder, model, optimizer)``: each rank reads the parts of the saved chunks that
  overlap its own shards, whatever world size saved them (DCP's planner does the overlap
  computation), then ``set_state_dict``.
* ``latest_complete(root)``: the newest ``step_*`` folder that has its ``.metadata``: a save
  a crash interrupted has none.
* ``overlaps(folder, model)``: for every saved chunk and every local shard of this rank, the
  region DCP reads (``_shards_get_overlap_region_wrt_saved_tensor``) beside the emulator's
  ``reshard.overlap``: the same algorithm in both.
"""

from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, TensorStorageMetadata
from torch.distributed.checkpoint.resharding import _shards_get_overlap_region_wrt_saved_tensor
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
try:
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
except ImportError:  # torch 2.4 keeps DTensor in a private module
    from torch.distributed._tensor import DTensor
    from torch.distributed._tensor._utils import compute_local_shape_and_global_offset

from emulator.nn import torch_reference as R
from emulator.parallel.reshard import Chunk, overlap

MANIFEST = ".metadata"


class CourseGPT(torch.nn.Module):
    """The course GPT of ``n_layers`` blocks and ``n_heads`` heads, from ``params0``
    (``{"blocks.0.attn.q.w": array, ...}``)."""

    def __init__(self, params0, n_layers, n_heads, device, dtype):
        super().__init__()
        self.n_layers, self.n_heads = n_layers, n_heads
        self.p = torch.nn.ParameterDict({k.replace(".", "__"): torch.nn.Parameter(
            torch.tensor(v, device=device, dtype=dtype)) for k, v in params0.items()})

    def forward(self, x):
        return R.gpt({k.replace("__", "."): v for k, v in self.p.items()}, x, self.n_layers, self.n_heads)

    def full(self):
        """Every parameter whole ({"blocks.0.attn.q.w": tensor}); a collective under FSDP2."""
        return {k.replace("__", "."): (v.full_tensor() if isinstance(v, DTensor) else v).detach()
                for k, v in self.p.items()}


def state(model, optimizer, train):
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": model_sd, "optim": optim_sd, "train": train}


def save(folder, model, optimizer, train):
    """Write this rank's part of a checkpoint into ``folder`` (every rank calls it)."""
    dcp.save(state(model, optimizer, train), checkpoint_id=str(folder))


def load(folder, model, optimizer, train):
    """Read ``folder`` into this rank's shards of ``model`` and ``optimizer``, and ``train``
    (a dict of tensors of the saved shapes) in place; returns ``train``."""
    sd = state(model, optimizer, train)
    dcp.load(sd, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=sd["model"], optim_state_dict=sd["optim"])
    return sd["train"]


def latest_complete(root):
    """The newest ``step_*`` folder under ``root`` with a manifest, or None."""
    done = sorted(p for p in Path(root).glob("step_*") if (p / MANIFEST).exists()) if Path(root).is_dir() else []
    return done[-1] if done else None


def saved_bytes(folder):
    """Bytes of tensor data in a checkpoint, from its manifest."""
    md = FileSystemReader(str(folder)).read_metadata()
    total = 0
    for item in md.state_dict_metadata.values():
        if isinstance(item, TensorStorageMetadata):
            per = torch.empty((), dtype=item.properties.dtype).element_size()
            total += sum(int(torch.Size(c.sizes).numel()) * per for c in item.chunks)
    return total


def overlaps(folder, model):
    """(regions compared, disagreements) between DCP's overlap computation and the
    emulator's, for every saved chunk of every parameter and this rank's shard of it."""
    md = FileSystemReader(str(folder)).read_metadata().state_dict_metadata
    compared, differ = 0, []
    for key, param in model.p.items():
        fqn = f"model.p.{key}"
        if fqn not in md or not isinstance(param, DTensor):
            continue
        sizes, offsets = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        if 0 in sizes:  # an empty shard (more ranks than rows)
            continue
        mine = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))
        for saved in md[fqn].chunks:
            ours = overlap(Chunk(tuple(saved.offsets), tuple(saved.sizes)), Chunk(tuple(offsets), tuple(sizes)))
            theirs = None
            if all(so < wo + ws and wo < so + ss for so, ss, wo, ws in
                   zip(saved.offsets, saved.sizes, offsets, sizes)):
                regions = _shards_get_overlap_region_wrt_saved_tensor(saved, mine)
                theirs = (tuple(r[1] for r in regions), tuple(r[2] for r in regions), tuple(r[3] for r in regions))
            compared += 1
            if (ours is None) != (theirs is None) or (ours is not None and tuple(ours) != theirs):
                differ.append((fqn, tuple(saved.offsets), ours, theirs))
    return compared, differ
