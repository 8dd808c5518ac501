"""The grader's parts, without a kernel: the judge, the signed channel, what counts as
tampering, whose file is whose and which counts, the report, the container command, and
ending what a submission left running. (Its exercise cells: tests/test_grader_submission.py.)"""

import os
import shutil
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest

from emulator.grading import progress
from tools import build_notebooks as B
from tools.grader import container, processes, report, students
from tools.grader.channel import Reader, Writer
from tools.grader.integrity import Baseline
from tools.grader.judge import judge

ROOT = Path(__file__).resolve().parent.parent
LESSON = ROOT / "solutions" / "00_collectives.py"


def cell(role, label=None, ran=True, died=False, errors=(), messages=()):
    return {"role": {"role": role, "label": label}, "ran": ran, "died": died, "errors": list(errors),
            "messages": list(messages)}


def start(label):
    return {"kind": "start", "label": label}


def end(label, status, detail=""):
    return {"kind": "end", "label": label, "status": status, "detail": detail}


PLAN = {"labels": ["Exercise 0.1", "Exercise 0.2", "Exercise 0.3", "Exercise 0.4", "Napkin 0.1", "Napkin 0.2"]}
FINAL = cell("grader", messages=[{"kind": "final"}])


def test_the_judge_takes_each_outcome_from_its_own_check_cell_only():
    cells = [
        cell("exercise", "Exercise 0.1", messages=[start("Exercise 0.2"), end("Exercise 0.2", "passed")]),
        cell("check", "Exercise 0.1", messages=[start("Exercise 0.1"),
                                                end("Exercise 0.1", "passed", "Exercise 0.1: ok")]),
        cell("check", "Exercise 0.2", messages=[start("Exercise 0.2"), end("Exercise 0.2", "not attempted", "x")]),
        cell("check", "Exercise 0.3", messages=[start("Exercise 0.3"), end(
            "Exercise 0.3", "not attempted", "Exercise 0.3 builds on Exercise 0.2: ring all-gather, not attempted")]),
        cell("exercise", "Exercise 0.4", errors=[["FileNotFoundError", "../solutions/00_collectives.py"]]),
        cell("check", "Exercise 0.4", errors=[["NameError", "name 'spmd_ring_all_reduce' is not defined"]]),
        cell("check", "Napkin 0.1", messages=[start("Napkin 0.1"), end("Napkin 0.1", "stopped", "KeyboardInterrupt")]),
        cell("check", "Napkin 0.2", messages=[start("Napkin 0.2"), end(
            "Napkin 0.2", "failed", "Napkin 0.2: expected 370 GB/s, got 211.4 GB/s")]), FINAL]
    out = judge(PLAN, cells, [], "", True)
    assert out["tampered"] == []
    assert out["exercises"] == {
        "Exercise 0.1": ["PASS", "ok"], "Exercise 0.2": ["NOT ATTEMPTED", ""],
        "Exercise 0.3": ["NOT ATTEMPTED", "builds on Exercise 0.2: ring all-gather, not attempted"],
        "Exercise 0.4": ["FAIL", "its check cell raised NameError: name 'spmd_ring_all_reduce' is not defined; the "
                                 "exercise's cell itself raised FileNotFoundError: ../solutions/00_collectives.py"],
        "Napkin 0.1": ["FAIL", "its check ran past the time limit of a cell and was interrupted"],
        "Napkin 0.2": ["FAIL", "expected 370 GB/s, got 211.4 GB/s"]}
    died = judge(PLAN, cells[:2] + [cell("check", "Exercise 0.2", died=True, messages=[start("Exercise 0.2")])],
                 [], "the kernel died in the cell that begins `grade.check_ring_all_gather(ring_all_gather)`", False)
    assert died["tampered"] == [] and died["exercises"]["Exercise 0.1"] == ["PASS", "ok"]
    assert died["exercises"]["Exercise 0.2"] == ["NOT RUN", died["stopped"]] == died["exercises"]["Napkin 0.2"]


