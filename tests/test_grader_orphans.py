"""The grader ends what a submission's runner left behind (its orphans) without ending a
runner that another grading thread starts meanwhile: the runners alive are read afresh
each time the orphans are listed."""

import subprocess
import sys

from tools import grade


def test_a_runner_started_while_orphans_are_ended_is_not_one_of_them(monkeypatch):
    orphan = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = []
    real_end = grade.processes.end

    def end_with_a_runner_starting(find, rounds=200):
        first = find()
        assert orphan.pid in first  # a child this process did not start as a runner
        runner = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        with grade.RUNNERS_LOCK:  # another thread starts a runner between two listings
            grade.RUNNERS.add(runner.pid)
        started.append(runner)
        return real_end(find, rounds)

    monkeypatch.setattr(grade.processes, "end", end_with_a_runner_starting)
    try:
        ended = grade.orphans()
        runner = started[0]
        assert orphan.pid in ended and not grade.processes.alive(orphan.pid)
        assert runner.pid not in ended and runner.poll() is None, "a runner started meanwhile was ended"
    finally:
        for p in [orphan] + started:
            p.kill()
            p.wait()
        with grade.RUNNERS_LOCK:
            grade.RUNNERS.difference_update(p.pid for p in started)
