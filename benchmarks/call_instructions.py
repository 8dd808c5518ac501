"""The engine's cost per collective call, in instructions (valgrind), which do not vary
from run to run as wall time does on a shared machine.

    python -m benchmarks.call_instructions                    # this checkout
    python -m benchmarks.call_instructions --against ../old   # and another checkout, as a ratio

An all-reduce of 8 float32 elements on 8 ranks, called K times by every rank: the
instructions of a run with K = 2000, less those of a run with K = 0 (the same imports and
World), over 2000, with ``PYTHONHASHSEED=0`` (the same string hashes every run). Needs
``valgrind`` on the PATH (callgrind counts the instructions).
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CALLS = 2000
PROGRAM = """
import sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from emulator import World

def fn(comm, k):
    x = np.ones(8, np.float32)
    for _ in range(k):
        comm.all_reduce(x)

World(8).run(fn, int(sys.argv[2]))
"""


def instructions(tree, calls):
    """Instructions callgrind counts for the program run from checkout ``tree``."""
    with tempfile.TemporaryDirectory() as tmp:
        prog = Path(tmp) / "calls.py"
        prog.write_text(PROGRAM)
        out = subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={tmp}/out", sys.executable,
                              str(prog), str(tree), str(calls)], capture_output=True, text=True,
                             env={**os.environ, "PYTHONHASHSEED": "0"})
    found = re.search(r"Collected : (\d+)", out.stderr)
    if out.returncode or not found:
        raise SystemExit(f"valgrind failed on {tree}:\n{out.stderr[-2000:]}")
    return int(found.group(1))


def per_call(tree):
    return (instructions(tree, CALLS) - instructions(tree, 0)) / CALLS


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--against", type=Path, help="another checkout of the project, measured the same way")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed: install it (apt install valgrind) to count instructions")
    here = per_call(Path(__file__).resolve().parent.parent)
    print(f"this checkout: {here / 1e3:,.0f} thousand instructions per all-reduce call (8 ranks, 8 elements)")
    if args.against:
        if not (args.against / "emulator").is_dir():
            raise SystemExit(f"--against {args.against}: no emulator/ package there; give a checkout's root folder")
        other = per_call(args.against.resolve())
        print(f"{args.against}: {other / 1e3:,.0f} thousand; ratio {here / other:.2f}")


if __name__ == "__main__":
    main()
