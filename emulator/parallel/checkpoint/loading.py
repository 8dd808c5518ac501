"""Reading a save back, every file checked first.

:class:`Checkpoint` opens the latest complete save under a folder (or the one named),
reads its manifest, then each file it names: the file must be there, hold the step of
the save (a shard copied from another save holds its own) and have the checksum the
manifest recorded (a shard altered or damaged since has another), as Orbax and
``torch.distributed.checkpoint`` both verify what they load. Any mismatch is refused,
naming the file and the ways on. ``read(fqn, offsets, sizes)`` then assembles any block of
any tensor from the chunks that overlap it (:func:`emulator.parallel.reshard.read_block`).
"""

import hashlib
import io
import json

import numpy as np
from ml_dtypes import bfloat16

from ...errors import ConfigError
from .. import reshard
from .files import FORMAT, MANIFEST, STEP_KEY, dtype_of
from .fit import check_fit
from .folder import elsewhere, latest


def _manifest(path):
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except ValueError:
        raise ConfigError(f"{path / MANIFEST} is not valid JSON: the manifest was damaged after it was written "
                          f"(it is written whole or not at all){elsewhere(path)}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else None
        raise ConfigError(f"{path / MANIFEST} is not a checkpoint of this emulator ({FORMAT}; it says {found!r}): "
                          f"a save of an earlier version has no checksums to verify; save it again with this "
                          f"version{elsewhere(path)}")
    return manifest


def _verified(path, name, entry, step):
    """The arrays of file ``name`` of the save of ``step`` at ``path``, once it checks out."""
    what = f"restore {name} from the save it belongs to (step {step}){elsewhere(path)}"
    try:
        data = (path / name).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{path / name}, which the manifest names, cannot be read ({exc.strerror}); {what}") from None
    try:
        arrays = np.load(io.BytesIO(data))
        held = int(arrays[STEP_KEY]) if STEP_KEY in arrays.files else None
    except (OSError, ValueError, KeyError, EOFError):
        arrays, held = None, None
    if held is not None and held != entry["step"]:
        raise ConfigError(f"{path / name} holds the shard of step {held}, but this save is of step {entry['step']}: "
                          f"it was copied from another save; {what}")
    digest = hashlib.sha256(data).hexdigest()
    if digest != entry["sha256"] or arrays is None:
        raise ConfigError(f"{path / name} does not match the manifest: its sha256 is {digest[:16]}..., the manifest "
                          f"recorded {entry['sha256'][:16]}... ({len(data)} bytes, {entry['size']} when saved): it was "
                          f"altered or damaged after it was saved; {what}")
    if entry["step"] != step:
        raise ConfigError(f"{path / MANIFEST} says {name} is of step {entry['step']}, but the save is of step {step}: "
                          f"the manifest was edited{elsewhere(path)}")
    return arrays


class Checkpoint:
    """A saved checkpoint, to resume from (``run_on_mesh(..., resume_from=Checkpoint(path))``
    or just the path). ``step``: the steps trained before it; ``train``: the training
    state; ``tensors``: fqn -> shape, dtype, chunks; ``run``: what the run that saved it
    was (:mod:`.fit`). ``read_block`` assembles a block from saved chunks (default
    :func:`emulator.parallel.reshard.read_block`). Every file is verified on opening."""

    def __init__(self, path, read_block=None):
        self.path = latest(path)
        self.manifest = _manifest(self.path)
        self.train, self.tensors = self.manifest["train"], self.manifest["tensors"]
        self.step = self.train["step"]
        self.run = self.manifest.get("run", {})
        self._read_block = read_block
        self._files = {name: _verified(self.path, name, entry, self.step)
                       for name, entry in sorted(self.manifest["files"].items())}
        self._data = {}

    def __repr__(self):
        return f"Checkpoint({str(self.path)!r}, step={self.step}, saved by {self.manifest['world_size']} ranks)"

    def has(self, prefix):
        """Does the save hold a tensor whose name starts with ``prefix`` (``"optim.master."``)?"""
        return any(k.startswith(prefix) for k in self.tensors)

    def _chunk(self, fqn, c):
        key = (c["file"], c["key"])
        if key not in self._data:
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
        return out.astype(dtype_of(self.tensors[fqn]["dtype"]), copy=False)

    def check(self, shapes, optimizer, model=None, allow_changes=None, policy=None):
        """Refuse a model or optimizer this checkpoint does not fit (``shapes``: the
        model's global parameter shapes and dtypes, ``{name: (shape, dtype)}``), save the
        changes ``allow_changes`` names (:func:`~.fit.check_fit`)."""
        check_fit(self, model, optimizer, shapes, allow_changes, policy)
