# The README's two quick-start commands live here: `make run` and `make test`.
# Both create .venv with the interpreter named by PYTHON (3.11+) and install raftlog into it.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: run test venv clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

venv: $(STAMP)

## Start a local cluster, run a short workload against it and print what happened.
run: $(STAMP)
	$(PY) -m raft.cli demo

## Set up and run the whole test suite (what CI runs): the architecture contracts, then pytest.
test: $(STAMP)
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
