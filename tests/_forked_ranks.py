"""Runs a GPU lab's ranks as ``torchrun --standalone --nproc-per-node N -m LAB`` does on one
machine (each rank a process with torchrun's environment, its output on ours, the rest
stopped when one fails), but forked from one process that imported torch and the lab once.

    python tests/_forked_ranks.py N gpu_labs.01_data_parallel --backend gloo ...

Each rank's import of torch costs about two seconds of CPU; a suite that starts a hundred
ranks spends minutes on it. The tests that are about the launcher (its restarts, its
timeouts, its error report) and one run of each lab keep torchrun itself.
"""

import importlib
import os
import runpy
import signal
import sys
import time
import traceback


def run_rank(module, args, env):
    os.environ.update(env)
    sys.argv = [module, *args]
    exit_as_python_would(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))


def exit_as_python_would(run):
    """Call ``run``, then end this forked process as Python would end after it: the status
    ``sys.exit`` gave (a message printed, status 1), or a traceback on stderr and status 1."""
    code = 0
    try:
        run()
    except SystemExit as e:
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            code = 1
        else:
            code = e.code or 0
    except BaseException:  # as a rank's Python would: its traceback on stderr, status 1
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main():
    n, module, args = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
    import torch.distributed  # noqa: F401 -- imported once; every rank inherits it
    importlib.import_module(module)  # the lab's own imports too (its main runs only in the ranks)
    from gpu_labs.common import free_port

    port = str(free_port())
    sys.stdout.flush()
    sys.stderr.flush()
    children = {}
    for rank in range(n):
        env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n), "LOCAL_WORLD_SIZE": str(n),
               "GROUP_RANK": "0", "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(n), "MASTER_ADDR": "localhost",
               "MASTER_PORT": port, "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
        pid = os.fork()
        if pid == 0:
            run_rank(module, args, env)
        children[pid] = rank
    status = 0
    while children:
        pid, raw = os.wait()
        rank = children.pop(pid)
        code = os.waitstatus_to_exitcode(raw)
        if code != 0 and status == 0:
            status = code if code > 0 else 1
            print(f"rank {rank} (pid {pid}) exited with {code}: stopping the other ranks", file=sys.stderr)
            stop(children)
    sys.exit(status)


def reap(children, seconds):
    """Collect the ranks that end within ``seconds``, removing them from ``children``."""
    end = time.monotonic() + seconds
    while children and time.monotonic() < end:
        pid, _ = os.waitpid(-1, os.WNOHANG)
        if pid:
            children.pop(pid, None)
        else:
            time.sleep(0.02)


def stop(children, settle=2.0, grace=5.0):
    """Stop the ranks still running after one failed: ``settle`` seconds to end on their
    own (the rank that reports a fault may exit after the faulty rank, and its report must
    reach stderr; torchrun too only notices a failed worker at its next poll,
    ``--monitor-interval``), then SIGTERM, and SIGKILL to any left after ``grace`` seconds."""
    reap(children, settle)
    for pid in children:
        os.kill(pid, signal.SIGTERM)
    reap(children, grace)
    for pid in children:
        os.kill(pid, signal.SIGKILL)

if __name__ == "__main__":
    main()
