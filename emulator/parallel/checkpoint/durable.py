"""Writing a file so that a crash at any moment leaves either the old state or the new
one, never half of each: the bytes go to a temporary file, which is flushed and synced to
the disk (``os.fsync``), then renamed over the final name (``os.replace``, atomic on
POSIX), and the folder is synced so that the rename itself survives a power loss. Orbax
commits a checkpoint the same way (a temporary folder renamed when complete);
``torch.distributed.checkpoint``'s ``FileSystemWriter`` writes ``.metadata`` through a
temporary file and a rename (``torch/distributed/checkpoint/filesystem.py``).

``on_write``: None, or a function called as ``on_write(event, path)`` at each step of
each write (``"tmp written"``: flushed and synced, not renamed yet; ``"renamed"``: in
place), and ``on_write("removing", folder)`` before a save is removed. The tests use it to
kill the process (or raise) at chosen points of a save; nothing else should set it.
"""

import os
import shutil

on_write = None


def _event(event, path):
    if on_write is not None:
        on_write(event, path)


def sync_folder(folder):
    """Make the entries of ``folder`` (files created, renamed, removed) durable."""
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(folder, flags)
    except OSError:  # a platform that cannot open a folder (Windows): its renames are durable as they are
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path, data):
    """Put ``data`` (bytes) at ``path``: all of it, or (after a crash) nothing new. The
    caller syncs the folder once its files are in place (:func:`sync_folder`)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    _event("tmp written", path)
    os.replace(tmp, path)
    _event("renamed", path)


def make_folder(folder):
    """Create ``folder`` (and its parents), its entry durable in its parent."""
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        sync_folder(folder.parent)


def remove_save(folder, manifest_names):
    """Remove a save's folder, its manifest first (``manifest_names``): a crash halfway
    leaves a save without a manifest, which nothing loads, never a manifest without
    its shards."""
    _event("removing", folder)
    for name in manifest_names:
        if (folder / name).exists():
            os.remove(folder / name)
    sync_folder(folder)
    shutil.rmtree(folder)
    sync_folder(folder.parent)
