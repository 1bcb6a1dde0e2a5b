# The two commands the README starts with: `make demo` and `make test`.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
DATA    ?= ../shared/data

.PHONY: setup demo test check lint clean

$(BIN)/fxcost: pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install --quiet -c constraints.txt -e '.[dev,hf]'
	@touch $@

setup: $(BIN)/fxcost

demo: setup
	$(BIN)/fxcost demo

test: setup
	$(BIN)/python -m pytest -q

check: setup
	$(BIN)/ruff check fxcost tests benchmarks
	$(BIN)/ruff format --check fxcost tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
