"""What runs where an optional part of the stack is missing: the solution notebooks that
compare with torch where it is (lesson 05), with torch's import blocked, saying what they
skipped (the others run once, in tests/test_notebooks.py, in a kernel without torch), and
the planner, the formulas, the cost model and ParallelDims with greenlet's import blocked
(greenlet is imported only when a World runs, which then says it is missing)."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell

from tests._torch_block import BLOCK, blocked_ipython_dir, imports_torch

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = [p for p in sorted((ROOT / "solutions").glob("[0-9][0-9]_*.ipynb")) if imports_torch(p.stem)]
PROOF = "try:\n    import torch\nexcept ImportError as e:\n    print('torch blocked:', e)\nelse:\n    print('torch')"


def problems(nb):
    """Error outputs, and tracebacks written to stderr, cell by cell."""
    out = []
    for i, cell in enumerate(nb.cells):
        for o in cell.get("outputs", []):
            if o.output_type == "error":
                out.append(f"cell {i}: {o.ename}: {o.evalue}")
            elif o.output_type == "stream" and o.name == "stderr" and "Traceback" in o.text:
                out.append(f"cell {i}: stderr: {o.text[-300:]}")
    return out


def text(nb):
    return "".join(o.get("text", "") for c in nb.cells for o in c.get("outputs", []))


def test_only_the_lessons_that_compare_with_torch_run_twice():
    assert [p.stem for p in SOLUTIONS] == ["05_expert_parallel"]


@pytest.mark.slow
@pytest.mark.parametrize("path", SOLUTIONS, ids=[p.stem for p in SOLUTIONS])
def test_every_lesson_runs_without_torch(path):
    nb = nbformat.read(path, 4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
    nb.cells.append(new_code_cell(PROOF))
    NotebookClient(nb, timeout=300, kernel_name="python3", allow_errors=True,
                   extra_arguments=[f"--IPKernelApp.exec_lines={BLOCK}"],
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    assert problems(nb) == []
    # the kernel had no torch (its stream may arrive in pieces: read them all)
    proof = "".join(o.get("text", "") for o in nb.cells[-1].outputs)
    assert "torch blocked: import of torch halted" in proof, proof
    if path.stem == "05_expert_parallel":
        out = text(nb)
        assert "comparison with torch skipped: torch cannot be imported here" in out
        assert "top-1, Switch (y = p E): skipped, torch cannot be imported here" in out
        assert "max difference from torch" not in out


WITHOUT_GREENLET = """
import sys
sys.modules["greenlet"] = None  # `import greenlet` raises ImportError from here on
import emulator
from emulator import accounting, cost
from emulator.machine.topology import Topology
from emulator.parallel.dims import ParallelDims
from emulator.planner import cluster_preset, evaluate, model_preset, search
from emulator.planner.__main__ import main

model, cluster = model_preset("llama3-70b"), cluster_preset("h100", nodes=8)
dims = ParallelDims(dp=4, tp=8, pp=2, zero_stage=1, sequence_parallel=True, micro_batches=128, recompute="selective")
est = evaluate(model, cluster, dims, 4096, 2 * 2**20)
assert est.valid and est.step_time > 0, est.problems
assert search(model, cluster, 4096, 2 * 2**20, top=1)
assert accounting.zero_bytes_per_gpu(7e9, 8, 3) > 0 and accounting.pipeline_bubble(4, 8) > 0
assert cost.collective_time("all_reduce", 2**20, 8, Topology.h100()) > 0
assert main(["--gpus", "64", "--model", "llama3-70b", "--seq", "4096", "--batch-tokens", "2M", "--top", "1",
             "--rejected", "0"]) == 0
try:
    emulator.World(2).run(lambda comm: comm.rank)
except ImportError as exc:
    print("World:", exc)
"""


def test_the_planner_and_formulas_work_without_greenlet():
    run = subprocess.run([sys.executable, "-c", WITHOUT_GREENLET], capture_output=True, text=True, cwd=ROOT,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "World: World.run needs greenlet, which cannot be imported here" in run.stdout
    assert "pip install greenlet" in run.stdout


def test_importing_the_library_does_not_import_greenlet_torch_or_matplotlib():
    code = ("import sys, emulator, emulator.planner, emulator.accounting, emulator.cost, emulator.parallel.dims; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'greenlet', 'torch', 'matplotlib', 'ipywidgets'}))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0 and run.stdout.strip() == "[]", run.stdout + run.stderr


def test_a_kernel_under_the_blocked_ipython_dir_cannot_import_torch(tmp_path, monkeypatch):
    """The answer keys that never import torch are run in such a kernel
    (tests/test_notebooks.py): there, an `import torch` fails and the mark says so."""
    ipython_dir, mark = blocked_ipython_dir(tmp_path)
    monkeypatch.setenv("IPYTHONDIR", str(ipython_dir))
    nb = nbformat.v4.new_notebook(cells=[new_code_cell(PROOF)])
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    assert "torch blocked: import of torch halted" in "".join(o.get("text", "") for o in nb.cells[0].outputs)
    assert mark.read_text() == "None"
