"""Every GPU lab runs on the CPU with gloo, with 2 and 4 processes, and catches faults."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = str(Path(sys.executable).parent / "torchrun")
pytestmark = pytest.mark.slow


def torchrun(n, lab, *flags):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return subprocess.run([TORCHRUN, "--standalone", "--nproc-per-node", str(n), str(ROOT / "gpu_labs" / lab),
                           "--backend", "gloo", *flags], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=600)


@pytest.mark.parametrize("n", [2, 4])
def test_collectives_lab(n):
    out = torchrun(n, "00_collectives.py", "--sizes", "1e3,1e5", "--iters", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"# {n} ranks, backend gloo" in out.stdout
    rows = [line.split() for line in out.stdout.splitlines() if line.strip().startswith(("all_", "reduce_"))]
    assert [r[0] for r in rows] == ["all_reduce"] * 2 + ["reduce_scatter"] * 2 + ["all_gather"] * 2
    assert all(float(r[2]) > 0 and float(r[5]) > 0 for r in rows)  # measured and predicted times
    assert "OK: ring all-reduce (send/recv" in out.stdout


def test_collectives_lab_fails_loudly_on_a_wrong_result():
    out = torchrun(2, "00_collectives.py", "--sizes", "1e3", "--iters", "1", "--self-test-fault")
    assert out.returncode != 0
    assert "FAILED on rank 1: ring all-reduce from send/recv differs from dist.all_reduce" in out.stderr


@pytest.mark.parametrize("n", [2, 4])
def test_data_parallel_lab(n):
    out = torchrun(n, "01_data_parallel.py", "--steps", "2")
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [line.split() for line in out.stdout.splitlines()
             if line.strip().startswith(("DDP", "ZeRO-", "torch", "FSDP2"))]
    per_rank = [l for l in lines if l[0] in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")]
    assert len(per_rank) == 4 * n and {l[1] for l in per_rank} == {str(r) for r in range(n)}
    assert {l[0] for l in lines} == {"DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3", "torch", "FSDP2"}
    rows = {l[0]: l for l in per_rank if l[1] == "0"}
    # held bytes fall stage by stage; ZeRO-3 sends 1.5x what DDP sends
    grads = [int(rows[s][4].replace(",", "")) for s in ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")]
    assert grads[0] == grads[1] > grads[2] == grads[3]
    sent = {s: float(rows[s][7].replace(",", "")) for s in ("DDP", "ZeRO-3")}
    assert sent["ZeRO-3"] == pytest.approx(1.5 * sent["DDP"])
    assert "OK: every variant matches the single-process run" in out.stdout


def test_data_parallel_lab_fails_loudly_on_a_wrong_gradient():
    out = torchrun(2, "01_data_parallel.py", "--steps", "1", "--self-test-fault")
    assert out.returncode != 0
    assert "hand-written ZeRO-1: parameters differ from the single-process run" in out.stderr
