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
  (:mod:`emulator.parallel.reshard`), each file's checksum and step, and what the run was
  (its model's settings, its optimizer's hyperparameters, its precision: :mod:`.fit`);
* on the emulator's clock, the time to write it to storage (:mod:`.storage`).

The files themselves are written so that no crash loses a complete save or passes off a
partial one (:mod:`.durable`): a save is complete once its manifest is on disk, which is as
soon as its last shard is (:mod:`.saver`). Loading verifies every file (:mod:`.loading`); a
run never deletes saves it did not make (:mod:`.folder`); a restart refuses a model,
optimizer or precision other than the save's unless ``allow_changes`` names the change.
"""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import ConfigError
from .files import step_dir
from .folder import latest
from .loading import Checkpoint
from .storage import Storage

SEED = 0


@dataclass
class Checkpointing:
    """When and how a run saves: into ``path`` (a ``step_NNNNNNNN`` folder per save),
    every ``every`` steps (None: only after the run's last step, which always saves),
    asynchronously or not, to ``storage``. A run refuses a ``path`` that holds saves in
    its way (:mod:`.folder`); ``overwrite=True`` deletes them before the first step."""

    path: object
    every: int = None
    async_save: bool = False
    storage: Storage = field(default_factory=Storage)
    overwrite: bool = False

    def __post_init__(self):
        if self.every is not None and not (isinstance(self.every, int) and self.every >= 1):
            raise ConfigError(f"Checkpointing: every= is a number of steps (an int >= 1) or None, got {self.every!r}")
        if not isinstance(self.overwrite, bool):
            raise ConfigError(f"Checkpointing: overwrite= is True (delete the saves in the way) or False, got "
                              f"{self.overwrite!r}")
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


from .saver import Restart, Saver  # noqa: E402 -- they use Checkpointing

__all__ = ["Checkpointing", "Checkpoint", "Storage", "TrainState", "Saver", "Restart", "latest", "step_dir"]
