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

# One worker per core, a test module per worker at a time (its module fixtures built once): the suite
# takes 230 s on 2 cores instead of 440.
test: setup
	$(BIN)/python -m pytest -q -n auto --dist loadscope

check: setup
	$(BIN)/ruff check fxcost tests benchmarks
	$(BIN)/ruff format --check fxcost tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .mypy_cache .ruff_cache
