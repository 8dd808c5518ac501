"""Problem sets: per-student variants of the napkin problems and Problem 8.1, and grading.

    python -m tools.problem_set make --students alice,bob --out sheets/
    python -m tools.problem_set grade ANSWERS_DIR --report grades.csv

``make`` writes one Markdown sheet per student (``sheets/alice.md``): the problems, with
numbers drawn from the student's id, and the answer format. ``grade`` reads every JSON file
under ``ANSWERS_DIR`` (``alice.json``, or ``alice/answers.json`` in per-student folders: the
student is named as ``tools.grade`` names them, see ``tools/grader/students.py``), each
``{"Napkin 0.1": [flat, channels], "Napkin 0.2": busbw, ...}``, recomputes that student's
numbers from the id, compares with the model (2% tolerance) and writes a row per file: a
file that is empty, not UTF-8, not JSON or not a JSON object gets an ``ERROR`` row saying
so, and the rest are graded. Variants and answers are in ``emulator/grading/problem_sets.py``.
"""

import argparse
import csv
import json
from pathlib import Path

from emulator.grading import problem_sets as P
from tools.grader.students import BadFile, counting, find, read_json, student_of


def make(students, out):
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for student in students:
        lines = [f"# Problem set for {student}", "",
                 f"Answer in `{student}.json`, a JSON object with one entry per problem (its title as the key).", ""]
        for problem in P.PROBLEMS:
            lines += [f"## {problem}", "", P.statement(student, problem), ""]
        template = json.dumps({problem: None for problem in P.PROBLEMS}, indent=1)
        lines += ["## Your answer file", "", f"Copy this into `{student}.json` and replace each null:", "",
                  "```json", template, "```", ""]
        (out / f"{student}.md").write_text("\n".join(lines))
    return [out / f"{s}.md" for s in students]


def grade_answers(student, answers):
    """``(statuses, first failure)`` for one student's answers (a dict)."""
    cells, first = [], ""
    for problem in P.PROBLEMS:
        if answers.get(problem) is None:
            ok, why = False, "no answer"
        else:
            try:
                ok, why = P.grade_answer(problem, P.variant(student, problem), answers[problem])
            except Exception as exc:  # noqa: BLE001 -- an answer of a shape the problem cannot read
                ok, why = False, f"the answer {str(answers[problem])[:60]!r} cannot be read ({type(exc).__name__})"
        cells.append("PASS" if ok else "FAIL")
        first = first or ("" if ok else f"{problem}: {why}")
    return cells, first


def grade(folder, report):
    """One row per answer file: submission, student, status, counts, passed, each problem, first failure."""
    folder, rows = Path(folder), []
    for path in find(folder, ".json"):
        row = {"path": path, "submission": str(path.relative_to(folder)), "student": student_of(path, folder),
               "lesson": "problem set"}
        try:
            answers, _ = read_json(path, "an answer file")
            if not isinstance(answers, dict):
                raise BadFile(f"a JSON {type(answers).__name__}, not an object: the answer file is one object with a "
                              f"key per problem (see your sheet)")
        except BadFile as exc:
            row.update(status="ERROR", cells=[""] * len(P.PROBLEMS), first=f"ERROR: {exc}")
        else:
            cells, first = grade_answers(row["student"], answers)
            row.update(status="graded", cells=cells, first=first)
        rows.append(row)
    counting(rows)
    table = [[r["submission"], r["student"], r["status"], r["counts"], r["cells"].count("PASS")] + r["cells"]
             + [r["first"]] for r in rows]
    with open(report, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["submission", "student", "status", "counts", "passed"] + list(P.PROBLEMS) + ["first failure"])
        w.writerows(table)
    return table


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make", help="write a sheet per student")
    m.add_argument("--students", required=True, help="comma-separated student ids")
    m.add_argument("--out", default="sheets")
    g = sub.add_parser("grade", help="grade a folder of answer files")
    g.add_argument("folder")
    g.add_argument("--report", default="problem_set_grades.csv")
    args = ap.parse_args(argv)
    if args.command == "make":
        paths = make([s.strip() for s in args.students.split(",") if s.strip()], args.out)
        print(f"wrote {len(paths)} sheet(s) in {args.out}")
    else:
        rows = grade(Path(args.folder), args.report)
        print(f"graded {len(rows)} answer file(s) -> {args.report}")


if __name__ == "__main__":
    main()
