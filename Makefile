# The README's two quick-start commands live here: `make run` and `make test`.
# Both create .venv with the interpreter named by PYTHON (3.11+) and install raftlog into it.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# Two installs: `make run` needs only the package itself (the demo runs on its base
# dependencies); `make test` adds the dev extras (pyspark, matplotlib, hypothesis, ...: ~900 MB).
BASE   := $(VENV)/.installed-base
DEV    := $(VENV)/.installed-dev

.PHONY: run test venv clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

$(BASE): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e .
	touch $(BASE)

$(DEV): pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $(BASE) $(DEV)

venv: $(DEV)

## Start a local cluster, run a short workload against it and print what happened.
run: $(BASE)
	$(PY) -m raft.cli demo

## Set up and run the whole test suite (what CI runs): the architecture contracts, then pytest.
test: $(DEV)
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
