"""Which files a folder of submissions holds, whose each is, and which of a student's counts.

A submissions folder holds either one file per student (``subs/alice.ipynb``) or one folder
per student (``subs/alice/00_collectives.ipynb``, at any depth below it). The student is the
first folder under the submissions folder, else the file's stem (*contract*: the report's
``student`` column). Hidden folders (``.backup/``, ``.ipynb_checkpoints/``) are skipped.
When one student hands in two files for one lesson, the newer (by modification time, then
by name) is the one that counts; both are reported.
"""

import json
from pathlib import Path


class BadFile(ValueError):
    """A submitted file that cannot be graded; the message says why and what to do."""


def read_json(path, what):
    """The JSON value in the file at ``path`` (``what``: "a notebook", "an answer file"),
    or BadFile saying what is wrong with it: empty, not UTF-8, not JSON."""
    data = Path(path).read_bytes()
    if not data.strip():
        raise BadFile(f"the file is empty: hand in {what} as it was saved")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadFile(f"not UTF-8 text (byte {exc.start} is {data[exc.start:exc.start + 1]!r}): {what} is a UTF-8 "
                      f"JSON file; hand it in as it was saved") from None
    try:
        return json.loads(text), text
    except json.JSONDecodeError as exc:
        raise BadFile(f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}): the file is damaged or "
                      f"not {what}") from None


def find(folder, suffix):
    """Every ``*suffix`` file under ``folder``, sorted, outside hidden folders."""
    folder = Path(folder)
    return sorted(p for p in folder.rglob(f"*{suffix}")
                  if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts))


def student_of(path, folder):
    rel = Path(path).resolve().relative_to(Path(folder).resolve())
    return rel.parts[0] if len(rel.parts) > 1 else rel.stem


def counting(rows):
    """Set ``row["counts"]`` on each row (dicts with ``path``, ``student``, ``lesson``):
    ``"yes"``, or ``"no: NEWER is newer"`` for a student's older file of the same lesson."""
    groups = {}
    for row in rows:
        groups.setdefault((row["student"], row["lesson"] or row["submission"]), []).append(row)
    for group in groups.values():
        newest = max(group, key=lambda r: (Path(r["path"]).stat().st_mtime, str(r["path"])))
        for row in group:
            row["counts"] = "yes" if row is newest else f"no: {newest['submission']} is newer"
    return rows
