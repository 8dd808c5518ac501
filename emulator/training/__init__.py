"""Training on the emulator: the step loop every data-parallel strategy plugs into
(:mod:`.loop`: ``train``, a one-stage pipeline), the single-device reference every parallel
run must match (:mod:`.reference`: ``train_single``) and a task to train on
(:mod:`.synthetic`: ``synthetic_batches``)."""

from ..nn.precision import upcast  # noqa: F401 -- part of this package's interface
from ..parallel.batches import local_batch, split_batch  # noqa: F401 -- part of this package's interface
from .loop import TrainResult, train
from .reference import train_single
from .synthetic import synthetic_batches

__all__ = ["TrainResult", "train", "train_single", "synthetic_batches", "upcast", "local_batch", "split_batch"]
