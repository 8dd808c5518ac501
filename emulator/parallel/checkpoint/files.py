"""A sharded checkpoint on disk, laid out as ``torch.distributed.checkpoint``'s
``FileSystemWriter`` lays it out (``torch/distributed/checkpoint/filesystem.py``):

    step_00000004/
        __0_0.npz  __1_0.npz ...   each rank's chunks (NumPy's npz instead of .distcp)
        __0.json   __1.json  ...   each rank's list of what it wrote (its write results)
        .metadata                  the manifest: every tensor's global shape and dtype, and
                                   each chunk's offsets, sizes and file; the training state

* **Planning** (:class:`Coordinator`): every rank lists the blocks it holds; a block held
  by several ranks (a replica: every data-parallel rank holds the same parameters under
  DDP) is written once, by the holder with the fewest bytes planned so far, as DCP's
  ``dedup_save_plans`` (``_dedup_save_plans.py``) balances the writers. Plans do not
  change between saves of one run, so this happens once (DCP can cache its plans too).
* **Writing**: each rank writes its own file and its list.
* **Finishing**: the coordinator gathers the lists and writes ``.metadata`` last, through
  a temporary file and a rename, so a checkpoint either has a complete manifest or none
  (``FileSystemWriter.finish``). A save that a failure interrupted has no ``.metadata``
  and is never loaded. Here the run's driver finishes each save after the ranks have run,
  and a save counts as complete only if every rank's bytes were on storage before that
  rank stopped (died, or its watchdog fired).

:class:`Checkpoint` reads one back: ``read(fqn, offsets, sizes)`` assembles any block of
any tensor from the chunks that overlap it (:func:`emulator.parallel.reshard.read_block`).
"""

import json
import math
import os
from pathlib import Path

import numpy as np
from ml_dtypes import bfloat16

from ...errors import ConfigError
from .. import reshard

FORMAT = "parallelism-from-scratch checkpoint v1"
MANIFEST = ".metadata"


def step_dir(path, step):
    return Path(path) / f"step_{step:08d}"


def _encode(a):
    return (a.view(np.uint16), "bfloat16") if a.dtype == bfloat16 else (np.ascontiguousarray(a), str(a.dtype))


def _dtype(name):
    return bfloat16 if name == "bfloat16" else np.dtype(name)


class Coordinator:
    """Gathers every rank's plan (its blocks) and decides who writes each block once."""

    def __init__(self):
        self.plans, self.writer = {}, None

    def register(self, rank, pieces):
        self.plans[rank] = [((p.fqn, p.offsets, p.sizes), p.nbytes) for p in pieces]

    def writes(self, rank, key):
        if self.writer is None:
            holders = {}
            for r in sorted(self.plans):
                for k, nbytes in self.plans[r]:
                    holders.setdefault(k, []).append((r, nbytes))
            self.writer, planned = {}, {r: 0 for r in self.plans}
            for k, ranks in holders.items():
                r, nbytes = min(ranks, key=lambda h: (planned[h[0]], h[0]))
                self.writer[k] = r
                planned[r] += nbytes
        return self.writer[key] == rank


def write_rank(folder, rank, pieces, train, written_at):
    """Rank ``rank``'s file of chunks and its list of them."""
    folder.mkdir(parents=True, exist_ok=True)
    arrays, chunks = {}, []
    for i, p in enumerate(pieces):
        arrays[f"c{i}"], dtype = _encode(p.data)
        chunks.append({"fqn": p.fqn, "shape": list(p.shape), "dtype": dtype, "offsets": list(p.offsets),
                       "sizes": list(p.sizes), "file": f"__{rank}_0.npz", "key": f"c{i}"})
    np.savez(folder / f"__{rank}_0.npz", **arrays)
    with open(folder / f"__{rank}.json", "w") as f:
        json.dump({"rank": rank, "chunks": chunks, "train": train, "written_at": written_at,
                   "bytes": sum(p.nbytes for p in pieces)}, f)


def clear(folder):
    """Forget a save about to be made again: its manifest goes first."""
    for name in [MANIFEST] + ([p.name for p in folder.iterdir() if p.name.startswith("__")] if folder.is_dir() else []):
        if (folder / name).exists():
            os.remove(folder / name)


