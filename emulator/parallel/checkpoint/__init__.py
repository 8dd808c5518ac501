"""Sharded checkpoints of the mesh runtime, and restarting from one on any mesh.

``run_on_mesh(model, params, batches[:k], dims_a, opt, checkpoint_dir=path)`` saves at the
end (``checkpoint_dir=Checkpointing(path, every=2, async_save=True)`` also every 2 steps,
asynchronously); ``run_on_mesh(model, None, batches[k:], dims_b, opt, resume_from=path)``
goes on from the latest complete save, on another mesh if need be, and ends where the
uninterrupted run ends.

What a save holds, as ``torch.distributed.checkpoint`` does for a torch job:

* every rank's **shards**, by placement: its block of each parameter (or its range of a
  ZeRO slice), and the same of the **optimizer state** (AdamW's moments, and the fp32
  master weights under mixed precision): :mod:`.pieces`;
* the **data position** (how many steps were trained, so the restarted job feeds the
  next batch) and the **RNG state**: one generator for the whole job, drawn once per step
  (:class:`TrainState`), whose draws do not depend on the mesh, so they survive
  resharding; the models of this course have no dropout, so nothing here consumes the
  draws, which a model with dropout would hash with each element's global position to
  make its masks (as :func:`emulator.nn.dropout.dropout_mask` does);
* a **manifest** of every tensor's global shape and each chunk's offsets and sizes
  (:mod:`.files`), from which any other mesh finds the chunks its blocks overlap
  (:mod:`emulator.parallel.reshard`);
* on the emulator's clock, the time to write it to storage (:mod:`.storage`).
"""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import ConfigError
from .files import Checkpoint, Coordinator, clear, finish, latest, step_dir, write_rank
from .pieces import load_optimizer, load_params, rank_pieces
from .storage import Storage, charge_load, charge_write, close_save

SEED = 0


@dataclass
class Checkpointing:
    """When and how a run saves: into ``path`` (a ``step_NNNNNNNN`` folder per save),
    every ``every`` steps (None: only after the run's last step, which always saves),
    asynchronously or not, to ``storage``."""

    path: object
    every: int = None
    async_save: bool = False
    storage: Storage = field(default_factory=Storage)

    def __post_init__(self):
        if self.every is not None and not (isinstance(self.every, int) and self.every >= 1):
            raise ConfigError(f"Checkpointing: every= is a number of steps (an int >= 1) or None, got {self.every!r}")
        self.path = Path(self.path)

    @classmethod
    def of(cls, spec):
        return spec if isinstance(spec, Checkpointing) else cls(spec)

    def due(self, step, last):
        return last or (self.every is not None and step % self.every == 0)


class TrainState:
    """The job's position: ``step`` (steps trained) and its random generator ``rng``
    (drawn once per step: ``seeds``, the draw of each step of this run)."""

    def __init__(self, checkpoint=None):
        self.rng = np.random.default_rng(SEED)
        self.step, self.seeds = 0, []
        if checkpoint is not None:
            self.step = checkpoint.train["step"]
            self.rng.bit_generator.state = checkpoint.train["rng"]

    def advance(self):
        self.seeds.append(int(self.rng.integers(2**62)))
        self.step += 1

    def saved(self, optim_t):
        return {"step": self.step, "optim_t": optim_t, "rng": self.rng.bit_generator.state}


class Saver:
    """A run's saves: planned once (:class:`~.files.Coordinator`), written by every rank
    after the steps ``policy`` says, finished (manifests) after the run."""

    def __init__(self, policy, world_size):
        self.policy, self.world_size = Checkpointing.of(policy), world_size
        self.coordinator, self.folders = Coordinator(), []

    def prepare(self, first_step, steps):
        """Clear the folders of the saves this run will make (a stale manifest must not
        vouch for a save that fails)."""
        for step in range(first_step + 1, first_step + steps + 1):
            if self.policy.due(step, step == first_step + steps):
                folder = step_dir(self.policy.path, step)
                clear(folder)
                self.folders.append(folder)

    def after_step(self, comm, hooks, placements, coords, sizes, train, last):
        if not self.policy.due(train.step, last):
            return
        pieces, optim_t = rank_pieces(hooks, placements, coords, sizes)
        rank = comm.global_rank
        if self.coordinator.writer is None:  # the first save plans: every rank's list to the coordinator, back
            self.coordinator.register(rank, pieces)
            comm.barrier()
        mine = [p for p in pieces if self.coordinator.writes(rank, (p.fqn, p.offsets, p.sizes))]
        end = charge_write(comm, sum(p.nbytes for p in mine), self.policy.storage, self.policy.async_save)
        write_rank(step_dir(self.policy.path, train.step), rank, mine, train.saved(optim_t), end)
        close_save(comm, self.policy.async_save)

    def finish(self, ends):
        """Write the manifest of every save that completed; return their folders."""
        return [folder for folder in self.folders if finish(folder, self.world_size, ends)]


class Restart:
    """Loading a rank of a new mesh from ``checkpoint`` (a :class:`~.files.Checkpoint`)."""

    def __init__(self, checkpoint, storage=None):
        self.checkpoint = checkpoint if isinstance(checkpoint, Checkpoint) else Checkpoint(checkpoint)
        self.storage = storage or Storage()
        self.shapes = {k[len("model."):]: tuple(t["shape"]) for k, t in self.checkpoint.tensors.items()
                       if k.startswith("model.")}
        self._bytes = {}  # rank -> bytes of parameters it read

    def params(self, comm, placements, coords, sizes):
        reads = []

        def read(fqn, offsets, sizes_):
            reads.append(self.checkpoint.read(fqn, offsets, sizes_))
            return reads[-1]

        local = load_params(read, placements, coords, sizes, self.shapes)
        self._bytes[comm.global_rank] = sum(a.nbytes for a in reads)
        return local

    def optimizer(self, comm, hooks, placements, coords, sizes):
        reads = []

        def read(fqn, offsets, sizes_):
            reads.append(self.checkpoint.read(fqn, offsets, sizes_))
            return reads[-1]

        load_optimizer(read, hooks, placements, coords, sizes, self.checkpoint.train["optim_t"])
        charge_load(comm, self._bytes.pop(comm.global_rank) + sum(a.nbytes for a in reads), self.storage)


__all__ = ["Checkpointing", "Checkpoint", "Storage", "TrainState", "Saver", "Restart", "latest", "step_dir"]
