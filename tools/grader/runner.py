"""Run one assembled submission in its own copy of the course, and say what its checks said.

    python -m tools.grader.runner JOB_DIR --course COURSE_ROOT

``JOB_DIR`` holds ``notebook.ipynb`` (the course's notebook with the student's exercise
cells in it, from :mod:`tools.grader.submission`) and ``plan.json`` (each cell's role and
label, the limits); this writes ``outcome.json`` there. What a student has is copied from
``COURSE_ROOT`` into a fresh folder (``emulator/`` and ``lessons/``, never ``solutions/`` or
``tools/``), which is the kernel's working folder (``lessons/``), HOME and TMPDIR. The kernel
(``kernel.py``) imports that copy's library. Each cell is interrupted after the cell limit;
at the notebook limit the kernel is killed. Then every process left below this one is
ended (:mod:`.processes`) before the outcome is written, and the copy is removed.
"""

import argparse
import json
import os
import secrets
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import nbformat
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager
from jupyter_core.utils import run_sync
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError

from tools.grader import processes
from tools.grader.channel import Reader
from tools.grader.judge import judge

HERE = Path(__file__).resolve().parent
STUDENT_HAS = ("emulator", "lessons")  # what the copy holds; solutions/ and tools/ never
KEPT_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            processes.MARKER)
HIDDEN = ["tools", "solutions", "gpu_labs", "benchmarks"]


def copy_course(course, into):
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".backup", ".ipynb_checkpoints")
    for name in STUDENT_HAS:
        if (Path(course) / name).is_dir():
            shutil.copytree(Path(course) / name, into / name, ignore=ignore, symlinks=False)
    (into / "lessons").mkdir(exist_ok=True)
    for name in (".home", ".tmp"):
        (into / name).mkdir()
    font_cache = Path.home() / ".cache" / "matplotlib"  # built once; a fresh HOME would build it again
    if font_cache.is_dir():
        shutil.copytree(font_cache, into / ".home" / ".cache" / "matplotlib",
                        ignore=shutil.ignore_patterns("tex.cache"))


def kernel_spec(private, config):
    folder = private / "kernels" / "course-sandbox"
    folder.mkdir(parents=True)
    for name in ("kernel.py", "channel.py", "integrity.py"):
        shutil.copy(HERE / name, private / name)
    argv = [sys.executable, "-I", str(private / "kernel.py"), str(config), "-f", "{connection_file}"]
    (folder / "kernel.json").write_text(json.dumps({"argv": argv, "display_name": "course sandbox",
                                                    "language": "python"}))
    return KernelSpecManager(kernel_dirs=[str(private / "kernels")])


def kernel_env(copy):
    env = {k: os.environ[k] for k in KEPT_ENV if k in os.environ}
    home = copy / ".home"
    env.update(HOME=str(home), TMPDIR=str(copy / ".tmp"), IPYTHONDIR=str(home / ".ipython"),
               MPLCONFIGDIR=str(home / ".config" / "matplotlib"), PYTHONDONTWRITEBYTECODE="1")
    return env


def begins(cell):
    """How a student finds a cell: its first line of code."""
    line = next((line for line in cell.source.splitlines() if line.strip()), "")
    return line[:60] or "(an empty cell)"


def grader_cell(source):
    return nbformat.v4.new_code_cell(source, metadata={"course": {"grader": True}})


