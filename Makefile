# Two commands on a fresh machine:  `make demo` (set up + train)  and  `make test` (set up + tests).
# Setup is idempotent: the .venv is rebuilt only when pyproject.toml changes.
# On a GPU machine pick your own torch build, e.g.  make test TORCH_SPEC="torch==2.13.0+cu128".
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
BIN := $(VENV)/bin
STAMP := $(VENV)/.snip-installed

.PHONY: setup demo test test-all lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check "$(TORCH_SPEC)"
	$(BIN)/pip install --quiet --disable-pip-version-check -e ".[dev]"
	touch $(STAMP)

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/snip train

test: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/pytest -q

test-all: $(STAMP)
	$(BIN)/pytest -q -m ""

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache
