# Two commands matter: `make lab` and `make test`. Both create .venv on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LAB_ARGS ?=
LAB_SETTINGS := $(VENV)/etc/jupyter/labconfig/default_setting_overrides.json
LESSON ?=
# The emulator multiplies many small matrices: one BLAS thread each is faster than a pool
# that spins (and the notebooks' outputs do not depend on it: tests/test_notebooks.py).
export OPENBLAS_NUM_THREADS ?= 1
export OMP_NUM_THREADS ?= 1

.PHONY: lab test grade notebooks check-notebooks bench browser-deps clean

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) tools/link_project.py
	touch $(STAMP)

# The course's JupyterLab settings (tools/jupyterlab_settings.json), for every HOME.
$(LAB_SETTINGS): | $(STAMP)
	$(PY) tools/link_project.py

lab: $(STAMP) $(LAB_SETTINGS)
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=. $(LAB_ARGS) lessons/index.md

test: $(STAMP) $(LAB_SETTINGS) browser-deps
	$(PY) -m pytest

# Run saved lesson notebooks in a fresh kernel: one line per exercise (LESSON=03: that one).
grade: $(STAMP)
	@$(PY) -m tools.grade $(sort $(wildcard lessons/$(LESSON)*.ipynb))

# Rebuild lessons/ and solutions/ from their sources in solutions/*.py. A lesson whose
# cells were edited (a student's answers) is kept; FORCE=1 replaces it anyway.
notebooks: $(STAMP)
	$(PY) -m tools.build_notebooks $(if $(FORCE),--force)

bench: $(STAMP)
	$(PY) -m benchmarks.collectives
	$(PY) -m benchmarks.model
	$(PY) -m benchmarks.device
	$(PY) -m benchmarks.shape_only
	$(PY) -m benchmarks.planner

# Debian's Chromium for the browser tests (installed only when missing).
browser-deps:
	@command -v chromium >/dev/null || bash tools/install_chromium.sh

clean:
	rm -rf $(VENV) .pytest_cache artifacts
