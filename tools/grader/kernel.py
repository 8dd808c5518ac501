"""The kernel a submission runs in: the course copy's library, limits, and a sealed channel.

    python -I kernel.py CONFIG.json -f CONNECTION_FILE     # what the runner's kernel spec runs

``-I`` keeps ``PYTHONPATH`` and the user's site folder out. Before anything of the course is
imported, ``sys.path`` is rebuilt with the course copy first and without the instructor's
folder (which a ``.pth`` file names), import hooks that would find the course's packages
elsewhere (an editable install's finder) are dropped, and any of them already imported are
forgotten; the kernel then checks that ``emulator`` comes from the copy. Memory (address
space) and CPU time are limited for the kernel and everything it starts.

The checks report through :func:`emulator.grading.progress.report_to` to a :class:`Seal`:
at the start of a check, and at its end with its outcome, after comparing the functions
the checks run with what they were before the first cell (``integrity.py``); anything
changed is sent as tampering. The grader's first cell calls ``arm()`` (record), its last
``finish()`` (compare once more and close): they are this module's, under ``_grader``.
"""

import importlib
import importlib.util
import json
import os
import resource
import sys
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
WATCHED = ("emulator", "numpy", "builtins", "json", "hmac", "hashlib", "_hashlib", "os", "posix")


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _inside(path, folder):
    try:
        return Path(path).resolve().is_relative_to(folder)
    except (OSError, TypeError, ValueError):
        return False


def isolate(copy, own, hidden, roots):
    """Make the ``own`` packages importable from ``copy`` only, and the ``hidden`` ones
    (the instructor's tools, answer key, ...) not from any of ``roots``."""
    copy = Path(copy).resolve()
    roots = [Path(r).resolve() for r in roots]

    def foreign(entry):
        where = Path(entry or os.getcwd()).resolve()
        return where != copy and (where in roots or any((where / p).exists() or (where / f"{p}.py").exists()
                                                        for p in own))

    def serves_elsewhere(finder, name):
        try:
            spec = finder.find_spec(name, None)
        except Exception:  # noqa: BLE001 -- a finder that cannot answer does not serve us
            return False
        if spec is None:
            return False
        places = [p for p in list(spec.submodule_search_locations or []) + [spec.origin] if p]
        if name in own:
            return not any(_inside(p, copy) for p in places)
        return any(_inside(p, root) for p in places for root in roots)

    sys.path[:] = [str(copy)] + [e for e in sys.path if not foreign(e)]
    for finder in list(sys.meta_path):
        if not getattr(finder, "__module__", "").startswith("_frozen_importlib") and \
                any(serves_elsewhere(finder, name) for name in own + hidden):
            sys.meta_path.remove(finder)
    for name in list(sys.modules):
        if name.split(".")[0] in own + hidden:
            del sys.modules[name]
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    os.environ["PYTHONPATH"] = str(copy)  # for what the notebook starts


def limit(memory_mb, cpu_s):
    """Address space and CPU seconds, for this process and all it starts; the limits set."""
    done = {}
    for name, value in (("RLIMIT_AS", memory_mb << 20), ("RLIMIT_CPU", cpu_s)):
        if value and hasattr(resource, name):
            try:
                resource.setrlimit(getattr(resource, name), (value, value))
                done[name] = value
            except (ValueError, OSError):  # a system that does not allow it (macOS for RLIMIT_AS)
                pass
    return done


class Seal:
    """What the checks report to, and what compares the graded functions with their start."""

    def __init__(self, send, integrity, progress):
        self._send, self._integrity, self._baseline, self._depth = send, integrity, None, 0
        self._checked = next(c for c in progress.check.__code__.co_consts
                             if isinstance(c, types.CodeType) and c.co_name == "checked")
        self._getframe = sys._getframe

    def arm(self):
        if self._baseline is not None:
            self._send("tamper", problems=["the grader's first call (arm) was made again, by the notebook"])
            return
        self._baseline = self._integrity.Baseline(WATCHED)
        shell = sys.modules["IPython"].get_ipython()
        if shell is not None:  # no check runs across cells: a new cell starts from depth 0
            shell.events.register("pre_run_cell", self._new_cell)
        self._send("armed", watched=len(self._baseline.entries))

    def _new_cell(self, *_):
        self._depth = 0

    def witness(self, event, label, status="", detail=""):
        try:
            caller = self._getframe(1).f_code
            if caller is not self._checked:
                self._send("tamper", problems=[f"the checks' report was called by {caller.co_name} in "
                                               f"{caller.co_filename}, not by a check"])
                return
            if event == "start":
                self._depth += 1
                if self._depth == 1:
                    self._send("start", label=str(label))
                return
            self._depth -= 1
            if self._depth == 0:
                self._compare()
                self._send("end", label=str(label), status=str(status), detail=str(detail)[:2000])
        except Exception as exc:  # noqa: BLE001 -- never break a check; say it
            self._send("tamper", problems=[f"the grader's report failed: {type(exc).__name__}: {exc}"[:300]])

    def _compare(self):
        problems = ["a check ran before the grader's first call"] if self._baseline is None else \
            self._baseline.changes()
        if problems:
            self._send("tamper", problems=problems[:50])

    def finish(self):
        self._compare()
        self._send("final", peak_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024)


def main():
    config = json.loads(Path(sys.argv[1]).read_text())
    del sys.argv[1]
    isolate(config["copy"], config["own"], config["hidden"], config["roots"])
    limits = limit(config["memory_mb"], config["cpu_s"])
    channel = load("_grader_channel", HERE / "channel.py")
    integrity = load("_grader_integrity", HERE / "integrity.py")
    key = Path(config["key"]).read_bytes()
    os.unlink(config["key"])
    writer = channel.Writer(key, os.open(config["channel"], os.O_WRONLY | os.O_APPEND), config["run"])
    del key
    import emulator  # noqa: F401 -- from the copy, or the run stops here
    from emulator.grading import progress

    where = Path(sys.modules["emulator"].__file__).resolve()
    writer.send("hello", emulator=str(where), inside=_inside(where, Path(config["copy"]).resolve()),
                pid=os.getpid(), limits=limits)
    seal = Seal(writer.send, integrity, progress)
    progress.report_to(seal.witness)
    facade = types.ModuleType("_grader", "The grader's two calls: arm() first, finish() last.")
    facade.arm, facade.finish = seal.arm, seal.finish
    sys.modules["_grader"] = facade
    from ipykernel import kernelapp

    kernelapp.launch_new_instance()


if __name__ == "__main__":
    main()
