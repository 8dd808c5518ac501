"""Grade lesson notebooks exercise by exercise, each in its own sandbox, on the course's checks.

    python -m tools.grade lessons/03_pipeline.ipynb             # one line per exercise
    python -m tools.grade SUBMISSIONS_DIR --report grades.csv   # one row per submitted file
    python -m tools.grade SUBMISSIONS_DIR -j 2 --lesson 00      # two at a time; lesson 00 only
    python -m tools.grade SUBMISSIONS_DIR --container podman    # each in a container (README)
    make grade LESSON=03                                        # the first, for lessons/03_*

A submission is graded on the course's own notebook, built from its source: only its
exercise cells are the student's (found by ids made from the exercises' labels; see
``tools/grader/submission.py``); every other cell, check cells included, is the course's.
It runs in a fresh copy of what a student has (``emulator/`` and ``lessons/``, never
``solutions/`` or ``tools/``), in a kernel that imports that copy's library, under limits
on wall time per cell (``--cell-timeout``, then the cell is interrupted) and per notebook
(``--timeout``, then the kernel is killed) and on memory (``--memory-mb``). The checks'
outcomes come back over a signed channel, never from what the notebook prints; a
submission that changed the functions the checks run is ``TAMPERED``. Every process a
submission started is ended before its row is made, and the report is written after
every kernel has ended. Exercise statuses: ``PASS``, ``FAIL`` (the check's message
follows), ``NOT ATTEMPTED``, ``NOT RUN`` (its check never ran, and why), ``NOT FOUND``
(see ``tools/grader/judge.py``). A file that cannot be graded gives an ``ERROR`` row and
the batch goes on. The report's columns are in ``tools/grader/report.py``; each student
also gets a feedback file (``--feedback``). The student's form exits with status 1 unless
every exercise passed.

Every kernel runs as the user who runs this: what that protects against, and what only a
container does, is in README.md ("Grading a class").
"""

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat

from tools.grader import container, processes, report, students
from tools.grader.judge import NOT_FOUND, NOT_RUN, PASS
from tools.grader.submission import BadSubmission, Course, assemble

ROOT = Path(__file__).resolve().parent.parent
RUNNERS, RUNNERS_LOCK = set(), threading.Lock()  # the runners alive now: not orphans of this process


def row_for(path, folder):
    sub = str(Path(path).relative_to(folder)) if folder else str(path)
    return {"path": str(path), "submission": sub, "student": students.student_of(path, folder) if folder
            else Path(path).stem, "lesson": "", "status": "graded", "why": "", "exercises": [], "notes": [],
            "seconds": 0.0}


def run_job(job, args):
    """Run the runner on ``job`` (host or container); its outcome, or why there is none."""
    token = secrets.token_hex(8)
    env = dict(os.environ, **{processes.MARKER: token})
    cmd = (container.command(args.container, args.image, job, args.memory_mb, token) if args.container else
           [sys.executable, "-m", "tools.grader.runner", str(job), "--course", str(args.course)])
    with RUNNERS_LOCK:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                start_new_session=True, text=True)
        RUNNERS.add(proc.pid)
    try:
        log, _ = proc.communicate(timeout=args.timeout + 60)
        why = f"the grader's runner failed: {log.strip().splitlines()[-1][:300] if log.strip() else proc.returncode}"
    except subprocess.TimeoutExpired:
        why = f"TIMEOUT: still running {args.timeout + 60} s after it started, and was killed"
        if args.container:
            subprocess.run(container.kill_command(args.container, token), capture_output=True, timeout=60)
        processes.end(lambda: [proc.pid] + processes.descendants(proc.pid))
        proc.wait()
    with RUNNERS_LOCK:
        RUNNERS.discard(proc.pid)
    ended = processes.end(lambda: processes.marked(token)) | orphans()
    outcome = json.loads((job / "outcome.json").read_text()) if (job / "outcome.json").exists() else None
    return outcome, why, len(ended)


def orphans():
    """End the processes that became this one's children when a runner ended (a double fork).
    The runners alive are read again, under the lock that starting one holds, each time the
    children are listed: a runner another thread starts meanwhile is never taken for one."""

    def find():
        with RUNNERS_LOCK:
            return processes.orphans_of(os.getpid(), keep=set(RUNNERS))

    return processes.end(find)


