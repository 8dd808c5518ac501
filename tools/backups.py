"""Copies of lesson notebooks that a rebuild replaces while they may hold a student's work.

They go to ``lessons/.backup/NAME.<date>T<time>.ipynb``: a hidden folder, which neither
``make grade`` (``lessons/NN*.ipynb``) nor the grader's folder mode (it skips hidden
folders) picks up.
"""

import time

import nbformat


class Written:
    """A lesson written; ``backup``: where the notebook it replaced was copied, if anywhere."""

    def __init__(self, backup=None):
        self.backup = backup

    def __bool__(self):
        return True


def holds_work(path):
    """``(notebook or None, why)``: the lesson notebook at ``path``, and why it may hold work
    that the build cannot see ("" when the build can tell): it cannot be read (None), it has
    no course metadata, or it is of an older format (built before fingerprints or cell ids)."""
    try:
        nb = nbformat.read(path, 4)
    except Exception as exc:  # noqa: BLE001 -- not a notebook we can read: keep a copy
        return None, f"it cannot be read as a notebook ({type(exc).__name__})"
    course = nb.metadata.get("course")
    if not isinstance(course, dict) or not course.get("source"):
        return nb, "it has no course metadata, so its cells cannot be compared with the build"
    if not course.get("cells_sha256") or nb.nbformat_minor < 5:
        return nb, "it is of an older format, whose edits the build cannot always detect"
    return nb, ""


def back_up(path):
    """Copy ``path`` to ``.backup/NAME.<date and time>.ipynb`` beside it; return the copy."""
    folder = path.parent / ".backup"
    folder.mkdir(exist_ok=True)
    stamp = time.strftime("%Y-%m-%dT%H-%M-%S")
    copy = folder / f"{path.stem}.{stamp}{path.suffix}"
    n = 1
    while copy.exists():
        n += 1
        copy = folder / f"{path.stem}.{stamp}-{n}{path.suffix}"
    copy.write_bytes(path.read_bytes())
    return copy


