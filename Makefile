# Two commands matter: `make lab` and `make test`. Both create .venv on first use.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
LAB_ARGS ?=

.PHONY: lab test notebooks check-notebooks bench browser-deps clean

$(STAMP): requirements.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) tools/link_project.py
	touch $(STAMP)

lab: $(STAMP)
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=. $(LAB_ARGS) lessons/index.ipynb

test: $(STAMP) browser-deps
	$(PY) -m pytest

# Rebuild lessons/ and solutions/ from their sources in tools/../lessons_src.
notebooks: $(STAMP)
	$(PY) -m tools.build_notebooks

bench: $(STAMP)
	$(PY) -m benchmarks.collectives
	$(PY) -m benchmarks.model
	$(PY) -m benchmarks.device
	$(PY) -m benchmarks.shape_only

# Debian's Chromium for the browser tests (installed only when missing).
browser-deps:
	@command -v chromium >/dev/null || bash tools/install_chromium.sh

clean:
	rm -rf $(VENV) .pytest_cache artifacts
