"""The package as others install it: the wheel, built from this checkout and installed into
a fresh virtual environment without torch (its dependencies from the package indexes pip
is configured with, as `make lab` uses), runs `pfs-planner` and imports the planner there;
pyproject.toml's dependencies are the exact pins of requirements.txt, and the installs
meant to leave torch alone (`lab`, `labs`) do."""

import os
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import emulator

ROOT = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
PINS = {re.sub(r"[-_.]+", "-", line.split("==")[0]).lower(): line.split("==")[1].strip()
        for line in (ROOT / "requirements.txt").read_text().splitlines() if "==" in line}


def name_of(requirement):
    return re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", requirement).group()).lower()


def run(cmd, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, timeout=900, **kw)
    assert done.returncode == 0, f"{cmd}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_every_dependency_is_pinned_and_torch_is_only_where_asked_for():
    extras = PROJECT["optional-dependencies"]
    named = PROJECT["dependencies"] + [r for group in extras.values() for r in group]
    own = "parallelism-from-scratch"
    unpinned = sorted({name_of(r) for r in named} - set(PINS) - {own})
    assert not unpinned, f"not pinned in requirements.txt: {unpinned}"
    assert {name_of(r) for r in PROJECT["dependencies"]} == {"numpy", "greenlet", "ml-dtypes"}
    for group in ("lab", "labs"):
        assert "torch" not in {name_of(r) for r in extras[group]}, group
    assert extras["torch"] == ["torch>=2.4"] and PINS["torch"] == "2.13.0"
    assert f"{own}[lab,torch]" in extras["test"]
    assert PROJECT["scripts"]["pfs-planner"] == "emulator.planner.__main__:main"


@pytest.mark.slow
def test_the_wheel_installs_without_torch_and_runs_the_planner(tmp_path):
    dist = tmp_path / "dist"
    run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--wheel-dir", dist, ROOT])
    wheel, = dist.glob("parallelism_from_scratch-*.whl")
    assert wheel.name.startswith(f"parallelism_from_scratch-{emulator.__version__}-py3-none-any")
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist()}
        assert tops == {"emulator", "gpu_labs", f"parallelism_from_scratch-{emulator.__version__}.dist-info"}, tops
        assert "gpu_labs/06_mesh.py" in z.namelist() and "gpu_labs/torch_parallel/ddp.py" in z.namelist()
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in z.namelist())
    venv = tmp_path / "venv"
    run([sys.executable, "-m", "venv", venv])
    py, bin_ = venv / "bin" / "python", venv / "bin"
    run([py, "-m", "pip", "install", "--quiet", "-c", ROOT / "requirements.txt", wheel], cwd=tmp_path)
    run([py, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('torch') is not None)"],
        cwd=tmp_path)  # no torch came with it
    out = run([bin_ / "pfs-planner", "--gpus", "64", "--gpus-per-node", "8", "--model", "llama3-70b", "--seq",
               "4096", "--batch-tokens", "4M"], cwd=tmp_path)
    assert out.startswith("Llama 3 70B (70.6B parameters) on H100") and "\n 1 " in out, out[:2000]
    where = run([py, "-c", "import emulator.planner, emulator; print(emulator.__file__)"], cwd=tmp_path)
    assert where.strip().startswith(str(venv)), where  # the installed copy, not this checkout
    lab = run([py, "-c", "import importlib.util; print(importlib.util.find_spec('gpu_labs.06_mesh').origin)"],
              cwd=tmp_path)  # what `torchrun -m gpu_labs.06_mesh` runs from any folder (no torch to run it here)
    assert lab.strip().startswith(str(venv)), lab
    assert run([bin_ / "pfs-planner", "--version"]).strip() == f"pfs-planner {emulator.__version__}"


def test_make_lab_and_make_test_each_install_their_own_extras_once(tmp_path):
    """The Makefile's install steps, dry-run (`make -n`) in a copy with a stand-in .venv:
    `make lab` installs the lessons' extra (no torch), `make test` adds its own beside it,
    and neither runs again, nor the other's, once its stamp is newer than the files it reads."""
    for name in ("Makefile", "pyproject.toml", "requirements.txt"):
        (tmp_path / name).write_bytes((ROOT / name).read_bytes())
    (tmp_path / ".venv" / "bin").mkdir(parents=True)
    (tmp_path / ".venv" / "bin" / "python").touch()

    def dry(target):
        return run(["make", "-n", target], cwd=tmp_path)

    lab = dry("lab")
    assert '-c requirements.txt -e ".[lab]"' in lab and "tools/lab_settings.py" in lab and "jupyter lab" in lab
    assert "[test]" not in lab and "torch" not in lab
    (tmp_path / ".venv" / ".installed-lab").touch()
    test = dry("test")
    assert '-c requirements.txt -e ".[test]"' in test and '".[lab]"' not in test and "pytest" in test
    (tmp_path / ".venv" / ".installed-test").touch()
    assert "pip" not in dry("test") and "pip" not in dry("lab")
    assert "pip" not in dry(".venv/.installed") and "pip" not in dry("notebooks")
    os.utime(tmp_path / "requirements.txt")  # new pins: both install again
    assert '".[lab]"' in dry("test") and '".[test]"' in dry("test")


def test_what_make_test_installed_is_exactly_the_pins():
    """Every distribution the project's `test` extra pulls in, however deep, is pinned in
    requirements.txt and installed at that version (torch's local build tag aside)."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.version import Version

    try:
        metadata.distribution("parallelism-from-scratch")
    except metadata.PackageNotFoundError:
        pytest.skip("this environment has no install of the project (make test installs it)")
    seen, todo, wrong = {}, [("parallelism-from-scratch", {"test"})], []
    while todo:
        name, extras = todo.pop()
        key = name_of(name)
        if key in seen and extras <= seen[key]:
            continue
        seen[key] = seen.get(key, set()) | extras
        try:
            requires = metadata.requires(name) or []
        except metadata.PackageNotFoundError:
            wrong.append(f"{name}: required, not installed")
            continue
        for text in requires:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in extras | {""}):
                todo.append((req.name, set(req.extras)))
    for key in sorted(set(seen) - {"parallelism-from-scratch"}):
        if key not in PINS:
            wrong.append(f"{key}: installed, not pinned in requirements.txt")
        elif Version(metadata.version(key)).public != PINS[key]:
            wrong.append(f"{key}: {metadata.version(key)} installed, {PINS[key]} pinned")
    assert not wrong, wrong
    assert {"torch", "jupyterlab", "pytest", "numpy"} <= set(seen)