def finish(folder, world_size, ends):
    """Write ``folder``'s manifest if every rank wrote its part before it stopped
    (``ends[r]``: when rank r stopped; inf if it ran to the end). Returns whether it did."""
    parts = []
    for r in range(world_size):
        try:
            with open(folder / f"__{r}.json") as f:
                part = json.load(f)
        except FileNotFoundError:
            return False
        if part["written_at"] > ends.get(r, math.inf):
            return False
        parts.append(part)
    train = parts[0]["train"]
    for part in parts[1:]:
        if part["train"] != train:
            raise ConfigError(f"checkpoint {folder}: ranks 0 and {part['rank']} saved different training states "
                              f"({train} and {part['train']})")
    tensors = {}
    for part in parts:
        for c in part["chunks"]:
            t = tensors.setdefault(c["fqn"], {"shape": c["shape"], "dtype": c["dtype"], "chunks": []})
            t["chunks"].append({k: c[k] for k in ("offsets", "sizes", "file", "key")})
    for fqn, t in tensors.items():
        covered = sum(int(np.prod(c["sizes"])) for c in t["chunks"])
        if covered != int(np.prod(t["shape"])):
            raise ConfigError(f"checkpoint {folder}: the chunks of {fqn} cover {covered} of its "
                              f"{int(np.prod(t['shape']))} values")
    manifest = {"format": FORMAT, "world_size": world_size, "train": train, "tensors": tensors,
                "saved_at": max(p["written_at"] for p in parts), "bytes": sum(p["bytes"] for p in parts),
                "bytes_per_rank": [p["bytes"] for p in parts]}
    tmp = folder / f"{MANIFEST}.tmp"
    with open(tmp, "w") as f:
        json.dump(manifest, f)
    os.replace(tmp, folder / MANIFEST)
    return True


def latest(path):
    """The checkpoint at ``path``, or the complete one of the latest step under it."""
    path = Path(path)
    if (path / MANIFEST).exists():
        return path
    steps = sorted(p for p in path.glob("step_*") if (p / MANIFEST).exists()) if path.is_dir() else []
    if not steps:
        raise ConfigError(f"no complete checkpoint at {path}: a checkpoint is a folder with a {MANIFEST} manifest "
                          f"(or a folder of step_* folders); a save that did not finish has none")
    return steps[-1]


class Checkpoint:
    """A saved checkpoint, to resume from (``run_on_mesh(..., resume_from=Checkpoint(path))``
    or just the path). ``step``: the steps trained before it; ``train``: the training
    state; ``tensors``: fqn -> shape, dtype, chunks. ``read_block`` assembles a block
    from saved chunks (default :func:`emulator.parallel.reshard.read_block`)."""

    def __init__(self, path, read_block=None):
        self.path = latest(path)
        with open(self.path / MANIFEST) as f:
            self.manifest = json.load(f)
        if self.manifest.get("format") != FORMAT:
            raise ConfigError(f"{self.path / MANIFEST} is not a checkpoint of this emulator ({FORMAT})")
        self.train, self.tensors = self.manifest["train"], self.manifest["tensors"]
        self.step = self.train["step"]
        self._read_block = read_block
        self._files, self._data = {}, {}

    def __repr__(self):
        return f"Checkpoint({str(self.path)!r}, step={self.step}, saved by {self.manifest['world_size']} ranks)"

    def _chunk(self, fqn, c):
        key = (c["file"], c["key"])
        if key not in self._data:
            if c["file"] not in self._files:
                self._files[c["file"]] = np.load(self.path / c["file"])
            raw = self._files[c["file"]][c["key"]]
            self._data[key] = raw.view(bfloat16) if self.tensors[fqn]["dtype"] == "bfloat16" else raw
        return self._data[key]

    def read(self, fqn, offsets, sizes):
        """The block ``[offsets, offsets + sizes)`` of saved tensor ``fqn``."""
        if fqn not in self.tensors:
            raise ConfigError(f"checkpoint {self.path} has no tensor {fqn!r}")
        saved = [(tuple(c["offsets"]), self._chunk(fqn, c)) for c in self.tensors[fqn]["chunks"]]
        read_block = self._read_block or reshard.read_block
        out = np.asarray(read_block(saved, tuple(offsets), tuple(sizes)))
        if out.shape != tuple(sizes):
            raise ConfigError(f"reading {fqn} at {tuple(offsets)}: got a block of shape {out.shape}, expected "
                              f"{tuple(sizes)}")
        return out.astype(_dtype(self.tensors[fqn]["dtype"]), copy=False)

    def check(self, shapes, optimizer):
        """Refuse a model or optimizer this checkpoint does not fit (``shapes``: the
        model's global parameter shapes and dtypes, ``{name: (shape, dtype)}``)."""
        problems = []
        for name, (shape, dtype) in shapes.items():
            t = self.tensors.get(f"model.{name}")
            if t is None:
                problems.append(f"no saved tensor for parameter {name}")
            elif tuple(t["shape"]) != tuple(shape) or _dtype(t["dtype"]) != dtype:
                problems.append(f"{name} was saved as {tuple(t['shape'])} {t['dtype']}, the model has "
                                f"{tuple(shape)} {np.dtype(dtype).name}")
        extra = sorted(k[len("model."):] for k in self.tensors if k.startswith("model.") and k[6:] not in shapes)
        if extra:
            problems.append(f"saved parameters the model does not have: {extra[:4]}")
        if getattr(optimizer, "mixed_precision", False) != any(k.startswith("optim.master.") for k in self.tensors):
            problems.append("the optimizer's mixed precision (fp32 master weights) differs from the saved one's")
        if problems:
            raise ConfigError(f"checkpoint {self.path} does not fit this model and optimizer:\n" +
                              "\n".join(f"  - {p}" for p in problems[:8]))
