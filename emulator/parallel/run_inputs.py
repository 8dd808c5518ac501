"""What ``run_on_mesh`` accepts, checked before any rank runs: each refusal names the
argument and says what to pass instead (a ``ConfigError``)."""

import numpy as np

from ..arrays.shape_only import is_shape_only
from ..errors import ConfigError
from .dims import AXES, ParallelDims


def check_dims(dims):
    if isinstance(dims, dict):
        raise ConfigError(f"run_on_mesh: dims= is a dict ({dims!r}); pass a ParallelDims, e.g. "
                          f"ParallelDims(**dims) or ParallelDims(dp=2, tp=2)")
    if not isinstance(dims, ParallelDims):
        raise ConfigError(f"run_on_mesh: dims= must be a ParallelDims (e.g. ParallelDims(dp=2, tp=2)), got {dims!r}")


def check_optimizer(optimizer):
    if optimizer is None:
        raise ConfigError("run_on_mesh: optimizer= is missing (None); pass one, e.g. nn.AdamW(lr=1e-2)")
    missing = [m for m in ("init", "step") if not callable(getattr(optimizer, m, None))]
    if missing:
        raise ConfigError(f"run_on_mesh: the optimizer {optimizer!r} has no {' or '.join(missing)}() method; pass an "
                          f"nn.AdamW (e.g. nn.AdamW(lr=1e-2))")


def check_fold(fold, dims):
    """``fold`` as a tuple of mesh axis names (None: the default, left to the caller)."""
    if fold is None:
        return None
    axes = list(dims.mesh_shape()) if isinstance(dims, ParallelDims) else list(AXES)
    if isinstance(fold, str):
        fold = (fold,)
    if not isinstance(fold, (tuple, list)) or not all(isinstance(a, str) for a in fold):
        raise ConfigError(f"run_on_mesh: fold= takes mesh axis names, a tuple such as ('dp', 'tp') (or () to fold "
                          f"nothing), got {fold!r}; the axes are {axes}")
    unknown = [a for a in fold if a not in axes]
    if unknown:
        raise ConfigError(f"run_on_mesh: fold= names {unknown}, which are not mesh axes; use some of {axes}")
    return tuple(fold)


def _check_ids(a, what, i, vocab):
    arr = np.asarray(a)
    if not np.issubdtype(arr.dtype, np.integer):
        raise ConfigError(f"run_on_mesh: batches[{i}]'s {what} are {arr.dtype}; token ids are integers "
                          f"(e.g. np.int64)")
    if arr.min() < 0 or arr.max() >= vocab:
        raise ConfigError(f"run_on_mesh: batches[{i}]'s {what} must lie in [0, {vocab}) (the model's vocab), got "
                          f"min {arr.min()} max {arr.max()}; map them into the vocabulary or build the model with a "
                          f"larger vocab")


def check_batches(batches, vocab):
    """A non-empty list of (inputs, targets) pairs of token ids in ``[0, vocab)``, each
    pair of one shape (batch, seq) with at least one sequence of at least one token."""
    if batches is None or isinstance(batches, (str, bytes, dict)) or not hasattr(batches, "__len__"):
        raise ConfigError(f"run_on_mesh: batches= must be a list of (inputs, targets) pairs, got "
                          f"{type(batches).__name__}; e.g. synthetic_batches(steps, batch, seq, vocab)")
    if len(batches) == 0:
        raise ConfigError("run_on_mesh: batches= is empty; pass at least one (inputs, targets) pair, e.g. "
                          "synthetic_batches(steps, batch, seq, vocab)")
    for i, b in enumerate(batches):
        if not (isinstance(b, (tuple, list)) and len(b) == 2):
            raise ConfigError(f"run_on_mesh: batches[{i}] must be an (inputs, targets) pair of token-id arrays, got "
                              f"{type(b).__name__}")
        shapes = [tuple(np.shape(a)) for a in b]
        if shapes[0] != shapes[1]:
            raise ConfigError(f"run_on_mesh: batches[{i}] has inputs of shape {shapes[0]} and targets of shape "
                              f"{shapes[1]}; a target per input token (the same shape)")
        if len(shapes[0]) != 2 or 0 in shapes[0]:
            raise ConfigError(f"run_on_mesh: batches[{i}] has shape {shapes[0]}; each batch needs at least one "
                              f"sequence of at least one token, of shape (batch, seq)")
        for a, what in zip(b, ("inputs", "targets")):
            if not is_shape_only(a):
                _check_ids(a, what, i, vocab)
