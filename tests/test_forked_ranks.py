"""The tests' forked launcher (:mod:`tests._launch`) gives each rank what torchrun gives it
and behaves as torchrun does when a rank fails: the rest are stopped, the status is the
failure's, the rank's traceback and output reach us."""

import os
import subprocess
import textwrap
import time

import pytest

from tests import _launch

pytestmark = pytest.mark.slow
NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
         "MASTER_ADDR", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "OMP_NUM_THREADS")


def module(tmp_path, name, body):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(body))
    path = os.pathsep.join([str(tmp_path), str(_launch.ROOT), os.environ.get("PYTHONPATH", "")])
    return _launch.lab_env(PYTHONPATH=path)


def test_each_rank_gets_torchruns_environment(tmp_path):
    env = module(tmp_path, "show_env", f"""
        import os, sys
        if __name__ == "__main__":  # a file per rank: lines that ranks print at once may interleave
            line = "|".join(f"{{k}}={{os.environ.get(k)}}" for k in {NAMES!r})
            with open(os.path.join({str(tmp_path)!r}, sys.argv[-1] + os.environ["RANK"]), "w") as f:
                f.write(f"{{line}} {{os.environ['MASTER_PORT']}} {{sys.argv[1:]}}")
        """)
    lines = {}
    for how in ("torchrun", "forked"):
        out = getattr(_launch, how)(3, "show_env", "--x", how, env=env, timeout=120)
        assert out.returncode == 0, out.stderr[-2000:]
        rows = [(tmp_path / f"{how}{r}").read_text() for r in range(3)]
        assert len({row.split()[1] for row in rows}) == 1, rows  # one port for all ranks
        lines[how] = [(row.split()[0], row.split(maxsplit=2)[2].replace(how, "")) for row in rows]
    assert lines["forked"] == lines["torchrun"]
    assert [row[0].split("|")[0] for row in lines["forked"]] == ["RANK=0", "RANK=1", "RANK=2"]
    assert lines["forked"][2][1] == "['--backend', 'gloo', '--x', '']"


def test_a_failed_rank_stops_the_others_with_its_status(tmp_path):
    env = module(tmp_path, "one_fails", """
        import os, sys, time
        if __name__ == "__main__":
            print(f"rank {os.environ['RANK']} started")  # not flushed: the failing rank's must reach us
            if os.environ["RANK"] == "1":
                sys.exit(3)
            time.sleep(600)
        """)
    start = time.monotonic()
    out = _launch.forked(3, "one_fails", env=env, timeout=120)
    assert time.monotonic() - start < 60
    assert out.returncode == 3
    assert "rank 1 " in out.stderr and "exited with 3: stopping the other ranks" in out.stderr
    assert "rank 1 started" in out.stdout  # (the ranks stopped by a signal may lose theirs, as under torchrun)


def test_a_ranks_exception_is_printed_and_fails_the_run(tmp_path):
    env = module(tmp_path, "raises", """
        import os
        if __name__ == "__main__":
            if os.environ["RANK"] == "0":
                raise ValueError("rank 0 could not go on")
        """)
    out = _launch.forked(2, "raises", env=env, timeout=120)
    assert out.returncode == 1
    assert "Traceback" in out.stderr and "ValueError: rank 0 could not go on" in out.stderr
    again = _launch.forked(2, "raises", env=dict(env, RANK="1"), timeout=120)
    assert again.returncode == 1  # each rank's RANK is the launcher's, not the caller's


def launcher_parent(tmp_path, **extra):
    """The pid of the process that started the launcher of a run in :func:`module`'s
    environment, with ``extra`` variables."""
    path_env = module(tmp_path, "parent_of", """
        import os
        if __name__ == "__main__":  # the launcher's parent, from /proc (field 4 of its stat)
            with open(os.path.join(os.path.dirname(__file__), "parent"), "w") as f:
                f.write(open(f"/proc/{os.getppid()}/stat").read().rsplit(")", 1)[1].split()[1])
        """)
    out = _launch.forked(1, "parent_of", env=dict(path_env, **extra), timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return int((tmp_path / "parent").read_text())


def test_a_run_in_the_start_environment_is_forked_from_the_zygote_and_any_other_is_not(tmp_path):
    """Forked from the process that imported torch once, but only where its environment is
    the run's (PYTHONPATH aside): anything torch reads at import must be the run's own."""
    assert launcher_parent(tmp_path) == _launch.Zygote.get().proc.pid
    assert launcher_parent(tmp_path, TORCH_SHOW_CPP_STACKTRACES="1") == os.getpid()


def test_a_run_past_its_timeout_is_killed_and_the_next_run_is_served(tmp_path):
    env = module(tmp_path, "sleeps", """
        import time
        if __name__ == "__main__":
            print("started", flush=True)
            time.sleep(600)
        """)
    start = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        _launch.forked(2, "sleeps", env=env, timeout=3)
    assert time.monotonic() - start < 30 and "started" in caught.value.stdout
    assert launcher_parent(tmp_path) == _launch.Zygote.get().proc.pid
