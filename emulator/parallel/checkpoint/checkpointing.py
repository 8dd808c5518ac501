"""When and how a run saves (:class:`Checkpointing`), and the job's position that every save
keeps (:class:`TrainState`: the steps trained and the job's one random generator)."""

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ...errors import ConfigError
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
