# Two commands for a fresh machine with Python 3.11 and pip:  `make demo`  and  `make test`.
# CPU installs take the pinned CPU wheel; GPU users run e.g. `make test TORCH=torch` (or their own spec).
# Every other dependency is pinned by constraints.txt (the versions the demo was measured with).
PYTHON ?= python3
VENV   ?= .venv
TORCH  ?= torch==2.13.0
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.weightgraft-installed

.PHONY: demo test install bench clean

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

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_engine.py

clean:
	rm -rf $(VENV)
