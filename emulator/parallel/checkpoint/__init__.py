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

from .checkpointing import SEED, Checkpointing, TrainState  # noqa: F401 -- SEED: part of this package's interface
from .files import step_dir
from .folder import latest
from .loading import Checkpoint
from .saver import Restart, Saver
from .storage import Storage

__all__ = ["Checkpointing", "Checkpoint", "Storage", "TrainState", "Saver", "Restart", "latest", "step_dir"]
