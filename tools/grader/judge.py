"""What each exercise scored, from what the checks reported during each cell.

An exercise's outcome is what the course's check reported, through the signed channel,
while the course's check cell for that exercise ran: a check called from any other cell
(an exercise cell, a cell of the student's) counts for nothing, and so does anything
printed. Statuses:

* ``PASS``, ``FAIL`` (the check's message follows), ``NOT ATTEMPTED`` (its stub, or one it
  builds on, still raises ``NotImplementedError``);
* ``NOT RUN``: its check cell never ran (the kernel died, the notebook's time ran out);
* ``NOT FOUND`` (set by the grader before the run): no cell of the submission is this
  exercise's, so the course's stub ran in its place.

The submission is ``TAMPERED`` when a report is not signed or out of order, when a
function the checks run was changed (``integrity.py``), when a check cell ran without the
course's check reporting (what the cell calls was replaced), or when the notebook reached
its end and the grader's closing call did not report.
"""

PASS, FAIL, NOT_ATTEMPTED, NOT_RUN, NOT_FOUND, TAMPERED = \
    "PASS", "FAIL", "NOT ATTEMPTED", "NOT RUN", "NOT FOUND", "TAMPERED"
# emulator.grading.progress's words for how a check ended
FROM_CHECK = {"passed": PASS, "failed": FAIL, "not attempted": NOT_ATTEMPTED, "stopped": FAIL}
INTERRUPTED = "its check ran past the time limit of a cell and was interrupted"


def first_line(text, limit=300):
    return next((line for line in str(text).splitlines() if line.strip()), "")[:limit]


def without_label(label, text):
    """A check's message without the label it begins with."""
    return text[len(label):].lstrip(":,. ") if text.startswith(label) else text


def ended(label, message):
    """``(status, message)`` from a check's ``end`` report."""
    status, detail = FROM_CHECK.get(message.get("status"), FAIL), message.get("detail", "")
    if message.get("status") == "stopped":
        return status, INTERRUPTED if detail == "KeyboardInterrupt" else f"its check was stopped by {detail}"
    detail = without_label(label, first_line(detail, 1000))
    if status == NOT_ATTEMPTED:
        return status, detail if detail.startswith("builds on") else ""
    return status, detail


def raised(errors, answer_errors):
    """``(status, message)`` for a check cell that raised before its check could report;
    ``answer_errors``: what the exercise's own cell raised, if anything (often the cause)."""
    ename, evalue = errors[-1]
    if ename == "KeyboardInterrupt":
        return FAIL, INTERRUPTED
    cause = "; the exercise's cell itself raised {}: {}".format(*answer_errors[-1]) if answer_errors else ""
    return FAIL, f"its check cell raised {ename}: {first_line(evalue)}{first_line(cause)}"


def judge(plan, cells, problems, stopped, completed):
    """``{"exercises": {label: [status, message]}, "tampered": [why], "stopped": why}`` from
    the run's cells (``role``, ``ran``, ``died``, ``errors``, ``messages``), the channel's
    ``problems``, why the run stopped early ("" if it did not) and whether it reached its end."""
    tampered, found, closed, answer_errors = list(problems), {}, False, {}
    for cell in cells:
        role, messages = cell["role"], cell["messages"]
        if role["role"] == "exercise":
            answer_errors[role["label"]] = cell["errors"]
        for m in messages:
            if m["kind"] == "tamper":
                tampered += m.get("problems", [])
            elif m["kind"] in ("armed", "final", "hello") and role["role"] != "grader":
                tampered.append(f"the grader's own call ({m['kind']}) was made by the notebook")
            elif m["kind"] == "final":
                closed = True
        if role["role"] != "check" or not (cell["ran"] or cell["died"]):
            continue
        label = role["label"]
        starts = [m["label"] for m in messages if m["kind"] == "start"]
        mine = [m for m in messages if m["kind"] == "end" and m["label"] == label]
        for other in sorted(set(starts) - {label}):
            tampered.append(f"the check cell of {label} ran the check of {other}")
        if mine:
            found[label] = ended(label, mine[-1])
        elif cell["died"]:
            continue  # NOT RUN, with why the run stopped
        elif cell["errors"]:
            found[label] = raised(cell["errors"], answer_errors.get(label))
        elif not starts:
            tampered.append(f"{label}: its check cell ran, but the course's check did not report: something in the "
                            f"notebook replaced what that cell calls")
        else:
            found[label] = (FAIL, "its check started and did not report how it ended")
    if completed and not closed:
        tampered.append("the notebook ran to its end, but the grader's closing call did not report")
    exercises = {label: list(found.get(label, (NOT_RUN, stopped or "its check cell did not run")))
                 for label in plan["labels"]}
    return {"exercises": exercises, "tampered": list(dict.fromkeys(tampered)), "stopped": stopped}
