"""Build the course notebooks from their sources.

    python -m tools.build_notebooks            # every lesson (make notebooks)
    python -m tools.build_notebooks 00         # lessons whose name starts with 00
    python -m tools.build_notebooks --force 03 # replace lessons/03_*.ipynb even if edited

Sources are jupytext percent files, ``solutions/NN_name.py`` (and ``solutions/index.py``).
Each exercise's answer sits between ``### BEGIN SOLUTION: Exercise N.k: title`` and
``### END SOLUTION`` (nbgrader's markers, plus the exercise's name). From each source:

* ``solutions/NN_name.ipynb``: the markers dropped, executed, outputs kept (the answer key,
  checked by ``pytest --nbval``);
* ``lessons/NN_name.ipynb``: each answer replaced by
  ``raise NotImplementedError("Exercise N.k: title")`` at the same indent, outputs cleared.

Both end with the lesson's summary (every exercise: passed, failed or not attempted; see
``emulator.grading.progress``) and a small line naming their source. Their metadata holds
the source's path and sha256 and a fingerprint of the cells as built, so a test fails when
they are stale, and a lesson whose cells were changed since (a student's answers) is never
overwritten without ``--force``. ``solutions/index.py``, which has no code, becomes the
course map ``lessons/index.md`` (a page, so opening it starts no kernel).

An exercise's cell and its check cell have ids made from the exercise's label
(``exercise-0-4`` and ``check-exercise-0-4`` for Exercise 0.4; its title may change) and
carry the label in their metadata, so the grader finds a student's answers in a notebook
built from an older version of the lesson; other cells are numbered by position.

A lesson notebook that is replaced while it may hold work (cells edited and ``--force``
given; no course metadata; built before fingerprints; unreadable) is first copied to
``lessons/.backup/NAME.YYYY-MM-DDTHH-MM-SS.ipynb``, and the output names the copy.
"""

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from ipykernel.ipkernel import IPythonKernel
from nbclient import NotebookClient

from tools.backups import Written, back_up, holds_work
from tools.lesson_sources import (BEGIN, END, LABEL, check_id, exercise_id, exercise_names,  # noqa: F401
                                  exercises, label_cells, sha256, sources, split_solutions)
from tools.lesson_sources import cell_id

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # for the kernels it starts (see the Makefile)
os.environ.setdefault("OMP_NUM_THREADS", "1")
SOURCES = ROOT / "solutions"
# What JupyterLab writes when a kernel starts: written in full, opening a notebook changes nothing.
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
LANGUAGE_INFO = dict(IPythonKernel.language_info)


def summary_cells(src, names):
    """The lesson's closing cells: every exercise, passed, failed or not attempted."""
    text = ("## Where you stand\n\n"
            "Every exercise of this lesson, as its check last said: passed, failed or not attempted. "
            "This cell fails until all have passed. From a terminal, "
            f"`make grade LESSON={src.stem[:2]}` runs the saved notebook from the top in a fresh kernel and "
            "prints the same list.")
    code = "from emulator.grading import summary\n\nsummary(\n" + "".join(
        f"    {json.dumps(name, ensure_ascii=False)},\n" for name in names) + ")"
    return [nbformat.v4.new_markdown_cell(text, metadata={"tags": ["summary"]}),
            nbformat.v4.new_code_cell(code, metadata={"tags": ["summary"]})]


def provenance(src, root=ROOT):
    rel = src.relative_to(root).as_posix()
    return f"Built from `{rel}` by `tools/build_notebooks.py`."


def fingerprint(nb):
    """sha256 of the cells' kinds and sources: what a student's edits change, and running
    the notebook (outputs, counts, metadata) does not."""
    cells = [[c.cell_type, c.source] for c in nb.cells]
    return hashlib.sha256(json.dumps(cells, ensure_ascii=False).encode()).hexdigest()


def render(src, kind, root=ROOT):
    """The notebook for ``kind`` ("solutions" or "lessons"), not executed."""
    nb = jupytext.read(src, fmt="py:percent")
    label_cells(nb)
    for cell in nb.cells:
        cell.metadata.pop("lines_to_next_cell", None)
        if cell.cell_type == "code":
            cell.source, _ = split_solutions(cell.source, keep=(kind == "solutions"))
    names = exercise_names(src)
    if names:
        nb.cells += summary_cells(src, names)
    nb.cells.append(nbformat.v4.new_markdown_cell(f"<sub>{provenance(src, root)}</sub>",
                                                  metadata={"tags": ["provenance"]}))
    for i, cell in enumerate(nb.cells):
        cell["id"] = cell_id(cell, kind, i)
    nb.metadata = {
        "kernelspec": dict(KERNELSPEC),
        "language_info": json.loads(json.dumps(LANGUAGE_INFO)),
        "course": {"source": src.relative_to(root).as_posix(), "source_sha256": sha256(src),
                   "generated_by": "tools/build_notebooks.py"},
    }
    nb.metadata["course"]["cells_sha256"] = fingerprint(nb)
    return nb


def render_index(src):
    """The course map as Markdown: the source's markdown cells, and a comment naming it."""
    nb = jupytext.read(src, fmt="py:percent")
    code = [c for c in nb.cells if c.cell_type == "code" and c.source.strip()]
    if code:
        raise ValueError(f"{src.name} is the course map: markdown only, but it has {len(code)} code cell(s)")
    body = "\n\n".join(c.source.strip() for c in nb.cells if c.cell_type == "markdown")
    return (f"{body}\n\n<!-- {provenance(src)} Edit that file, then run `make notebooks`. "
            f"sha256 of the source: {sha256(src)} -->\n")


