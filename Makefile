# Two commands for a fresh machine with Python 3.11 and pip:  `make demo`  and  `make test`.
# CPU installs take the pinned CPU wheel; GPU users run e.g. `make test TORCH=torch` (or their own spec).
# Every other dependency is pinned by constraints.txt (the versions the demo was measured with).
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.weightgraft-installed
DOCS_STAMP := $(VENV)/.weightgraft-docs-installed

.PHONY: demo test check lint install bench clean docs

install: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH)"
	$(BIN)/pip install --quiet -c constraints.txt -e ".[test]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/weightgraft demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

# Ruff and mypy, each held to its committed baseline (tests/ruff_baseline.json, tests/mypy_baseline.json:
# they may only shrink); `$(BIN)/python tests/lint.py --write-baselines` rewrites both (docs/development.md).
lint: $(STAMP)
	$(BIN)/python tests/lint.py

# For every change: lint, then the fast tier, the suite without the tests marked slow (the rule:
# pyproject.toml's marker, docs/development.md). Same install step as `make test`: a no-op once .venv is installed.
check: lint
	$(BIN)/python -m pytest -q -m "not slow"

# The docs site (mkdocs.yml, pages under docs/) into site/: first docs/tutorial.ipynb is run on the
# demo pair and its text outputs written into it (docs/run_tutorial.py), when `make demo` has run.
$(DOCS_STAMP): $(STAMP)
	$(BIN)/pip install --quiet -c constraints.txt -e ".[docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	@if [ -d runs/demo/data ] && $(BIN)/python -c "from weightgraft.models.demo_models import resolve_demo_spec as r; r('demo'); r('demo:pre')" 2>/dev/null; then \
		$(BIN)/python docs/run_tutorial.py; \
	else \
		echo "make docs: no demo here, so docs/tutorial.ipynb is not run on the demo pair: run \`make demo\` first. Building the site with the notebook as it is."; \
	fi
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_engine.py

clean:
	rm -rf $(VENV)