class Run:
    """One notebook in one kernel, cell by cell, with what the channel said during each."""

    def __init__(self, nb, plan, copy, private, root):
        self.nb, self.plan, self.copy = nb, plan, copy
        run, key = secrets.token_hex(8), secrets.token_bytes(32)
        channel = private / "channel.log"
        channel.touch(mode=0o600)
        (private / "key").write_bytes(key)
        os.chmod(private / "key", 0o600)
        config = private / "config.json"
        config.write_text(json.dumps({
            "run": run, "key": str(private / "key"), "channel": str(channel), "copy": str(copy),
            "own": ["emulator"], "hidden": HIDDEN, "roots": [str(root)], "memory_mb": plan["memory_mb"],
            "cpu_s": plan["timeout"] + 60}))
        self.reader = Reader(channel, key, run)
        # asynchronous, as nbclient's own: a blocking client would wait on a dead kernel's output for ever
        self.km = AsyncKernelManager(kernel_name="course-sandbox", kernel_spec_manager=kernel_spec(private, config))
        self.cells, self.stopped, self.timed_out, self.completed, self.hello = [], "", False, False, {}
        self.kernel_pid, self.left, self.log = None, [], private / "kernel.log"

    def _kill(self):
        self.timed_out = True
        try:
            self.km.provisioner and self.km.provisioner.process and self.km.provisioner.process.kill()
        except OSError:
            pass

    def execute(self):
        grading = [grader_cell("__import__('_grader').arm()")] + list(self.nb.cells) + \
            [grader_cell("__import__('_grader').finish()")]
        roles = [{"role": "grader"}] + self.plan["roles"] + [{"role": "grader"}]
        client = NotebookClient(nbformat.v4.new_notebook(cells=grading), km=self.km, timeout=self.plan["cell_timeout"],
                                allow_errors=True, interrupt_on_timeout=True, record_timing=False,
                                resources={"metadata": {"path": str(self.copy / "lessons")}})
        watchdog = threading.Timer(self.plan["timeout"], self._kill)
        watchdog.start()
        try:
            with open(self.log, "w") as log, client.setup_kernel(env=kernel_env(self.copy), stdout=log, stderr=log):
                self.kernel_pid = getattr(self.km.provisioner, "pid", None)
                hello = self.reader.read()
                self.hello = hello[0] if hello and hello[0]["kind"] == "hello" else {}
                if not self.hello.get("inside"):
                    self.stopped = f"the kernel did not import the course copy's library ({self.hello or 'no word'})"
                    return
                self._cells(client, grading, roles)
        except Exception as exc:  # noqa: BLE001 -- the kernel would not start: say why
            said = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
            self.stopped = self.stopped or (f"the kernel could not start: {type(exc).__name__}: {exc}"[:200]
                                            + (f"; it said: {said[-1][:300]}" if said else ""))
        finally:
            watchdog.cancel()
            self._shutdown(client)

    def _cells(self, client, grading, roles):
        for index, (cell, role) in enumerate(zip(grading, roles)):
            record = {"role": role, "ran": False, "died": False, "errors": [], "messages": []}
            self.cells.append(record)
            try:
                client.execute_cell(cell, index)
                record["ran"] = True
            except Exception as exc:  # noqa: BLE001 -- the kernel died or the time ran out: grade what ran
                record["died"] = True
                where = f"the cell that begins `{begins(cell)}`"
                if self.timed_out:
                    self.stopped = f"TIMEOUT: the notebook ran past its limit of {self.plan['timeout']} s, in {where}"
                elif isinstance(exc, DeadKernelError):
                    self.stopped = f"the kernel died in {where}"
                else:
                    self.stopped = f"the run stopped in {where}: {type(exc).__name__}: {str(exc)[:200]}"
            record["errors"] = [[o.get("ename", ""), str(o.get("evalue", ""))[:500]]
                                for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            record["messages"] = self.reader.read()
            if self.stopped:
                return
        self.completed = True

    def _shutdown(self, client):
        try:
            if client.kc is not None:
                client.kc.stop_channels()
            if self.km.has_kernel:
                run_sync(self.km.shutdown_kernel)(now=True)
        except Exception:  # noqa: BLE001 -- it is killed below in any case
            pass
        self.left = sorted(processes.end(lambda: processes.descendants(os.getpid())) - {self.kernel_pid})
        if self.cells:
            self.cells[-1]["messages"] += self.reader.read()


def run_job(job, course):
    job = Path(job)
    plan = json.loads((job / "plan.json").read_text())
    nb = nbformat.read(job / "notebook.ipynb", 4)
    t0 = time.perf_counter()
    copy = Path(tempfile.mkdtemp(prefix="course-"))
    private = Path(tempfile.mkdtemp(prefix="grader-"))
    try:
        copy_course(course, copy)
        run = Run(nb, plan, copy, private, Path(course).resolve())
        run.execute()
    finally:
        for folder in (copy, private):
            shutil.rmtree(folder, ignore_errors=True)
    outcome = judge(plan, run.cells, run.reader.problems, run.stopped, run.completed)
    final = [m for cell in run.cells for m in cell["messages"] if m["kind"] == "final"]
    outcome.update(seconds=round(time.perf_counter() - t0, 1), left_running=len(run.left),
                   emulator=run.hello.get("emulator", ""), timed_out=run.timed_out,
                   peak_rss_mb=final[-1].get("peak_rss_mb") if final else None)
    (job / "outcome.json").write_text(json.dumps(outcome))
    return outcome


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("job")
    ap.add_argument("--course", required=True)
    args = ap.parse_args(argv)
    processes.become_subreaper()
    run_job(args.job, args.course)


if __name__ == "__main__":
    main()
