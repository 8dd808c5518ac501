"""The class's grades: one CSV row per submitted file, and one feedback file per student.

Columns: ``submission`` (its path under the submissions folder), ``student`` (see
:mod:`.students`), ``lesson``, ``status`` (``graded``, ``TIMEOUT``: the notebook's time
ran out, what ran before still counts; ``TAMPERED``: scored 0, see ``first failure`` and
the feedback; ``ERROR``: the file could not be graded, and why), ``counts`` (``yes``, or
``no: ...`` for a student's older file of the same lesson), ``total`` and ``of`` (one
point per exercise passed), then for each exercise its status and its points, then
``first failure`` and ``feedback`` (the student's feedback file). Each feedback file lists
every submission of the student with each exercise's status and its check's message.
"""

import csv
from pathlib import Path

from tools.grader.judge import PASS

STATUSES = ("graded", "TIMEOUT", "TAMPERED", "ERROR")


def points(row):
    return {name: int(status == PASS and row["status"] != "TAMPERED") for name, status, _ in row["exercises"]}


def first_failure(row):
    if row["status"] in ("TAMPERED", "ERROR"):
        return f"{row['status']}: {row['why']}"
    for name, status, message in row["exercises"]:
        if status != PASS:
            label = name.split(":")[0]
            return f"{label} {status}: {message}".rstrip(": ")
    return ""


def write_csv(rows, out, labels_of):
    """``labels_of(lesson)``: the exercise labels of a lesson, in order."""
    labels = []
    for lesson in sorted({r["lesson"] for r in rows if r["lesson"]}):
        labels += [label for label in labels_of(lesson) if label not in labels]
    with open(out, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["submission", "student", "lesson", "status", "counts", "total", "of"]
                   + [col for label in labels for col in (label, f"{label} points")] + ["first failure", "feedback"])
        for row in rows:
            score = points(row)
            by_label = {name.split(":")[0]: (status, score[name]) for name, status, _ in row["exercises"]}
            cells = []
            for label in labels:
                status, pts = by_label.get(label, ("", ""))
                cells += [row["status"] if status and row["status"] == "TAMPERED" else status, pts]
            w.writerow([row["submission"], row["student"], row["lesson"] or "?", row["status"], row["counts"],
                        sum(score.values()), len(row["exercises"])] + cells
                       + [first_failure(row), row.get("feedback", "")])
    return out


def feedback_lines(row):
    score = points(row)
    head = f"## {row['submission']}: lesson {row['lesson'] or '?'}, {row['status']}"
    lines = [head, ""]
    if row["exercises"]:
        lines += [f"{sum(score.values())} of {len(row['exercises'])} exercises passed"
                  + ("" if row["counts"] == "yes" else f" (does not count: {row['counts'][4:]})"), ""]
    if row["status"] in ("TAMPERED", "ERROR"):
        lines += [f"**{row['status']}**: {row['why']}", ""]
    for name, status, message in row["exercises"]:
        lines.append(f"- **{status}** {name}" + (f": {message}" if message else ""))
    for note in row.get("notes", []):
        lines.append(f"- note: {note}")
    return lines + [""]


def write_feedback(rows, folder):
    """One Markdown file per student; sets each row's ``feedback`` to its file."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    by_student = {}
    for row in rows:
        by_student.setdefault(row["student"], []).append(row)
    for student, theirs in by_student.items():
        path = folder / f"{student}.md"
        lines = [f"# Feedback for {student}", ""]
        for row in theirs:
            lines += feedback_lines(row)
            row["feedback"] = str(path)
        path.write_text("\n".join(lines))
    return folder
