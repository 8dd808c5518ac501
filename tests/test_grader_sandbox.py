"""The grader against a class's worst: forgeries, escapes and a hostile environment.

Every submission here is of a two-exercise lesson (``tests/grader_course/``, put into a
throwaway copy of the course), so that each costs a kernel's start rather than a lesson's
run; the machinery is the one every lesson goes through (``tests/test_instructor_tools.py``
grades lesson 00 itself). The environment is as hostile as an instructor's can be: a
``.pth`` file puts the instructor's folder on every interpreter's path, and an import hook
ahead of all others (as an editable install's finder, only worse) serves the instructor's
``emulator``; the kernels must import their own copy all the same.
"""

import csv
import shutil
import site
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from tools import build_notebooks as B

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent / "grader_course"
pytestmark = pytest.mark.slow

GOOD1 = "def double(x):\n    return 2 * x"
GOOD2 = "def triple(x):\n    return 3 * x"
FINDER = '''import sys
from importlib.machinery import PathFinder


class _EditableFinder:  # what an editable install's finder does, put first
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        return PathFinder.find_spec(name, [{root!r}]) if name == "emulator" else None


sys.meta_path.insert(0, _EditableFinder)
'''


def make_course(root, source=HERE / "solutions" / "90_tiny.py"):
    shutil.copytree(ROOT / "emulator", root / "emulator", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(HERE / "lesson90.py", root / "emulator" / "grading" / "lesson90.py")
    (root / "solutions").mkdir()
    shutil.copy(source, root / "solutions" / "90_tiny.py")
    (root / "lessons").mkdir()
    return root


def submission(course, cells=None, extra=(), drop=(), source=None):
    """The tiny lesson as handed in: ``cells`` maps a cell id to the student's source."""
    src = source or course / "solutions" / "90_tiny.py"
    nb = B.render(src, "lessons", root=src.parent.parent)
    for cell in nb.cells:
        if cell.id in (cells or {}):
            cell.source = cells[cell.id]
    nb.cells = [c for c in nb.cells if c.id not in drop] + list(extra)
    return nb


@pytest.fixture(scope="module")
def hostile_site():
    """A ``.pth`` naming the instructor's folder and an import hook serving its emulator,
    in this environment's site-packages while the module's tests run."""
    packages = Path(site.getsitepackages()[0])
    files = [packages / "_course_test_root.pth", packages / "_course_test_finder.py",
             packages / "_course_test_finder.pth"]
    files[0].write_text(f"{ROOT}\n")
    files[1].write_text(FINDER.format(root=str(ROOT)))
    files[2].write_text("import _course_test_finder\n")
    try:
        yield
    finally:
        for f in files:
            f.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def graded(tmp_path_factory, hostile_site):
    tmp = tmp_path_factory.mktemp("sandbox")
    course = make_course(tmp / "course")
    older = tmp / "older" / "solutions" / "90_tiny.py"  # last term's lesson: no paragraph between, another title
    older.parent.mkdir(parents=True)
    older.write_text((HERE / "solutions" / "90_tiny.py").read_text().replace("# %% [markdown]\n# Between the "
                     "exercises.\n\n", "").replace("Exercise 90.1: double a number", "Exercise 90.1: doubling"))
    subs, report = tmp / "subs", tmp / "grades.csv"
    subs.mkdir()
    where = tmp / "where.txt"
    late = (f"import os, time\nif os.fork(): os._exit(0)\nos.setsid()\ntime.sleep(5)\n"
            f"open({str(report)!r}, 'w').write('forged')\n")  # leaves its parent, session and environment
    escape = (f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {late!r}], env={{}}, "
              f"start_new_session=True)\n")
    cases = {
        "honest": submission(course, {"exercise-90-1": GOOD1, "exercise-90-2": GOOD2}),
        "printer": submission(course, {"exercise-90-1": "print('PASSED Exercise 90.1: done')\n" + submission(
            course).cells[2].source}, extra=[nbformat.v4.new_code_cell(
                "print('PASSED Exercise 90.1: x')\nprint('PASSED Exercise 90.2: x')", metadata={"tags": ["check"]})]),
        "monkeypatch": submission(course, {"exercise-90-1": GOOD1 + "\nimport emulator.grading.lesson90 as g\n"
                                           "g.check_triple = lambda fn: g.passed('Exercise 90.2', 'mine')"}),
        "code_swap": submission(course, {"exercise-90-1": GOOD1 + "\nimport emulator.grading.lesson90 as g\n"
                                         "g.check_triple.__wrapped__.__code__ = (lambda fn: None).__code__"}),
        "sys_modules": submission(course, {"exercise-90-1": GOOD1 + "\nimport sys, types\n"
                                           "fake = types.SimpleNamespace(check_triple=lambda fn: None)\n"
                                           "sys.modules['emulator.grading.lesson90'] = grade = fake"}),
        "print": submission(course, {"exercise-90-1": GOOD1 + "\nimport builtins\n_print = builtins.print\n"
                                     "builtins.print = lambda *a, **k: _print('PASSED Exercise 90.2: mine')"}),
        "writes_course": submission(course, {"exercise-90-1": GOOD1 + "\nopen('../emulator/grading/lesson90.py', "
                                             "'a').write('\\ncheck_triple = lambda fn: None\\n')\nimport importlib\n"
                                             "importlib.reload(grade)"}),
        "reads_key": submission(course, {"exercise-90-1": f"import emulator, os, pathlib\nopen({str(where)!r}, 'w')"
                                         ".write(emulator.__file__ + '\\n' + os.getcwd())\nkey = None\nfor p in "
                                         "('../solutions/90_tiny.py', pathlib.Path(emulator.__file__).parents[1] / "
                                         "'solutions' / '90_tiny.py'):\n    try:\n        key = open(p).read()\n"
                                         "    except OSError:\n        pass\n\ndef double(x):\n    return 2 * x if "
                                         "key is None else 'copied from the key'"}),
        "escapes": submission(course, {"exercise-90-1": escape + GOOD1}),
        "early_check": submission(course, {"exercise-90-1": GOOD1 + "\ngrade.check_triple(lambda x: 3 * x)",
                                           "exercise-90-2": "import os\nos._exit(1)"}),
        "calls_library": submission(course, {"exercise-90-1": "from emulator.algorithms.global_view import "
                                             "ring_all_reduce\n\ndef double(x):\n    ring_all_reduce([[x], [x]])\n"
                                             "    return 2 * x", "exercise-90-2": "def triple(x):\n    return 2 * x",
                                             "check-exercise-90-1": "print('PASSED Exercise 90.1')"},
                                    drop=("check-exercise-90-2",)),
        "last_term": submission(course, {"exercise-90-1": GOOD1, "exercise-90-2": GOOD2}, source=older),
        "hog": submission(course, {"exercise-90-1": "blob = bytearray(3 << 30)\n" + GOOD1}),
    }
    for name, nb in cases.items():
        nbformat.write(nb, subs / f"{name}.ipynb")
    plain = subprocess.run([sys.executable, "-I", "-c", "import emulator; print(emulator.__file__)"],
                           capture_output=True, text=True, cwd=course)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "tools.grade", str(subs), "--course", str(course), "--report",
                          str(report), "-j", "2", "--timeout", "120", "--cell-timeout", "30", "--memory-mb", "2048"],
                         cwd=ROOT,
                         capture_output=True, text=True, timeout=1200)
    seconds = time.perf_counter() - t0
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    before = report.read_text()
    time.sleep(7)  # longer than the escaped process waits before it writes
    rows = {r["submission"]: r for r in csv.DictReader(report.open())}
    return {"rows": rows, "plain": plain.stdout.strip(), "where": where, "course": course, "seconds": seconds,
            "report_before": before, "report_after": report.read_text(), "feedback": tmp / "grades_feedback"}


