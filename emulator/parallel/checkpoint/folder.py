"""A folder of saves (``step_NNNNNNNN`` folders): which are complete, which one a restart
takes (:func:`latest`), and which ones a run may replace (:func:`claim`).

A run never deletes saves it did not make. A fresh run into a folder that holds saves is
refused, with the ways on: resume from them, save elsewhere, or say
``Checkpointing(path, overwrite=True)``. A run that resumes from a folder may go on saving
into it, after the save it resumed from; saves after that one are in its way, and are
refused the same way. A save that did not finish (no manifest) or that the emulated job
lost (a ``.lost`` note) is not a save: a run replaces it when it saves that step again.
"""

import json
import re
from pathlib import Path

from ...errors import ConfigError
from . import durable
from .files import LOST, MANIFEST, complete

STEP = re.compile(r"step_(\d{8})$")


def saves_in(path):
    """The complete saves under ``path``: (step, folder), by step."""
    path = Path(path)
    if not path.is_dir():
        return []
    found = ((int(m.group(1)), p) for p in path.iterdir() if (m := STEP.match(p.name)) and p.is_dir())
    return sorted((s, p) for s, p in found if complete(p))


def _names(saves):
    return ", ".join(p.name for _, p in saves)


def elsewhere(folder):
    """The other complete saves next to ``folder``, to name in an error ("" if none)."""
    others = [(s, p) for s, p in saves_in(Path(folder).parent) if p != Path(folder)]
    if not others:
        return "; there is no other complete save next to it: start again from params"
    return f"; or resume from another save next to it: {_names(others)} (resume_from='{others[-1][1]}')"


def why_incomplete(folder):
    """Why ``folder`` (that is not complete) does not load."""
    if (folder / LOST).exists():
        try:
            return json.loads((folder / LOST).read_text())["lost"]
        except (OSError, ValueError, KeyError, TypeError):
            return f"its {LOST} note says the emulated job lost it"
    return (f"it has no {MANIFEST} manifest: a save that did not finish (a crash or a failure stopped it before "
            f"every shard was written), which is never loaded")


def latest(path):
    """The checkpoint at ``path``, or the complete one of the latest step under it."""
    path = Path(path)
    if complete(path):
        return path
    if STEP.match(path.name) and path.is_dir():
        raise ConfigError(f"no complete checkpoint at {path}: {why_incomplete(path)}{elsewhere(path)}")
    saves = saves_in(path)
    if saves:
        return saves[-1][1]
    what = (f"a checkpoint is a folder with a {MANIFEST} manifest (or a folder of step_* folders); a save that did "
            f"not finish has none")
    if not path.is_dir():
        raise ConfigError(f"no complete checkpoint at {path}: there is no such folder ({what}); pass the "
                          f"checkpoint_dir a run saved into")
    unfinished = sorted(p for p in path.iterdir() if STEP.match(p.name) and p.is_dir())
    if unfinished:
        what = "; ".join(f"{p.name}: {why_incomplete(p)}" for p in unfinished[-3:])
    raise ConfigError(f"no complete checkpoint at {path}: {what}. Start from params (a fresh run), or resume from "
                      f"another folder")


def claim(path, overwrite, first_step=0, resumed_from=None):
    """Before a run saves into ``path``: refuse the saves in its way (every save there for
    a fresh run; for a run that resumes from a save in ``path``, those after it), or, with
    ``overwrite``, delete them. Returns the folders deleted."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"checkpoint_dir {path} is a file; name a folder (it is created if missing)")
    if complete(path):
        raise ConfigError(f"checkpoint_dir {path} is itself a checkpoint (it holds a {MANIFEST}); save into a folder "
                          f"of saves, e.g. its parent or an empty folder")
    same = resumed_from is not None and Path(resumed_from).parent.resolve() == path.resolve()
    in_way = [(s, p) for s, p in saves_in(path) if not same or s > first_step]
    if in_way and not overwrite:
        raise ConfigError(_refusal(path, in_way, first_step, resumed_from, same))
    for _, p in in_way:
        durable.remove_save(p, (MANIFEST, LOST))
    return [p for _, p in in_way]


def _refusal(path, in_way, first_step, resumed_from, same):
    replace = f"checkpoint_dir=Checkpointing('{path}', overwrite=True)"
    if same:
        return (f"checkpoint_dir {path} holds saves after step {first_step}, the one this run resumes from: "
                f"{_names(in_way)}; this run would replace them, and a run never deletes saves it did not make. "
                f"Either\n  - resume from the latest save instead: resume_from='{path}';\n"
                f"  - save into another folder: checkpoint_dir=<an empty folder>;\n"
                f"  - or replace them: {replace} deletes the saves after step {first_step} (it and those before it "
                f"stay).")
    head = (f"checkpoint_dir {path} already holds saves that this run did not make ({_names(in_way)}); a run never "
            f"deletes saves it did not make.")
    if resumed_from is not None:
        return (f"{head} This run resumes from {resumed_from}, in another folder. Either\n"
                f"  - save into the folder it resumes from: checkpoint_dir='{Path(resumed_from).parent}';\n"
                f"  - save into another folder: checkpoint_dir=<an empty folder>;\n"
                f"  - or replace them: {replace} deletes them before the first step.")
    return (f"{head} Either\n  - go on from the latest of them: run_on_mesh(model, None, batches, dims, optimizer, "
            f"resume_from='{path}', checkpoint_dir='{path}') (it saves into the same folder, after the save it resumes "
            f"from);\n  - save into another folder: checkpoint_dir=<an empty folder>;\n"
            f"  - or replace them: {replace} deletes them before the first step.")
