# Two commands matter: `make lab` and `make test`. Both create .venv on first use and
# install this project into it editable (pyproject.toml), with requirements.txt's exact pins
# as constraints: `make lab` what the lessons need (no torch), `make test` the rest beside
# it. Each extra set has its stamp, so neither reinstalls what the other installed.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet -c requirements.txt
LAB_STAMP := $(VENV)/.installed-lab
TEST_STAMP := $(VENV)/.installed-test
STAMP := $(VENV)/.installed
LAB_ARGS ?=
LAB_SETTINGS := $(VENV)/etc/jupyter/labconfig/default_setting_overrides.json
LESSON ?=
# The emulator multiplies many small matrices: one BLAS thread each is faster than a pool
# that spins (and the notebooks' outputs do not depend on it: tests/test_notebooks.py).
export OPENBLAS_NUM_THREADS ?= 1
export OMP_NUM_THREADS ?= 1

.PHONY: lab test grade notebooks check-notebooks bench browser-deps clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip

# The lessons: the library, JupyterLab, widgets, matplotlib, jupytext (pyproject's `lab`).
$(LAB_STAMP): pyproject.toml requirements.txt | $(PY)
	$(PIP) -e ".[lab]"
	$(PY) tools/lab_settings.py
	touch $@

# Beside them: torch and the test tools (pyproject's `test`).
$(TEST_STAMP): pyproject.toml requirements.txt $(LAB_STAMP)
	$(PIP) -e ".[test]"
	touch $@

# Everything (what `make test` needs), under the name older checkouts used.
$(STAMP): $(TEST_STAMP)
	touch $@

# The course's JupyterLab settings (tools/jupyterlab_settings.json), for every HOME.
$(LAB_SETTINGS): | $(LAB_STAMP)
	$(PY) tools/lab_settings.py

lab: $(LAB_STAMP) $(LAB_SETTINGS)
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=. $(LAB_ARGS) lessons/index.md

# Tests run side by side, one worker per CPU (TEST_WORKERS=0: in this process, one at a time).
TEST_WORKERS ?= auto
test: $(TEST_STAMP) $(LAB_SETTINGS) browser-deps
	$(PY) -m pytest -n $(TEST_WORKERS)

# Run saved lesson notebooks in a fresh kernel: one line per exercise (LESSON=03: that one).
grade: $(LAB_STAMP)
	@$(PY) -m tools.grade $(sort $(wildcard lessons/$(LESSON)*.ipynb))

# Rebuild lessons/ and solutions/ from their sources in solutions/*.py. A lesson whose
# cells were edited (a student's answers) is kept; FORCE=1 replaces it anyway.
# (With torch: the answer key is executed with lesson 05's comparisons.)
notebooks: $(TEST_STAMP)
	$(PY) -m tools.build_notebooks $(if $(FORCE),--force)

bench: $(TEST_STAMP)
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