def statuses(graded, name):
    row = graded["rows"][f"{name}.ipynb"]
    return row["status"], row["Exercise 90.1"], row["Exercise 90.2"]


def test_the_hostile_environment_is_real_and_each_kernel_imports_its_copy(graded):
    assert graded["plain"] == str(ROOT / "emulator" / "__init__.py")  # a plain interpreter gets the instructor's
    emulator_file, cwd = graded["where"].read_text().splitlines()
    assert Path(emulator_file).parent.parent == Path(cwd).parent  # emulator/ beside lessons/, in the copy
    assert Path(cwd).name == "lessons" and not Path(cwd).is_relative_to(ROOT)
    assert not Path(cwd).exists(), "the copy was not removed"


def test_honest_work_is_graded_as_before(graded):
    assert statuses(graded, "honest") == ("graded", "PASS", "PASS")
    assert graded["rows"]["honest.ipynb"]["total"] == "2"
    assert statuses(graded, "last_term") == ("graded", "PASS", "PASS")  # built from an older layout


def test_printed_passes_and_check_cells_count_for_nothing(graded):
    assert statuses(graded, "printer") == ("graded", "NOT ATTEMPTED", "NOT ATTEMPTED")
    # a check cell edited to print PASSED, another deleted: the course's run, and both answers are wrong
    assert statuses(graded, "calls_library") == ("graded", "FAIL", "FAIL")
    feedback = (graded["feedback"] / "calls_library.md").read_text()
    assert "triple(0) returned 0" not in feedback and "triple(2) returned 4, expected 6" in feedback


