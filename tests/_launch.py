"""How the tests start a GPU lab's ranks on the CPU (gloo, one thread each):

* :func:`torchrun`: ``torchrun --standalone --nproc-per-node N -m LAB``, as a course cluster
  runs it; the tests about the launcher (restarts, timeouts) and one run of each lab use it;
* :func:`forked`: the same ranks with torchrun's environment, forked from one process that
  imported torch and the lab once (``tests/_forked_ranks.py``): each rank's own import of
  torch costs about two seconds of CPU, and the suite starts over a hundred ranks. That
  launcher is itself forked, from one process per test worker that imported torch and
  every lab (``tests/_rank_zygote.py``), when the run's environment is the one that process
  started with (``PYTHONPATH`` and pytest's ``PYTEST_CURRENT_TEST`` aside); any other
  environment gets a launcher of its own.
"""

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
FORKED = str(Path(__file__).resolve().parent / "_forked_ranks.py")
ZYGOTE = str(Path(__file__).resolve().parent / "_rank_zygote.py")


def lab_env(**extra):
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **extra)


def torchrun(n, module, *flags, max_restarts=None, env=None, timeout=600):
    restarts = [] if max_restarts is None else ["--max-restarts", str(max_restarts)]
    return subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", str(n), *restarts, "-m", module,
                           "--backend", "gloo", *flags], capture_output=True, text=True, env=env or lab_env(),
                          cwd=ROOT, timeout=timeout)


def forked(n, module, *flags, env=None, timeout=600):
    argv = [str(n), module, "--backend", "gloo", *flags]
    env = env or lab_env()
    if Zygote.serves(env):
        return Zygote.get().run(argv, env, timeout)
    return subprocess.run([sys.executable, FORKED, *argv], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=timeout)


def _compared(env):
    """What of a run's environment must be the zygote's: all but the path it adds and
    pytest's name of the running test."""
    return {k: v for k, v in env.items() if k not in ("PYTHONPATH", "PYTEST_CURRENT_TEST")}


class Zygote:
    """This worker's ``tests/_rank_zygote.py``, started at its first run."""

    _one = None

    def __init__(self):
        self.env = lab_env()
        self.proc = subprocess.Popen([sys.executable, ZYGOTE], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=self.env, cwd=ROOT, bufsize=0)
        self.pending = b""
        if self._line(600) != "ready":
            raise RuntimeError(f"{ZYGOTE} did not start (status {self.proc.wait()})")
        atexit.register(self.close)

    def _line(self, timeout):
        """The zygote's next line, or None if none came within ``timeout`` seconds."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.pending:
            if not select.select([fd], [], [], timeout)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(f"{ZYGOTE} ended (status {self.proc.wait()})")
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line.decode()

    @classmethod
    def get(cls):
        if cls._one is None or cls._one.proc.poll() is not None:
            cls._one = cls()
        return cls._one

    @classmethod
    def serves(cls, env):
        return _compared(env) == _compared(cls._one.env if cls._one else lab_env())

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)

    def run(self, argv, env, timeout):
        """``subprocess.run([python, FORKED, *argv], ...)``'s result, from a forked launcher."""
        with tempfile.TemporaryDirectory() as tmp:
            files = {name: os.path.join(tmp, name) for name in ("stdout", "stderr")}
            self.proc.stdin.write((json.dumps({"argv": argv, "cwd": str(ROOT), "env": env, **files}) + "\n").encode())
            pid = int(self._line(60))
            code = self._line(timeout)
            if code is None:  # as subprocess.run's timeout: killed, then waited for
                os.killpg(pid, signal.SIGKILL)
                self._line(60)
            out, err = (Path(files[name]).read_text(errors="replace") for name in ("stdout", "stderr"))
        cmd = [sys.executable, FORKED, *argv]
        if code is None:
            raise subprocess.TimeoutExpired(cmd, timeout, output=out, stderr=err)
        return subprocess.CompletedProcess(cmd, int(code), out, err)