def edits(nb):
    """Whether a lesson notebook's cells differ from what the build wrote (a student's
    answers, notes, or tried parameters). A notebook from before fingerprints counts as
    edited when any exercise stub is gone."""
    built = nb.metadata.get("course", {}).get("cells_sha256")
    if built:
        return fingerprint(nb) != built
    source = nb.metadata.get("course", {}).get("source")
    stubs = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    names = exercises(ROOT / source) if source and (ROOT / source).exists() else []
    return any(f'raise NotImplementedError("{name}")' not in stubs for name in names)


def lesson_path(src):
    return ROOT / "lessons" / (src.stem + (".ipynb" if exercises(src) else ".md"))


def layout(cell):
    """What the build decides about a cell: its kind, source, id and course metadata."""
    return cell.cell_type, cell.source, cell.get("id"), cell.metadata.get("course")


def freshness(path, src):
    """Whether the generated ``path`` is what ``src`` builds: ``("fresh", "")``,
    ``("stale", why)``, or, for a lesson notebook someone has worked in (cells changed,
    or outputs saved), ``("edited", what)`` when it was built from the current source:
    its cells are the student's and are not compared."""
    rel, src_rel = path.relative_to(ROOT) if path.is_relative_to(ROOT) else path, src.relative_to(ROOT)
    rebuild = f"{rel} is stale: edit {src_rel}, then run `make notebooks`"
    if not path.exists():
        return "stale", f"{rel} is missing: run `make notebooks`"
    if path.suffix == ".md":
        return ("fresh", "") if path.read_text() == render_index(src) else ("stale", rebuild)
    nb = nbformat.read(path, 4)
    kind = "solutions" if path.parent.name == "solutions" else "lessons"
    fresh = render(src, kind)
    course = nb.metadata.get("course", {})
    current = (course.get("source_sha256") == fresh.metadata["course"]["source_sha256"]
               and course.get("cells_sha256") == fresh.metadata["course"]["cells_sha256"])
    ran = any(c.get("outputs") or c.get("execution_count") for c in nb.cells if c.cell_type == "code")
    if kind == "lessons" and (edits(nb) or ran):
        if current:
            return "edited", f"{rel} holds work done in it (answers or outputs); built from the current {src_rel}"
        return "stale", (f"{rel} was built from an older {src_rel} and holds work done in it, which `make "
                         f"notebooks` keeps rather than erase: to get the new lesson, rename your copy (e.g. "
                         f"{Path(rel).stem}.mine.ipynb), then run `make notebooks`")
    same = [layout(c) for c in nb.cells] == [layout(c) for c in fresh.cells]
    return ("fresh", "") if current and same else ("stale", rebuild)


def execute(nb, cwd):
    NotebookClient(nb, timeout=300, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def build(src, force=False):
    """Write the notebooks of ``src``; return (written paths, kept lesson or None, backup or None)."""
    out = []
    path = lesson_path(src)
    if not exercises(src):
        path.write_text(render_index(src))
        return [path], None, None
    sol = execute(render(src, "solutions"), SOURCES)
    sol_path = SOURCES / (src.stem + ".ipynb")
    nbformat.write(sol, sol_path)
    out.append(sol_path)
    written = write_lesson(src, path, force)
    if not written:
        return out, path, None
    out.append(path)
    return out, None, written.backup


def write_lesson(src, path, force=False):
    """Write the student notebook of ``src`` to ``path``, unless ``path`` holds a notebook
    whose cells were changed since it was built (and ``force`` is false): False then.
    A notebook replaced while it may hold work (edited and forced; without course metadata,
    of an older format, or unreadable) is first copied to ``.backup/`` (``Written.backup``)."""
    backup = None
    if path.exists():
        nb, unknown = holds_work(path)
        edited = nb is not None and not unknown.startswith("it has no course") and edits(nb)
        if edited and not force:
            return False
        if edited or unknown:
            backup = back_up(path)
    stub = render(src, "lessons")
    for cell in stub.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(stub, path)
    return Written(backup)


def kept_message(path):
    rel = path.relative_to(ROOT)
    return (f"kept {rel}: its cells were changed since it was built (your answers?), and rebuilding would "
            f"erase them. To keep them, rename it (e.g. {rel.stem}.mine.ipynb) and build again; to replace it "
            f"anyway, `python -m tools.build_notebooks --force {rel.stem[:2]}` (a copy goes to "
            f"{rel.parent}/.backup/ first).")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prefix", nargs="?", default="", help="build the sources whose name starts with this")
    ap.add_argument("--force", action="store_true",
                    help="replace lesson notebooks even if their cells were edited (each is first copied to "
                         "lessons/.backup/)")
    args = ap.parse_args(argv)
    todo = sources(args.prefix)
    if not todo:
        sys.exit(f"no sources in {SOURCES} start with {args.prefix!r}")
    kept = []
    for src in todo:
        print(f"building {src.relative_to(ROOT)} ...", flush=True)
        t0 = time.perf_counter()
        written, keep, backup = build(src, force=args.force)
        if backup:
            print(f"  backed up the lesson it replaced, as it was, to {backup.relative_to(ROOT)}", flush=True)
        for path in written:
            print(f"  wrote {path.relative_to(ROOT)}", flush=True)
        if keep:
            kept.append(keep)
            print(f"  {kept_message(keep)}", flush=True)
        print(f"  took {time.perf_counter() - t0:.1f} s", flush=True)
    if kept:
        sys.exit(f"{len(kept)} lesson notebook(s) kept, not rebuilt: " + ", ".join(str(p.relative_to(ROOT))
                                                                                for p in kept))


if __name__ == "__main__":
    main()
