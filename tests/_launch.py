"""How the tests start a GPU lab's ranks on the CPU (gloo, one thread each):

* :func:`torchrun`: ``torchrun --standalone --nproc-per-node N -m LAB``, as a course cluster
  runs it; the tests about the launcher (restarts, timeouts) and one run of each lab use it;
* :func:`forked`: the same ranks with torchrun's environment, forked from one process that
  imported torch and the lab once (``tests/_forked_ranks.py``): each rank's own import of
  torch costs about two seconds of CPU, and the suite starts over a hundred ranks.
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
FORKED = str(Path(__file__).resolve().parent / "_forked_ranks.py")


def lab_env(**extra):
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **extra)


def torchrun(n, module, *flags, max_restarts=None, env=None, timeout=600):
    restarts = [] if max_restarts is None else ["--max-restarts", str(max_restarts)]
    return subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", str(n), *restarts, "-m", module,
                           "--backend", "gloo", *flags], capture_output=True, text=True, env=env or lab_env(),
                          cwd=ROOT, timeout=timeout)


def forked(n, module, *flags, env=None, timeout=600):
    return subprocess.run([sys.executable, FORKED, str(n), module, "--backend", "gloo", *flags], capture_output=True,
                          text=True, env=env or lab_env(), cwd=ROOT, timeout=timeout)
