# parity_tracker — two commands on a fresh machine with only Python:
#   make demo   the nightly parity pipeline on the built-in targets, into ./.parity
#   make test   the whole test suite (CI runs exactly this; SKIP_BROWSER=1: no chromium install)
#   make ui     the MLflow UI on ./.parity (browse the demo's runs)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
EXTRAS ?= dev,targets
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
export MLFLOW_DISABLE_TELEMETRY := true
export DO_NOT_TRACK := true
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install test test-fast demo bench bench-quick lint format browser ui clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# torch first, pinned: an unpinned torch pulled in by another package would be a CUDA build.
$(VENV)/.torch-installed: | $(PY)
	$(PIP) install "$(TORCH_SPEC)"
	touch $@

$(VENV)/.installed: pyproject.toml $(VENV)/.torch-installed
	$(PIP) install -e ".[$(EXTRAS)]"
	touch $@

install: $(VENV)/.installed

# Headless Chromium for the dashboard tests: Debian's package, installed where it is missing
# and the machine allows (root with apt), announced first; SKIP_BROWSER=1 opts out. The browser
# tests skip with a reason when chromium is missing.
SKIP_BROWSER ?=
browser:
	@if [ -n "$(SKIP_BROWSER)" ]; then echo "make: SKIP_BROWSER set: chromium not installed; browser tests will skip"; \
	elif ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "make: installing chromium with apt-get for the browser tests (opt out: make test SKIP_BROWSER=1)"; \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "make: could not install chromium; browser tests will skip"; \
	  else echo "make: chromium missing and apt-get unavailable; browser tests will skip"; fi; fi

test: install browser
	$(PY) -m pytest -q
	$(MAKE) --no-print-directory bench-quick

test-fast: install
	$(PY) -m pytest -q -m "not slow and not server and not browser"

demo: install
	$(VENV)/bin/parity-tracker nightly --config pipelines/nightly.toml

bench: install
	$(PIP) install -q -e ".[$(EXTRAS),bench]"
	$(PY) -m benchmarks --full

bench-quick: install
	$(PY) -m benchmarks --quick

# The MLflow UI on the store `make demo` wrote (./.parity), bound to 127.0.0.1; prints the URL.
ui: install
	$(VENV)/bin/parity-tracker ui

# The import-layer contracts ([tool.importlinter] in pyproject.toml) run on the installed
# layout, as tests/test_layers.py stages it; make test runs them too.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -p no:cacheprovider tests/test_layers.py tests/test_packaging.py

format: install
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

clean:
	rm -rf .parity build dist *.egg-info
