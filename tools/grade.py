"""Grade lesson notebooks exercise by exercise.

    python -m tools.grade lessons/03_pipeline.ipynb            # one line per exercise
    python -m tools.grade SUBMISSIONS_DIR --report grades.csv  # one row per submission
    make grade LESSON=03                                       # the first, for lessons/03_*

Each notebook runs from the top in a fresh kernel, in a process of its own that is killed
after ``--timeout`` seconds, so a submission that loops forever or kills its kernel costs
at most that and never stops the others. A failing cell does not stop the run, and a cell
that runs longer than ``--cell-timeout`` is interrupted, so every exercise whose check can
run is graded. Every exercise of the lesson (as its source ``solutions/NN_name.py`` names
them) gets one of:

* ``PASS``: its check printed ``PASSED``;
* ``FAIL``: its check raised; the check's message follows;
* ``NOT ATTEMPTED``: its stub still raises ``NotImplementedError``;
* ``NOT RUN``: its check never ran (the kernel died or the time ran out before it, or
  its check cell is gone); the reason follows.

Check cells are the cells tagged ``check``; what they print and raise is read as
:mod:`emulator.grading.progress` writes it. A submission is matched to its lesson by the
metadata the course's notebooks carry (``course.source``), or by its file name. The
student's form exits with status 1 unless every exercise passed.

``python -m tools.grade --one NOTEBOOK RESULT.json`` grades one notebook in this process
(what the other forms run in a child process).
"""

import argparse
import csv
import importlib
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

from tools import build_notebooks as B

ROOT = Path(__file__).resolve().parent.parent
PASS, FAIL, NOT_ATTEMPTED, NOT_RUN = "PASS", "FAIL", "NOT ATTEMPTED", "NOT RUN"
LINE = re.compile(rf"^(?P<status>PASSED|NOT ATTEMPTED) (?P<label>{B.LABEL.pattern})\b(?P<rest>.*)$")
FAILURES = ("CheckFailed", "Refused")  # what a check raises when the answer is wrong


def lesson_of(nb, path):
    """The lesson's stem (``00_collectives``) from the notebook's metadata or file name."""
    source = nb.metadata.get("course", {}).get("source", "")
    if source and (ROOT / source).exists():
        return Path(source).stem
    for key in sorted(p.stem for p in (ROOT / "solutions").glob("[0-9][0-9]_*.py")):
        if key in path.stem or key[:2] == path.stem[:2]:
            return key
    return None


def first_line(text, limit=300):
    line = next((l for l in str(text).splitlines() if l.strip()), "")
    return line[:limit]


def without_label(label, text):
    """A check's message without the label it begins with."""
    return text[len(label):].lstrip(":,. ") if text.startswith(label) else text


def begins(cell):
    """How a student finds a cell: its first line of code."""
    return first_line(cell.source, 60) or "(an empty cell)"


def check_label(cell, lesson):
    """The exercise a check cell grades: that of the lesson's check it calls."""
    module = importlib.import_module(f"emulator.grading.lesson{lesson[:2]}")
    for name in re.findall(r"(\w+)\s*\(", cell.source):
        label = getattr(getattr(module, name, None), "exercise", None)
        if label:
            return label
    return None


def outcomes(cells, lesson):
    """``{label: (status, message)}`` from the outputs of the check cells, the last word
    of each exercise winning."""
    found = {}
    for cell in cells:
        if cell.cell_type != "code" or "check" not in cell.metadata.get("tags", []):
            continue
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                for line in out.get("text", "").splitlines():
                    m = LINE.match(line)
                    if m and m["status"] == "PASSED":
                        found[m["label"]] = (PASS, "")
                    elif m:
                        rest = m["rest"].strip()
                        found[m["label"]] = (NOT_ATTEMPTED, rest if rest.startswith("builds on") else "")
            elif out.output_type == "error":
                label = B.LABEL.match(out.evalue)
                if label and out.ename in FAILURES:
                    found[label[0]] = (FAIL, without_label(label[0], first_line(out.evalue)))
                elif label and out.ename == "NotImplementedError":  # a lesson that never called setup()
                    found[label[0]] = (NOT_ATTEMPTED, "")
                else:  # the check could not start (a name not defined, ...) or was interrupted
                    label = check_label(cell, lesson)
                    if label and out.ename == "KeyboardInterrupt":
                        found[label] = (FAIL, "its check ran past the time limit of a cell and was interrupted")
                    elif label:
                        found[label] = (FAIL, f"its check cell raised {out.ename}: {first_line(out.evalue)}")
    return found


def run_notebook(nb, cell_timeout):
    """Run every cell in a fresh kernel, going on after errors and interrupting a cell
    that runs too long; return why the run stopped early ("" if it did not)."""
    client = NotebookClient(nb, timeout=cell_timeout, kernel_name="python3", allow_errors=True,
                            interrupt_on_timeout=True, resources={"metadata": {"path": str(ROOT / "lessons")}})
    with client.setup_kernel():
        for index, cell in enumerate(nb.cells):
            try:
                client.execute_cell(cell, index)
            except DeadKernelError:
                return f"the kernel died in the cell that begins `{begins(cell)}`"
            except Exception as exc:  # noqa: BLE001 -- the run cannot go on: grade what ran
                return f"the run stopped in the cell that begins `{begins(cell)}`: {type(exc).__name__}: " \
                       f"{first_line(exc)}"
    return ""


