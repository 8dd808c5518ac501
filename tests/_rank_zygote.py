"""One process per test worker that imported torch and every GPU lab once, and forks a
launcher (``tests/_forked_ranks.py``'s ``main``) for each run the tests ask of it.

    python tests/_rank_zygote.py        # started by tests/_launch.py, spoken to on stdin/stdout

A request is one line of JSON: the launcher's arguments, the folder to run in, the
environment and the files for the run's stdout and stderr. The answer is two lines: the
launcher's pid when it starts, its exit status (as ``subprocess`` reports it) when it ends.
The launcher starts a new session, takes the request's environment and folder, and puts the
request's ``PYTHONPATH`` entries on ``sys.path`` where Python's start-up would. Anything else
in the environment that torch reads when it is imported is this process's:
``tests/_launch.py`` sends only requests whose environment is the one it started this
process with, ``PYTHONPATH`` and pytest's ``PYTEST_CURRENT_TEST`` aside. The process ends when its stdin closes.
"""

import importlib
import json
import os
import signal
import sys
from pathlib import Path

import _forked_ranks

START_PATH = os.environ.get("PYTHONPATH", "").split(os.pathsep)
LABS = sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "gpu_labs").glob("[0-9][0-9]_*.py"))


def launcher(request, answers):
    """In the forked child: become the launcher the request asks for, then exit."""
    os.setsid()
    os.close(answers)
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    os.chdir(request["cwd"])
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    sys.path[1:1] = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p not in START_PATH]
    importlib.invalidate_caches()
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), fd)
    sys.argv = [_forked_ranks.__file__, *request["argv"]]
    _forked_ranks.main()


def main():
    answers = os.dup(1)  # the answers' channel; what imports print goes nowhere
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    import torch.distributed  # noqa: F401 -- imported once; every launcher and rank inherits it

    for lab in LABS:
        importlib.import_module(f"gpu_labs.{lab}")
    out = os.fdopen(answers, "w", buffering=1)
    out.write("ready\n")
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # never returns: the child ends with the launcher's status
            _forked_ranks.exit_as_python_would(lambda: launcher(request, answers))
        out.write(f"{pid}\n")
        _, status = os.waitpid(pid, 0)
        out.write(f"{os.waitstatus_to_exitcode(status)}\n")


if __name__ == "__main__":
    main()