def test_the_judge_calls_a_replaced_check_or_a_missing_close_tampering():
    silent = [cell("check", "Exercise 0.1"), FINAL]  # the cell ran, the course's check never started
    assert "the course's check did not report" in judge(PLAN, silent, [], "", True)["tampered"][0]
    other = [cell("check", "Exercise 0.1", messages=[start("Exercise 0.2"), end("Exercise 0.2", "passed")]), FINAL]
    assert judge(PLAN, other, [], "", True)["tampered"] == ["the check cell of Exercise 0.1 ran the check of "
                                                            "Exercise 0.2"]
    ran = cell("check", "Exercise 0.1", messages=[start("Exercise 0.1"), end("Exercise 0.1", "passed")])
    unclosed = judge(PLAN, [ran], [], "", True)
    assert unclosed["tampered"] == ["the notebook ran to its end, but the grader's closing call did not report"]
    early = [cell("exercise", "Exercise 0.1", messages=[{"kind": "final"}]), FINAL]
    assert judge(PLAN, early, [], "", True)["tampered"] == ["the grader's own call (final) was made by the notebook"]
    flagged = [cell("check", "Exercise 0.1", messages=[start("Exercise 0.1"), {"kind": "tamper", "problems": ["p"]},
                                                       end("Exercise 0.1", "passed")]), FINAL]
    assert judge(PLAN, flagged, ["q"], "", True)["tampered"] == ["q", "p"]


def test_the_channel_takes_only_signed_lines_of_its_run_in_order(tmp_path):
    path = tmp_path / "channel"
    path.touch()
    key = os.urandom(32)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND)
    writer, reader = Writer(key, fd, "run1"), Reader(path, key, "run1")
    writer.send("start", label="Exercise 0.1")
    writer.send("end", label="Exercise 0.1", status="passed", detail="")
    assert [m["kind"] for m in reader.read()] == ["start", "end"] and reader.problems == []
    with open(path, "a") as f:
        f.write('{"kind": "end", "label": "Exercise 0.2", "run": "run1", "seq": 3, "status": "passed"}\tdeadbeef\n')
        f.write("PASSED Exercise 0.2: printed\n")
    Writer(os.urandom(32), fd, "run1").send("end", label="Exercise 0.2", status="passed")  # another key
    Writer(key, fd, "run0").send("end", label="Exercise 0.2", status="passed")  # another run (a stale file)
    writer._seq = 0
    writer.send("end", label="Exercise 0.2", status="passed")  # a line replayed
    assert [m["seq"] for m in reader.read()] == [1]
    problems = reader.problems
    assert len(problems) == 5 and all("not signed" in p for p in problems[:3]), problems
    assert "another run" in problems[3] and problems[4] == "results out of order: number 1 after 2"
    os.close(fd)


@pytest.fixture
def graded_module():
    """A throwaway module of checks, as the course's are: wrapped by progress.watch."""
    module = types.ModuleType("emulator_test_checks")
    exec("def check_x(fn):\n    'Exercise 9.9: x'\n    return fn()\n\ndef helper(a, b=1):\n    return a + b\n",
         module.__dict__)
    module.__dict__["__name__"] = "emulator_test_checks"
    for fn in (module.check_x, module.helper):
        fn.__module__ = "emulator_test_checks"
    progress.watch(module)
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_the_baseline_names_each_kind_of_tampering(graded_module):
    import builtins

    base = Baseline(("emulator_test_checks", "builtins"), own=("emulator_test_checks",))
    assert base.changes() == []
    graded_module.helper.__defaults__ = (5,)
    graded_module.check_x.__wrapped__.__code__ = (lambda fn: None).__code__
    saved_print = builtins.print
    builtins.print = lambda *a, **k: None
    try:
        found = base.changes()
    finally:
        builtins.print = saved_print
    assert found == ["builtins.print: replaced", "emulator_test_checks.check_x: the function it wraps, or that "
                     "function's code, was replaced", "emulator_test_checks.helper: its defaults were changed"]
    graded_module.check_x = lambda fn: None
    sys.modules["emulator_test_checks"] = types.ModuleType("emulator_test_checks")
    found = base.changes()
    assert "sys.modules['emulator_test_checks']: the module was replaced or removed" in found
    assert "emulator_test_checks.check_x: replaced" in found


