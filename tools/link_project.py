"""Make ``import emulator`` work in this virtual environment from any folder (notebook
kernels start in lessons/ or solutions/): write a .pth file naming the repository root."""

import pathlib
import site
import sys

root = pathlib.Path(__file__).resolve().parent.parent
pth = pathlib.Path(site.getsitepackages()[0]) / "parallelism_from_scratch.pth"
pth.write_text(str(root) + "\n")
print(f"{sys.executable}: {pth.name} -> {root}")