def grade_file(path, folder, course, args, expect):
    """One submission's row; ``expect``: the only lesson this batch grades, if one."""
    t0 = time.perf_counter()
    row = row_for(path, folder)
    row["lesson"] = course.named(path) or ""
    try:
        nb, plan, row["notes"] = assemble(path, course, expect)
    except BadSubmission as exc:
        row.update(status="ERROR", why=str(exc))
        return row
    names = course.names(plan["lesson"])
    row["lesson"] = plan["lesson"]
    plan.update(cell_timeout=min(args.cell_timeout, args.timeout), timeout=args.timeout, memory_mb=args.memory_mb)
    with tempfile.TemporaryDirectory(prefix="grade-job-") as job:
        job = Path(job)
        nbformat.write(nb, job / "notebook.ipynb")
        (job / "plan.json").write_text(json.dumps(plan))
        outcome, why, ended = run_job(job, args)
    if ended:
        row["notes"].append(f"{ended} process(es) it started outlived its runner, and were ended")
    if outcome is None:
        row.update(status="TIMEOUT" if why.startswith("TIMEOUT") else "ERROR", why=why,
                   exercises=[[n, NOT_RUN, why] for n in names])
        return row
    by_label = outcome["exercises"]
    for label, why_missing in plan["missing"].items():
        by_label[label] = [NOT_FOUND, why_missing]
    row["exercises"] = [[name, *by_label[course.label(name)]] for name in names]
    if outcome["left_running"]:
        row["notes"].append(f"{outcome['left_running']} process(es) it started were still running when its notebook "
                            f"ended, and were ended")
    if outcome["tampered"]:
        row.update(status="TAMPERED", why="; ".join(outcome["tampered"][:5]))
    elif outcome["stopped"].startswith(("the kernel did not import", "the kernel could not start")):
        row.update(status="ERROR", why=outcome["stopped"])
    elif outcome["timed_out"]:
        row.update(status="TIMEOUT", why=outcome["stopped"])
    row["seconds"] = time.perf_counter() - t0
    return row


def grade_all(paths, folder, args):
    course = Course(args.course)
    expect = course.lesson_named(args.lesson) if args.lesson else None
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        rows = list(pool.map(lambda p: grade_file(p, folder, course, args, expect), paths))
    orphans()  # nothing outlives the batch
    return students.counting(rows), course


def student_report(row):
    """What the student reads: one line per exercise."""
    exercises = row["exercises"]
    lines = []
    if row["status"] in ("ERROR", "TAMPERED") or not exercises:
        lines.append(f"{row['path']}: {row['status']}: {row['why']}")
    if exercises and row["status"] != "TAMPERED":
        passed = sum(status == PASS for _, status, _ in exercises)
        lines.insert(0, f"{row['path']}: {passed} of {len(exercises)} exercises passed (ran in {row['seconds']:.0f} s)")
        lines += [f"  {status:<14s} {name}" + (f": {message}" if message and status != PASS else "")
                  for name, status, message in exercises]
    return lines + [f"  note: {note}" for note in row["notes"]]


def options(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("paths", nargs="*", help="notebooks to grade, or one folder of submissions")
    ap.add_argument("--report", default="grades.csv", help="the CSV a folder's grades go to (default grades.csv)")
    ap.add_argument("--feedback", help="the folder of per-student feedback files (default: REPORT's name + _feedback)")
    ap.add_argument("--timeout", type=int, default=600, help="seconds per notebook (default 600)")
    ap.add_argument("--cell-timeout", type=int, default=120, help="seconds before a cell is interrupted (default 120)")
    ap.add_argument("--memory-mb", type=int, default=4096, help="address space per kernel, MiB (default 4096; 0: none)")
    ap.add_argument("-j", "--jobs", type=int, default=1, help="submissions graded at once (default 1)")
    ap.add_argument("--lesson", help="grade only this lesson (e.g. 00): a notebook of another is an error row")
    ap.add_argument("--course", type=Path, default=ROOT, help="the course to grade against (default: this one)")
    ap.add_argument("--container", choices=container.ENGINES, help="run each submission in a container (README)")
    ap.add_argument("--image", default=container.IMAGE, help=f"the container image (default {container.IMAGE})")
    args = ap.parse_args(argv)
    if args.timeout < 1 or args.cell_timeout < 1 or args.jobs < 1 or args.memory_mb < 0:
        ap.error("--timeout, --cell-timeout and -j take positive numbers, --memory-mb 0 or more")
    if args.container and not container.available(args.container):
        ap.error(f"--container {args.container}: `{args.container}` is not on PATH")
    return ap, args


def main(argv=None):
    ap, args = options(argv)
    paths = [Path(p) for p in args.paths]
    processes.become_subreaper()
    if len(paths) == 1 and paths[0].is_dir():
        folder = paths[0]
        rows, course = grade_all(students.find(folder, ".ipynb"), folder, args)
        out = Path(args.report)
        report.write_feedback(rows, args.feedback or out.with_name(out.stem + "_feedback"))
        report.write_csv(rows, out, course.labels)
        print(f"graded {len(rows)} submission(s) -> {out}")
        return 0
    missing = [str(p) for p in paths if not p.is_file()]
    if not paths or missing:
        ap.error("give notebooks to grade (or one folder of submissions); not found: "
                 + (", ".join(missing) or "none given"))
    rows, _ = grade_all(paths, None, args)
    for row in rows:
        print("\n".join(student_report(row)), flush=True)
    return 0 if all(r["status"] == "graded" and r["exercises"] and all(s == PASS for _, s, _ in r["exercises"])
                    for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
