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
"""

import argparse
import hashlib
import json
import re
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from ipykernel.ipkernel import IPythonKernel
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "solutions"
BEGIN = re.compile(r"^(?P<indent>\s*)### BEGIN SOLUTION(?::\s*(?P<name>.*))?\s*$")
END = re.compile(r"^\s*### END SOLUTION\s*$")
LABEL = re.compile(r"(?:Exercise|Napkin|Problem) \d+\.\d+")
# What JupyterLab writes when a kernel starts: written in full, opening a notebook changes nothing.
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}
LANGUAGE_INFO = dict(IPythonKernel.language_info)


def sources(prefix=""):
    return sorted(p for p in SOURCES.glob("*.py") if p.name.startswith(prefix))


def sha256(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


def split_solutions(code, keep):
    """Drop the markers (``keep=True``) or replace each block by a stub (``keep=False``)."""
    out, inside, names = [], False, []
    for line in code.splitlines():
        m = BEGIN.match(line)
        if m:
            if inside:
                raise ValueError(f"nested ### BEGIN SOLUTION: {line!r}")
            inside = True
            name = m.group("name") or "exercise"
            names.append(name)
            if not keep:
                out.append(f'{m.group("indent")}raise NotImplementedError("{name}")')
            continue
        if END.match(line):
            if not inside:
                raise ValueError("### END SOLUTION without BEGIN")
            inside = False
            continue
        if keep or not inside:
            out.append(line)
    if inside:
        raise ValueError("### BEGIN SOLUTION without END")
    return "\n".join(out), names


def exercises(src):
    """Names of the exercises' answers in a source, in order (one exercise may have several)."""
    names = []
    for cell in jupytext.read(src, fmt="py:percent").cells:
        if cell.cell_type == "code":
            names += split_solutions(cell.source, keep=True)[1]
    return names


def exercise_names(src):
    """One name per exercise, in order: the first answer's name for each label."""
    seen = {}
    for name in exercises(src):
        m = LABEL.match(name)
        if not m:
            raise ValueError(f"{src.name}: the answer {name!r} does not begin with its exercise's label "
                             f"(Exercise N.k, Napkin N.k or Problem N.k)")
        seen.setdefault(m.group(0), name)
    return list(seen.values())


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


def provenance(src):
    rel = src.relative_to(ROOT).as_posix()
    return f"Built from `{rel}` by `tools/build_notebooks.py`."


def fingerprint(nb):
    """sha256 of the cells' kinds and sources: what a student's edits change, and running
    the notebook (outputs, counts, metadata) does not."""
    cells = [[c.cell_type, c.source] for c in nb.cells]
    return hashlib.sha256(json.dumps(cells, ensure_ascii=False).encode()).hexdigest()


def render(src, kind):
    """The notebook for ``kind`` ("solutions" or "lessons"), not executed."""
    nb = jupytext.read(src, fmt="py:percent")
    for cell in nb.cells:
        cell.metadata.pop("lines_to_next_cell", None)
        if cell.cell_type == "code":
            cell.source, _ = split_solutions(cell.source, keep=(kind == "solutions"))
    names = exercise_names(src)
    if names:
        nb.cells += summary_cells(src, names)
    nb.cells.append(nbformat.v4.new_markdown_cell(f"<sub>{provenance(src)}</sub>",
                                                  metadata={"tags": ["provenance"]}))
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{kind[0]}{i:03d}"
    nb.metadata = {
        "kernelspec": dict(KERNELSPEC),
        "language_info": json.loads(json.dumps(LANGUAGE_INFO)),
        "course": {"source": src.relative_to(ROOT).as_posix(), "source_sha256": sha256(src),
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
    same = [(c.cell_type, c.source) for c in nb.cells] == [(c.cell_type, c.source) for c in fresh.cells]
    return ("fresh", "") if current and same else ("stale", rebuild)


def execute(nb, cwd):
    NotebookClient(nb, timeout=300, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def build(src, force=False):
    """Write the notebooks of ``src``; return (written paths, kept lesson or None)."""
    out = []
    path = lesson_path(src)
    if not exercises(src):
        path.write_text(render_index(src))
        return [path], None
    sol = execute(render(src, "solutions"), SOURCES)
    sol_path = SOURCES / (src.stem + ".ipynb")
    nbformat.write(sol, sol_path)
    out.append(sol_path)
    if not write_lesson(src, path, force):
        return out, path
    out.append(path)
    return out, None


def write_lesson(src, path, force=False):
    """Write the student notebook of ``src`` to ``path``, unless ``path`` holds a notebook
    whose cells were changed since it was built (and ``force`` is false): False then."""
    if path.exists() and not force and edits(nbformat.read(path, 4)):
        return False
    stub = render(src, "lessons")
    for cell in stub.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(stub, path)
    return True


def kept_message(path):
    rel = path.relative_to(ROOT)
    return (f"kept {rel}: its cells were changed since it was built (your answers?), and rebuilding would "
            f"erase them. To keep them, rename it (e.g. {rel.stem}.mine.ipynb) and build again; to replace it "
            f"anyway, `python -m tools.build_notebooks --force {rel.stem[:2]}`.")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("prefix", nargs="?", default="", help="build the sources whose name starts with this")
    ap.add_argument("--force", action="store_true", help="replace lesson notebooks even if their cells were edited")
    args = ap.parse_args(argv)
    todo = sources(args.prefix)
    if not todo:
        sys.exit(f"no sources in {SOURCES} start with {args.prefix!r}")
    kept = []
    for src in todo:
        print(f"building {src.relative_to(ROOT)} ...", flush=True)
        t0 = time.perf_counter()
        written, keep = build(src, force=args.force)
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