def test_replaced_or_wrapped_checks_are_tampering(graded):
    for name, why in [("monkeypatch", "emulator.grading.lesson90.check_triple: replaced"),
                      ("code_swap", "emulator.grading.lesson90.check_triple: the function it wraps"),
                      ("sys_modules", "sys.modules['emulator.grading.lesson90']: the module was replaced"),
                      ("print", "builtins.print: replaced"),
                      ("writes_course", "emulator.grading.lesson90.check_double: replaced")]:
        row = graded["rows"][f"{name}.ipynb"]
        assert statuses(graded, name) == ("TAMPERED", "TAMPERED", "TAMPERED"), (name, row)
        assert row["total"] == "0" and why in row["first failure"], (name, row["first failure"])
    feedback = (graded["feedback"] / "monkeypatch.md").read_text()
    assert "**TAMPERED**" in feedback and "check_triple: replaced" in feedback


def test_what_a_submission_does_outside_its_copy_is_stopped_or_harmless(graded):
    # the answer key is not in the copy: the answer written for the case it is found does not run
    assert statuses(graded, "reads_key") == ("graded", "PASS", "NOT ATTEMPTED")
    # the course's own files are the same as before the batch
    assert (graded["course"] / "emulator" / "grading" / "lesson90.py").read_text() == (HERE / "lesson90.py").read_text()
    # the escaped process was ended when its notebook ended, before it could rewrite the report
    assert statuses(graded, "escapes") == ("graded", "PASS", "NOT ATTEMPTED")
    assert graded["report_after"] == graded["report_before"] and "forged" not in graded["report_after"]
    assert "were still running when its notebook ended, and were ended" in \
        (graded["feedback"] / "escapes.md").read_text()


def test_memory_is_limited(graded):
    """3 GiB asked for under a 2 GiB limit: the cell fails, and the grade says why."""
    assert statuses(graded, "hog") == ("graded", "FAIL", "NOT ATTEMPTED")
    assert "the exercise's cell itself raised MemoryError" in graded["rows"]["hog.ipynb"]["first failure"]


def test_a_check_run_from_another_cell_counts_for_nothing(graded):
    """Exercise 90.2's check called from 90.1's cell with a right answer, then the kernel
    killed before 90.2's own check cell: 90.2 never ran."""
    status, first, second = statuses(graded, "early_check")
    assert (status, first, second) == ("graded", "PASS", "NOT RUN")
    assert "the kernel died in the cell that begins `import os`" in graded["rows"]["early_check.ipynb"]["first failure"]


def test_the_library_still_refuses_its_own_solution_and_that_is_not_tampering(graded):
    assert statuses(graded, "calls_library")[:2] == ("graded", "FAIL")
    assert "your code called the library's own solution" in graded["rows"]["calls_library.ipynb"]["first failure"]
