"""Tie this virtual environment to the repository:

* ``import emulator`` works from any folder (notebook kernels start in lessons/ or
  solutions/): a .pth file names the repository root;
* every JupyterLab it runs takes the course's settings (``tools/jupyterlab_settings.json``:
  no news pop-up, Markdown opens as a page), whatever HOME is: they are linked in as the
  environment's ``labconfig/default_setting_overrides.json``, the defaults JupyterLab
  layers under a user's own settings.
"""

import pathlib
import site
import sys

root = pathlib.Path(__file__).resolve().parent.parent
pth = pathlib.Path(site.getsitepackages()[0]) / "parallelism_from_scratch.pth"
pth.write_text(str(root) + "\n")
print(f"{sys.executable}: {pth.name} -> {root}")

settings = pathlib.Path(sys.prefix) / "etc" / "jupyter" / "labconfig" / "default_setting_overrides.json"
settings.parent.mkdir(parents=True, exist_ok=True)
settings.unlink(missing_ok=True)
settings.symlink_to(root / "tools" / "jupyterlab_settings.json")
print(f"{settings.relative_to(sys.prefix)} -> tools/jupyterlab_settings.json")