def test_the_library_refusing_its_own_solution_during_a_check_is_not_tampering():
    from emulator.algorithms import global_view as C
    from emulator.grading import lesson00
    from emulator.grading.refuse import refusing

    base = Baseline(("emulator",))
    with refusing("Exercise 0.1", C.ring_reduce_scatter):
        during = base.changes()
    assert during and all(line.endswith("ring_reduce_scatter: its code was replaced") for line in during), during
    assert base.changes() == []
    with pytest.raises(Exception, match="your code called the library's own solution"):
        lesson00.check_ring_reduce_scatter(lambda bufs, net: C.ring_reduce_scatter(bufs))
    assert base.changes() == []


def test_students_are_named_by_their_folder_or_file_and_the_newer_file_counts(tmp_path):
    subs = tmp_path / "subs"
    for rel in ("alice/00_collectives.ipynb", "alice/week2/00_collectives.ipynb", "bob/00_collectives.ipynb",
                "carol.ipynb", ".backup/00_collectives.2025.ipynb", "bob/.ipynb_checkpoints/x.ipynb"):
        (subs / rel).parent.mkdir(parents=True, exist_ok=True)
        (subs / rel).write_text("{}")
    os.utime(subs / "alice/00_collectives.ipynb", (time.time() - 60,) * 2)
    found = students.find(subs, ".ipynb")
    assert [p.relative_to(subs).as_posix() for p in found] == [
        "alice/00_collectives.ipynb", "alice/week2/00_collectives.ipynb", "bob/00_collectives.ipynb", "carol.ipynb"]
    assert [students.student_of(p, subs) for p in found] == ["alice", "alice", "bob", "carol"]
    rows = students.counting([{"path": p, "submission": p.relative_to(subs).as_posix(), "lesson": "00_collectives",
                               "student": students.student_of(p, subs)} for p in found])
    assert [r["counts"] for r in rows] == ["no: alice/week2/00_collectives.ipynb is newer", "yes", "yes", "yes"]


def test_the_report_has_a_row_per_file_with_points_and_a_feedback_file_per_student(tmp_path):
    names = B.exercise_names(LESSON)[:2]
    rows = [{"path": "a", "submission": "alice/00_collectives.ipynb", "student": "alice", "lesson": "00_collectives",
             "status": "graded", "why": "", "counts": "yes", "notes": ["a note"],
             "exercises": [[names[0], "PASS", "fine"], [names[1], "FAIL", "expected 2, got 3"]]},
            {"path": "b", "submission": "bob/00_collectives.ipynb", "student": "bob", "lesson": "00_collectives",
             "status": "TAMPERED", "why": "builtins.print: replaced", "counts": "yes", "notes": [],
             "exercises": [[names[0], "PASS", "fine"], [names[1], "PASS", ""]]},
            {"path": "c", "submission": "carol.ipynb", "student": "carol", "lesson": "", "status": "ERROR",
             "why": "the file is empty", "counts": "yes", "notes": [], "exercises": []}]
    report.write_feedback(rows, tmp_path / "feedback")
    report.write_csv(rows, tmp_path / "grades.csv", lambda lesson: ["Exercise 0.1", "Exercise 0.2"])
    table = list(__import__("csv").DictReader((tmp_path / "grades.csv").open()))
    assert list(table[0]) == ["submission", "student", "lesson", "status", "counts", "total", "of", "Exercise 0.1",
                              "Exercise 0.1 points", "Exercise 0.2", "Exercise 0.2 points", "first failure", "feedback"]
    alice, bob, carol = table
    assert (alice["total"], alice["of"], alice["Exercise 0.1 points"], alice["Exercise 0.2"]) == ("1", "2", "1", "FAIL")
    assert alice["first failure"] == "Exercise 0.2 FAIL: expected 2, got 3"
    assert (bob["total"], bob["Exercise 0.1"]) == ("0", "TAMPERED")
    assert bob["first failure"] == "TAMPERED: builtins.print: replaced"
    assert (carol["status"], carol["lesson"], carol["first failure"]) == ("ERROR", "?", "ERROR: the file is empty")
    text = (tmp_path / "feedback" / "alice.md").read_text()
    assert f"- **PASS** {names[0]}: fine" in text and f"- **FAIL** {names[1]}: expected 2, got 3" in text
    assert "- note: a note" in text and alice["feedback"] == str(tmp_path / "feedback" / "alice.md")


