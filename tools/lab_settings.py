"""Give every JupyterLab this virtual environment runs the course's settings
(``tools/jupyterlab_settings.json``: no news pop-up, Markdown opens as a page), whatever
HOME is: they are linked in as the environment's
``etc/jupyter/labconfig/default_setting_overrides.json``, the defaults JupyterLab layers
under a user's own settings.

    .venv/bin/python tools/lab_settings.py      # make lab and make test run it

``import emulator`` from any folder is the editable install's work (``pip install -e .``);
an older environment's hand-written ``parallelism_from_scratch.pth`` is removed, so only
that install says where the library is.
"""

import pathlib
import site
import sys

root = pathlib.Path(__file__).resolve().parent.parent
settings = pathlib.Path(sys.prefix) / "etc" / "jupyter" / "labconfig" / "default_setting_overrides.json"
settings.parent.mkdir(parents=True, exist_ok=True)
settings.unlink(missing_ok=True)
settings.symlink_to(root / "tools" / "jupyterlab_settings.json")
print(f"{settings.relative_to(sys.prefix)} -> tools/jupyterlab_settings.json")

for folder in site.getsitepackages():
    legacy = pathlib.Path(folder) / "parallelism_from_scratch.pth"
    if legacy.exists():
        legacy.unlink()
        print(f"removed {legacy} (the editable install replaces it)")
