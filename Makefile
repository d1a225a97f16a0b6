# minirt: `make demo` and `make test` set everything up on a fresh machine
# (Python 3.10+, a C compiler, access to the package registry).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Touched after a successful install; re-install whenever pyproject.toml changes.
STAMP := $(VENV)/.minirt-installed

.PHONY: all demo test clean distclean

all: test

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install -e '.[dev]'
	touch $@

demo: $(STAMP)
	$(BIN)/minirt demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

# Build outputs and caches; the virtualenv stays (`make distclean` removes it too).
clean:
	rm -rf build dist .pytest_cache out *.egg-info
	find . -path ./$(VENV) -prune -o \( -name __pycache__ -o -name '*.egg-info' \) -type d -print -exec rm -rf {} +
	find . -path ./$(VENV) -prune -o -path ./examples -prune -o -name '*.mrt' -type f -print -exec rm -f {} +

distclean: clean
	rm -rf $(VENV)
