"""README.md's module map against the package's layout: every package under ``emulator/``
(and every package inside ``emulator/parallel/``) has a row of the map's table, and each
of parallel's packages names every module it holds in its row (the order of the layers is
checked in ``tests/test_layers.py``). The check is shown to catch a missing package and a
missing module."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = "emulator"

def module_map_rows(text):
    """{first cell's names: the row's text} of the README module map's table."""
    section = text.split("### Module map", 1)[1].split("\n## ", 1)[0]
    return {tuple(re.findall(r"`([\w/]+)`", line.split("|")[1])): line
            for line in section.splitlines() if line.startswith("| `")}


def unmapped(rows, root=ROOT / PACKAGE):
    """What the module map leaves out: a package with no row of its own (top-level ones, and
    the packages inside ``parallel/``), or a module of such a package its row does not name."""
    missing = []
    packages = [d for d in sorted(root.iterdir()) if (d / "__init__.py").exists()]
    packages += [d for d in sorted((root / "parallel").iterdir()) if (d / "__init__.py").exists()]
    for d in packages:
        name = d.relative_to(root).as_posix() + "/"
        row = next((line for names, line in rows.items() if name in names), None)
        if row is None:
            missing.append(name)
            continue
        if d.parent.name == "parallel":
            missing += [f"{name}{f.stem}" for f in sorted(d.glob("*.py"))
                        if f.stem != "__init__" and f"`{f.stem}`" not in row]
    return missing


def test_readme_module_map_has_a_row_for_every_package_naming_its_modules():
    assert unmapped(module_map_rows((ROOT / "README.md").read_text(encoding="utf-8"))) == []


def test_the_module_map_check_catches_a_missing_package_and_module(tmp_path):
    for d in ("parallel", "parallel/pipeline", "nn"):
        (tmp_path / d).mkdir(parents=True)
        (tmp_path / d / "__init__.py").write_text("")
    (tmp_path / "parallel" / "pipeline" / "stage.py").write_text("")
    (tmp_path / "parallel" / "pipeline" / "actions.py").write_text("")
    rows = {("parallel/",): "| `parallel/` | x |", ("parallel/pipeline/",): "| `parallel/pipeline/` | `stage` |"}
    assert unmapped(rows, tmp_path) == ["nn/", "parallel/pipeline/actions"]
