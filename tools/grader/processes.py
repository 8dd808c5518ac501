"""Ending every process a submission started, on Linux (``/proc``).

Three nets, because a process can leave its parent's process group (``setsid``), its
parent (a double fork), or its environment (``env={}``):

* the grader's processes are *child subreapers* (``prctl(PR_SET_CHILD_SUBREAPER)``), so an
  orphan below them becomes their child instead of init's, and stays a descendant;
* every process of one submission inherits a marker in its environment
  (``COURSE_GRADER_JOB=<random>``), read from ``/proc/PID/environ``;
* what is found is killed (SIGKILL), again and again until nothing is found, so a process
  that forks while it is being ended is caught on the next round.

A process started through another service (``at``, ``systemd-run``, ``ssh localhost``) is
none of these: only a container per submission ends those (README, "Grading a class").
Elsewhere than Linux these find nothing, and only the kernel's own process group is ended.
"""

import ctypes
import os
import signal
import time
from pathlib import Path

MARKER = "COURSE_GRADER_JOB"
PR_SET_CHILD_SUBREAPER = 36
PROC = Path("/proc")


def become_subreaper():
    """Make orphans below this process its children; False where the system cannot."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _stat(pid):
    """``(state, ppid)`` of ``pid``, or None once it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    return fields[0], int(fields[1])


def _pids():
    return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()] if PROC.is_dir() else []


def alive(pid):
    stat = _stat(pid)
    return stat is not None and stat[0] not in ("Z", "X")


def descendants(root):
    """Every living process below ``root``."""
    children = {}
    for pid in _pids():
        stat = _stat(pid)
        if stat and stat[0] not in ("Z", "X"):
            children.setdefault(stat[1], []).append(pid)
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            found.append(child)
            todo.append(child)
    return found


def marked(token):
    """Every living process whose environment holds ``COURSE_GRADER_JOB=token``."""
    needle = f"{MARKER}={token}".encode()
    found = []
    for pid in _pids():
        try:
            env = (PROC / str(pid) / "environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0") and pid != os.getpid() and alive(pid):
            found.append(pid)
    return found


def orphans_of(parent, keep=()):
    """Children of ``parent`` it did not start itself (``keep``), with all below them."""
    found = []
    for pid in _pids():
        stat = _stat(pid)
        if stat and stat[1] == parent and pid not in keep and stat[0] not in ("Z", "X"):
            found += [pid] + descendants(pid)
    return found


def end(find, rounds=200):
    """Kill what ``find()`` returns until it returns nothing; the set of pids ended."""
    ended = set()
    for _ in range(rounds):
        pids = [p for p in find() if p != os.getpid()]
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
            ended.add(pid)
        time.sleep(0.02)
        reap(pids)
    reap(ended)
    return ended


def reap(pids):
    """Collect the exit status of those of ``pids`` that are this process's children."""
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)
        except OSError:
            pass
