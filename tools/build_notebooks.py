"""Build the course notebooks from their sources.

    python -m tools.build_notebooks            # every lesson (make notebooks)
    python -m tools.build_notebooks 00         # lessons whose name starts with 00

Sources are jupytext percent files, ``solutions/NN_name.py`` (and ``solutions/index.py``).
Each exercise's answer sits between ``### BEGIN SOLUTION: Exercise N.k: title`` and
``### END SOLUTION`` (nbgrader's markers, plus the exercise's name). From each source:

* ``solutions/NN_name.ipynb``: the markers dropped, executed, outputs kept (the answer key,
  checked by ``pytest --nbval``);
* ``lessons/NN_name.ipynb``: each answer replaced by
  ``raise NotImplementedError("Exercise N.k: title")`` at the same indent, outputs cleared.

Both carry a banner naming their source, and the source's sha256 in their metadata, so a
test fails when they are stale.
"""

import hashlib
import re
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
SOURCES = ROOT / "solutions"
BEGIN = re.compile(r"^(?P<indent>\s*)### BEGIN SOLUTION(?::\s*(?P<name>.*))?\s*$")
END = re.compile(r"^\s*### END SOLUTION\s*$")


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


def banner(src, kind, has_exercises=True):
    rel = src.relative_to(ROOT)
    if not has_exercises:
        what = "no exercises here"
    elif kind == "solutions":
        what = "the answer key, executed"
    else:
        what = "exercises are stubs: replace each `raise NotImplementedError` with your code"
    return nbformat.v4.new_markdown_cell(
        f"*Generated from `{rel}` by `tools/build_notebooks.py` ({what}). "
        f"Edit the source, then run `make notebooks`.*",
        metadata={"tags": ["banner"]})


def render(src, kind):
    """The notebook for ``kind`` ("solutions" or "lessons"), not executed."""
    nb = jupytext.read(src, fmt="py:percent")
    for cell in nb.cells:
        cell.metadata.pop("lines_to_next_cell", None)
        if cell.cell_type == "code":
            cell.source, _ = split_solutions(cell.source, keep=(kind == "solutions"))
    nb.cells.insert(0, banner(src, kind, has_exercises=bool(exercises(src))))
    nb.metadata = {
        "kernelspec": {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"},
        "language_info": {"name": "python"},
        "course": {"source": str(src.relative_to(ROOT)), "source_sha256": sha256(src)},
    }
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"{kind[0]}{i:03d}"
    return nb


def execute(nb, cwd):
    NotebookClient(nb, timeout=300, kernel_name="python3", record_timing=False,
                   resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def exercises(src):
    """Names of the exercises in a source, in order."""
    names = []
    for cell in jupytext.read(src, fmt="py:percent").cells:
        if cell.cell_type == "code":
            names += split_solutions(cell.source, keep=True)[1]
    return names


def build(src):
    sol = render(src, "solutions")
    has_exercises = bool(exercises(src))
    out = []
    if has_exercises:
        execute(sol, SOURCES)
        path = SOURCES / (src.stem + ".ipynb")
        nbformat.write(sol, path)
        out.append(path)
    stub = render(src, "lessons")
    for cell in stub.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    path = ROOT / "lessons" / (src.stem + ".ipynb")
    nbformat.write(stub, path)
    out.append(path)
    return out


def main(argv):
    prefix = argv[0] if argv else ""
    todo = sources(prefix)
    if not todo:
        sys.exit(f"no sources in {SOURCES} start with {prefix!r}")
    for src in todo:
        print(f"building {src.relative_to(ROOT)} ...", flush=True)
        t0 = time.perf_counter()
        for path in build(src):
            print(f"  wrote {path.relative_to(ROOT)}", flush=True)
        print(f"  took {time.perf_counter() - t0:.1f} s (executing the solutions included)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
