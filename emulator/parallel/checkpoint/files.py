"""A sharded checkpoint on disk, laid out as ``torch.distributed.checkpoint``'s
``FileSystemWriter`` lays it out (``torch/distributed/checkpoint/filesystem.py``):

    step_00000004/
        __0_0.npz  __1_0.npz ...   each rank's chunks, and the step they belong to
                                   (NumPy's npz instead of .distcp)
        .metadata                  the manifest: every tensor's global shape and dtype, and
                                   each chunk's offsets, sizes and file; each file's
                                   sha256 and step; the training state; what the run was
                                   (model, optimizer, precision: :mod:`.fit`)

* **Planning** (:class:`Coordinator`): every rank lists the blocks it holds; a block held
  by several ranks (a replica: every data-parallel rank holds the same parameters under
  DDP) is written once, by the holder with the fewest bytes planned so far, as DCP's
  ``dedup_save_plans`` (``_dedup_save_plans.py``) balances the writers. Plans do not
  change between saves of one run, so this happens once (DCP can cache its plans too).
* **Writing** (:func:`write_shard`): each rank writes its own file, atomically
  (:mod:`.durable`), and hands the coordinator its write result (the file's chunks, its
  checksum).
* **Finishing** (:func:`write_manifest`): as soon as the coordinator has every rank's
  result, it writes ``.metadata``, last and atomically (``FileSystemWriter.finish``). A
  save is complete when its manifest is on disk; one that a crash interrupted has none,
  and is never loaded; every save before it stays loadable.

Two things are kept apart here: the files this process really writes (above), and the
course's model of a save on the **emulated** clock. There a save is complete only if each
rank's bytes reached storage, in simulated time, before that rank stopped (a
:class:`~emulator.engine.faults.RankFailure` killed it, or its watchdog fired): an
asynchronous save still in flight when a rank dies is lost, though the emulator wrote its
files at once. When a simulated failure ends a run, the driver looks at each of its saves
(:func:`lost_reason`) and marks those the emulated job lost (:func:`mark_lost`): their
manifest goes, and a ``.lost`` note says why, so that they load no more.
"""

import hashlib
import io
import json
import math
import os
from pathlib import Path

import numpy as np
from ml_dtypes import bfloat16

from ...errors import ConfigError
from . import durable

FORMAT = "parallelism-from-scratch checkpoint v2"
MANIFEST = ".metadata"
LOST = ".lost"
STEP_KEY = "__step__"  # inside each shard file: the step of the save it belongs to


def step_dir(path, step):
    return Path(path) / f"step_{step:08d}"


def complete(folder):
    """Has ``folder`` a save that loads (its manifest, and no note that it was lost)?"""
    return (folder / MANIFEST).is_file() and not (folder / LOST).exists()


def _encode(a):
    return (a.view(np.uint16), "bfloat16") if a.dtype == bfloat16 else (np.ascontiguousarray(a), str(a.dtype))


def dtype_of(name):
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


def clear_partial(folder):
    """Empty the folder of a save about to be made, which must not be complete: what a
    crash or a lost save left there (shards, temporary files, a ``.lost`` note)."""
    if not folder.is_dir():
        return
    if complete(folder):
        raise ConfigError(f"{folder} holds a complete save that this run was not told to replace; save into another "
                          f"folder, or pass Checkpointing(path, overwrite=True)")
    for p in folder.iterdir():
        if p.is_file() and (p.name.startswith("__") or p.name.endswith(".tmp") or p.name in (LOST, MANIFEST)):
            os.remove(p)


def write_shard(folder, rank, step, pieces, train, written_at):
    """Rank ``rank``'s file of chunks of the save of ``step``, on disk before this returns;
    its write result (what the manifest says of it)."""
    arrays, chunks, name = {STEP_KEY: np.array(step, dtype=np.int64)}, [], f"__{rank}_0.npz"
    for i, p in enumerate(pieces):
        arrays[f"c{i}"], dtype = _encode(p.data)
        chunks.append({"fqn": p.fqn, "shape": list(p.shape), "dtype": dtype, "offsets": list(p.offsets),
                       "sizes": list(p.sizes), "file": name, "key": f"c{i}"})
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    data = buf.getvalue()
    durable.write_atomic(folder / name, data)
    return {"rank": rank, "file": name, "step": step, "sha256": hashlib.sha256(data).hexdigest(), "size": len(data),
            "chunks": chunks, "train": train, "written_at": written_at, "bytes": sum(p.nbytes for p in pieces)}


def write_manifest(folder, parts, world_size, run):
    """The manifest of the save in ``folder`` from every rank's write result (``parts``,
    by rank), written atomically once the shards' names are durable. Returns it."""
    parts = [parts[r] for r in range(world_size)]
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
    files = {p["file"]: {k: p[k] for k in ("rank", "step", "sha256", "size", "written_at")} for p in parts}
    manifest = {"format": FORMAT, "world_size": world_size, "step": train["step"], "train": train, "run": run,
                "files": files, "tensors": tensors, "saved_at": max(p["written_at"] for p in parts),
                "bytes": sum(p["bytes"] for p in parts), "bytes_per_rank": [p["bytes"] for p in parts]}
    durable.sync_folder(folder)  # the shards' renames first: the manifest must never name a file not there
    durable.write_atomic(folder / MANIFEST, json.dumps(manifest).encode())
    durable.sync_folder(folder)
    return manifest


def lost_reason(manifest, ends):
    """On the emulated clock: why the save of ``manifest`` never completed (a rank's bytes
    reached storage after that rank stopped, ``ends[r]``; inf if it ran on), or None."""
    late = [(f["rank"], f["written_at"], ends[f["rank"]]) for f in manifest["files"].values()
            if f["written_at"] > ends.get(f["rank"], math.inf)]
    if not late:
        return None
    r, at, end = min(late)
    return (f"the emulated job lost this save: rank {r}'s bytes would have reached storage at {at:.6g} s of simulated "
            f"time, but it stopped at {end:.6g} s" + (f" (and {len(late) - 1} more ranks' bytes too)" if len(late) > 1
                                                       else ""))


def mark_lost(folder, reason):
    """The save in ``folder`` did not complete on the emulated clock: note why, then
    remove its manifest (a crash in between leaves the note, which is enough)."""
    durable.write_atomic(folder / LOST, json.dumps({"lost": reason}).encode())
    os.remove(folder / MANIFEST)
    durable.sync_folder(folder)