def grade_one(path, cell_timeout):
    """Run one notebook; return {"lesson", "exercises": [[name, status, message]], "stopped"}."""
    try:
        nb = nbformat.read(path, 4)
    except Exception as exc:  # noqa: BLE001 -- not a notebook at all
        return {"lesson": None, "exercises": [], "stopped": f"cannot read it as a notebook: {first_line(exc)}"}
    lesson = lesson_of(nb, Path(path))
    if lesson is None:
        return {"lesson": None, "exercises": [], "stopped": "no lesson of the course matches it (metadata or name)"}
    stopped = run_notebook(nb, cell_timeout)
    return {"lesson": lesson, "exercises": judge(lesson, outcomes(nb.cells, lesson), stopped), "stopped": stopped}


def judge(lesson, found, stopped):
    """One ``[name, status, message]`` per exercise of ``lesson``."""
    rows = []
    for name in B.exercise_names(ROOT / "solutions" / f"{lesson}.py"):
        label = B.LABEL.match(name)[0]
        if label in found:
            status, message = found[label]
        else:
            status, message = NOT_RUN, stopped or "no check reported it: is its check cell (tagged `check`) still there?"
        rows.append([name, status, message])
    return rows


def grade_in_child(path, timeout, cell_timeout):
    """``grade_one`` in a child process, killed after ``timeout`` seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        try:
            proc = subprocess.run([sys.executable, "-m", "tools.grade", "--one", str(path), str(result),
                                   "--cell-timeout", str(cell_timeout)], cwd=ROOT, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"lesson": None, "exercises": [], "stopped": f"TIMEOUT: still running after {timeout} s"}
        if result.exists():
            return json.loads(result.read_text())
        return {"lesson": None, "exercises": [], "stopped": first_line(proc.stderr[-2000:]) or "the grader failed"}


def complete(graded, path):
    """A result with its exercises listed even when nothing could run (time out)."""
    if graded["exercises"] or graded["lesson"]:
        return graded
    try:
        lesson = lesson_of(nbformat.read(path, 4), Path(path))
    except Exception:  # noqa: BLE001
        lesson = None
    if lesson:
        graded = dict(graded, lesson=lesson, exercises=judge(lesson, {}, graded["stopped"]))
    return graded


def grade_folder(folder, timeout, cell_timeout):
    rows = []
    for path in sorted(Path(folder).rglob("*.ipynb")):
        if ".ipynb_checkpoints" not in path.parts:
            rows.append((path, complete(grade_in_child(path, timeout, cell_timeout), path)))
    return rows


def report(rows, out):
    """The CSV: one row per submission, one column per exercise (by its label)."""
    labels = []
    for lesson in sorted({g["lesson"] for _, g in rows if g.get("lesson")}):
        labels += [B.LABEL.match(n)[0] for n in B.exercise_names(ROOT / "solutions" / f"{lesson}.py")]
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["submission", "lesson", "passed", "of"] + labels + ["first failure"])
        for path, g in rows:
            by_label = {B.LABEL.match(name)[0]: (status, message) for name, status, message in g["exercises"]}
            failure = next((f"{B.LABEL.match(name)[0]} {status}: {message}".rstrip(": ")
                            for name, status, message in g["exercises"] if status != PASS), "")
            passed = sum(status == PASS for _, status, _ in g["exercises"])
            w.writerow([path.name, g.get("lesson") or "?", passed, len(g["exercises"])]
                       + [by_label.get(label, ("", ""))[0] for label in labels]
                       + [failure or ("" if g["exercises"] else g.get("stopped", ""))])
    return out


def student_report(path, graded, seconds):
    """What the student reads: one line per exercise."""
    lines = []
    exercises = graded["exercises"]
    if not exercises:
        return [f"{path}: not graded: {graded.get('stopped')}"]
    passed = sum(status == PASS for _, status, _ in exercises)
    lines.append(f"{path}: {passed} of {len(exercises)} exercises passed (ran in {seconds:.0f} s)")
    for name, status, message in exercises:
        lines.append(f"  {status:<14s} {name}" + (f": {message}" if message else ""))
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", help="notebooks to grade, or one folder of submissions")
    ap.add_argument("--report", default="grades.csv", help="the CSV a folder's grades go to (default grades.csv)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per notebook (default 600)")
    ap.add_argument("--cell-timeout", type=int, default=120,
                    help="seconds before a cell is interrupted (default 120)")
    ap.add_argument("--one", nargs=2, metavar=("NOTEBOOK", "RESULT"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    cell_timeout = min(args.cell_timeout, args.timeout)
    if args.one:
        Path(args.one[1]).write_text(json.dumps(grade_one(args.one[0], cell_timeout)))
        return 0
    paths = [Path(p) for p in args.paths]
    if len(paths) == 1 and paths[0].is_dir():
        rows = grade_folder(paths[0], args.timeout, cell_timeout)
        print(f"graded {len(rows)} submission(s) -> {report(rows, args.report)}")
        return 0
    missing = [str(p) for p in paths if not p.is_file()]
    if not paths or missing:
        ap.error(f"give notebooks to grade (or one folder of submissions); not found: {', '.join(missing) or 'none given'}")
    all_passed = True
    for path in paths:
        t = time.perf_counter()
        graded = complete(grade_in_child(path, args.timeout, cell_timeout), path)
        print("\n".join(student_report(path, graded, time.perf_counter() - t)), flush=True)
        all_passed &= bool(graded["exercises"]) and all(s == PASS for _, s, _ in graded["exercises"])
    return 0 if all_passed else 1


if __name__ == "__main__":
    sys.exit(main())
