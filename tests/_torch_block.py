"""A kernel without torch: ``sys.modules['torch'] = None`` before its first cell, so every
``import torch`` raises ImportError. The lessons that compare with torch where it is (their
answer key imports it) run a second time this way (tests/test_missing_dependencies.py); the
others are run once, their answer key's strict run made in such a kernel
(tests/test_notebooks.py), which then also proves they need no torch."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BLOCK = "import sys; sys.modules['torch'] = None"  # every `import torch` then raises ImportError
MARK = "import sys, pathlib; pathlib.Path({path!r}).write_text(repr(sys.modules['torch']))"


def imports_torch(stem):
    """Whether lesson ``stem``'s source has an ``import torch`` line (not a comment)."""
    src = (ROOT / "solutions" / f"{stem}.py").read_text()
    return re.search(r"^\s*(import torch|from torch)\b", src, re.M) is not None


def blocked_ipython_dir(folder):
    """An IPYTHONDIR whose kernels start without torch, each writing what ``torch`` is in
    its ``sys.modules`` to ``folder/torch_in_kernel`` (None when blocked). Returns (the
    IPYTHONDIR, that file)."""
    profile = Path(folder) / "ipython" / "profile_default"
    profile.mkdir(parents=True)
    mark = Path(folder) / "torch_in_kernel"
    lines = [BLOCK, MARK.format(path=str(mark))]
    (profile / "ipython_kernel_config.py").write_text(f"c.IPKernelApp.exec_lines = {lines!r}\n")
    return profile.parent, mark
