"""The tests' forked launcher (:mod:`tests._launch`) gives each rank what torchrun gives it
and behaves as torchrun does when a rank fails: the rest are stopped, the status is the
failure's, the rank's traceback and output reach us."""

import os
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
