"""Grade a folder of filled-in lesson notebooks: one row per submission.

    python -m tools.grade SUBMISSIONS_DIR --report grades.csv [--timeout 300]

Every ``*.ipynb`` under the folder is executed in a fresh kernel, in a process of its own
that is killed after ``--timeout`` seconds, so a submission that loops forever or crashes
the kernel costs at most that and never stops the others. Each check cell of the lesson
(the cells tagged ``check``) gives one column: ``PASS``, ``FAIL`` (the check raised),
``ERROR`` (the notebook broke before the check could run), ``TIMEOUT`` or ``NOT RUN``.
The exercise each check grades is read from the answer key (``solutions/``), and the
first failure's message goes in the last column. A submission is matched to its lesson
by the metadata the course's notebooks carry (``course.source``), or by its file name.

``python -m tools.grade --one NOTEBOOK RESULT.json`` grades one notebook in this process
(what the batch mode runs in a child process).
"""

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent


def lesson_of(nb, path):
    """The lesson's stem (``00_collectives``) from the notebook's metadata or file name."""
    source = nb.metadata.get("course", {}).get("source", "")
    if source:
        return Path(source).stem
    for key in sorted(p.stem for p in (ROOT / "solutions").glob("[0-9][0-9]_*.py")):
        if key in path.stem or key[:2] == path.stem[:2]:
            return key
    return None


def exercise_labels(lesson):
    """The label of each check cell, in order, from the executed answer key: the name its
    PASSED line gives (``Exercise 1.2``, ``Napkin 0.1``, ``Problem 8.1``)."""
    key = nbformat.read(ROOT / "solutions" / f"{lesson}.ipynb", 4)
    labels = []
    for cell in key.cells:
        if "check" in cell.metadata.get("tags", []):
            text = "".join(o.get("text", "") for o in cell.outputs)
            line = next((l for l in text.splitlines() if l.startswith("PASSED ")), f"PASSED check {len(labels) + 1}:")
            labels.append(line[len("PASSED "):].split(":")[0])
    return labels


def first_line(text, limit=200):
    line = next((l for l in str(text).splitlines() if l.strip()), "")
    return line[:limit]


def grade_one(path, cell_timeout):
    """Execute one notebook; return {"lesson", "checks": [(status, message)]}."""
    nb = nbformat.read(path, 4)
    lesson = lesson_of(nb, Path(path))
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3", allow_errors=True,
                            resources={"metadata": {"path": str(ROOT / "lessons")}})
    broken = None
    try:
        client.execute()
    except Exception as exc:  # noqa: BLE001 -- a dead kernel or a cell timeout: grade what ran
        broken = f"{type(exc).__name__}: {first_line(exc)}"
    checks, before = [], None
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        if "check" not in cell.metadata.get("tags", []):
            if errors and before is None:
                before = f"{errors[0].ename}: {first_line(errors[0].evalue)}"
            continue
        if errors:
            e = errors[0]
            status = "FAIL" if e.ename in ("CheckFailed", "Refused", "NotImplementedError", "AssertionError") else \
                "ERROR"
            checks.append((status, f"{e.ename}: {first_line(e.evalue)}"))
        elif any("PASSED" in o.get("text", "") for o in cell.get("outputs", [])):
            checks.append(("PASS", ""))
        elif cell.get("execution_count") is None:
            checks.append(("NOT RUN", broken or before or "not executed"))
        else:
            checks.append(("FAIL", "the check printed no PASSED line"))
    return {"lesson": lesson, "checks": checks}


def grade_folder(folder, timeout):
    rows = []
    for path in sorted(Path(folder).rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            result = Path(tmp) / "result.json"
            try:
                proc = subprocess.run([sys.executable, "-m", "tools.grade", "--one", str(path), str(result),
                                       "--timeout", str(timeout)], cwd=ROOT, capture_output=True, text=True,
                                      timeout=timeout + 60)
                graded = json.loads(result.read_text()) if result.exists() else \
                    {"lesson": None, "checks": [], "error": first_line(proc.stderr[-2000:]) or "grader failed"}
            except subprocess.TimeoutExpired:
                graded = {"lesson": None, "checks": [], "error": f"TIMEOUT after {timeout} s"}
        rows.append((path, graded))
    return rows


def report(rows, out):
    lessons = {g["lesson"] for _, g in rows if g.get("lesson")}
    labels = {lesson: exercise_labels(lesson) for lesson in lessons}
    width = max((len(v) for v in labels.values()), default=0)
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["submission", "lesson", "passed", "of"] + [f"check {i + 1}" for i in range(width)]
                   + ["first failure"])
        for path, g in rows:
            names = labels.get(g.get("lesson"), [])
            checks = g.get("checks") or []
            if not checks:  # timed out or could not be read at all
                status = "TIMEOUT" if "TIMEOUT" in g.get("error", "") else "ERROR"
                checks = [(status, g.get("error", ""))] * max(len(names), 1)
            cells = [f"{names[i] if i < len(names) else i + 1}: {s}" for i, (s, _) in enumerate(checks)]
            failure = next((f"{names[i] if i < len(names) else i + 1}: {m}" for i, (s, m) in enumerate(checks)
                            if s != "PASS"), "")
            passed = sum(s == "PASS" for s, _ in checks)
            w.writerow([path.name, g.get("lesson") or "?", passed, len(names) or len(checks)]
                       + cells + [""] * (width - len(cells)) + [failure])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", nargs="?", help="folder of submitted notebooks")
    ap.add_argument("--report", default="grades.csv", help="CSV to write (default grades.csv)")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per notebook (default 300)")
    ap.add_argument("--one", nargs=2, metavar=("NOTEBOOK", "RESULT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        Path(args.one[1]).write_text(json.dumps(grade_one(args.one[0], args.timeout)))
        return
    if not args.folder or not Path(args.folder).is_dir():
        ap.error(f"{args.folder!r} is not a folder of notebooks")
    rows = grade_folder(args.folder, args.timeout)
    print(f"graded {len(rows)} submission(s) -> {report(rows, args.report)}")


if __name__ == "__main__":
    main()
