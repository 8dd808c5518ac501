"""Problem sets: per-student variants of the napkin problems and Problem 8.1, and grading.

    python -m tools.problem_set make --students alice,bob --out sheets/
    python -m tools.problem_set grade ANSWERS_DIR --report grades.csv

``make`` writes one Markdown sheet per student (``sheets/alice.md``): the problems, with
numbers drawn from the student's id, and the answer format. ``grade`` reads one JSON file
per student (``ANSWERS_DIR/alice.json``: ``{"Napkin 0.1": [flat, channels], "Napkin 0.2":
busbw, ...}``), recomputes that student's numbers from the id, compares with the model
(2% tolerance) and writes a row per student. Variants and answers are in
``emulator/grading/problem_sets.py``.
"""

import argparse
import csv
import json
from pathlib import Path

from emulator.grading import problem_sets as P


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


def grade(folder, report):
    rows = []
    for path in sorted(Path(folder).glob("*.json")):
        student = path.stem
        try:
            answers = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            rows.append([student, 0] + ["unreadable"] * len(P.PROBLEMS) + [f"not JSON: {exc}"])
            continue
        cells, first = [], ""
        for problem in P.PROBLEMS:
            if problem not in answers:
                ok, why = False, "no answer"
            else:
                ok, why = P.grade_answer(problem, P.variant(student, problem), answers[problem])
            cells.append("PASS" if ok else "FAIL")
            first = first or ("" if ok else f"{problem}: {why}")
        rows.append([student, cells.count("PASS")] + cells + [first])
    with open(report, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["student", "passed"] + list(P.PROBLEMS) + ["first failure"])
        w.writerows(rows)
    return rows


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
        rows = grade(args.folder, args.report)
        print(f"graded {len(rows)} student(s) -> {args.report}")


if __name__ == "__main__":
    main()