def test_the_container_command_isolates_each_submission(tmp_path):
    cmd = container.command("podman", "course-grader", tmp_path, 4096, "abc")
    assert cmd[:3] == ["podman", "run", "--rm"]
    for flag in ("--network=none", "--cap-drop=ALL", "--read-only", "--pids-limit=256", "--memory=4608m",
                 "--security-opt=no-new-privileges", f"--volume={tmp_path}:/job:rw", "--name=course-grade-abc"):
        assert flag in cmd, flag
    assert [a for a in cmd if a.startswith("--volume")] == [f"--volume={tmp_path}:/job:rw"]  # the job, nothing else
    assert cmd[cmd.index("course-grader") + 1:] == ["python", "-m", "tools.grader.runner", "/job", "--course",
                                                   "/opt/course"]
    with pytest.raises(ValueError, match="use one of docker, podman"):
        container.command("lxc", "course-grader", tmp_path, 0, "abc")
    recipe = (ROOT / "tools" / "grader" / "Containerfile").read_text()
    copied = [line.split()[1] for line in recipe.splitlines() if line.startswith("COPY")]
    assert copied == ["requirements.txt", "emulator", "lessons", "tools/__init__.py", "tools/grader"]
    engine = next((e for e in container.ENGINES if container.available(e)), None)
    if engine is None:
        pytest.skip("neither docker nor podman is installed: the command was checked, not run")
    images = subprocess.run([engine, "image", "inspect", "course-grader"], capture_output=True)
    if images.returncode:
        pytest.skip(f"{engine} is here but the image is not built: {container.__doc__.splitlines()[2].strip()}")
    assert subprocess.run(cmd[:cmd.index("course-grader") + 1] + ["python", "-c", "import emulator"],
                          capture_output=True, timeout=300).returncode == 0


def test_every_process_left_behind_is_found_and_ended(tmp_path):
    """A process that left its session and its parent (a double fork) is found by its
    marker; one that also dropped its environment, as an orphan of a subreaper."""
    token = "t" + os.urandom(4).hex()
    script = ("import os, subprocess, sys, time\n"
              "if os.fork(): os._exit(0)\n"
              "os.setsid()\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], env={})\n"
              "time.sleep(60)\n")
    reaper = ("import subprocess, sys, time\nfrom tools.grader import processes\n"
              "assert processes.become_subreaper()\n"
              f"subprocess.run([sys.executable, '-c', {script!r}])\n"
              "time.sleep(1)\n"
              f"marked = processes.marked({token!r})\n"
              "orphans = processes.orphans_of(__import__('os').getpid())\n"
              "ended = processes.end(lambda: processes.orphans_of(__import__('os').getpid()))\n"
              "print(len(marked), len(orphans), len(ended), len(processes.orphans_of(__import__('os').getpid())))\n")
    out = subprocess.run([sys.executable, "-c", reaper], cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, **{processes.MARKER: token}))
    assert out.stdout.split() == ["1", "2", "2", "0"], out.stderr[-2000:]


def test_make_grade_and_the_folder_mode_skip_lesson_backups(tmp_path):
    dry = subprocess.run(["make", "-n", "grade", "LESSON=00"], cwd=ROOT, capture_output=True, text=True)
    assert dry.returncode == 0 and "lessons/00_collectives.ipynb" in dry.stdout and ".backup" not in dry.stdout
    (tmp_path / ".backup").mkdir()
    shutil.copy(ROOT / "lessons" / "00_collectives.ipynb", tmp_path / ".backup" / "00_collectives.2025.ipynb")
    assert students.find(tmp_path, ".ipynb") == []
