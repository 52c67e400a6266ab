# Every target installs what it needs into .venv itself (idempotent).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# A CPU build of torch that lies on this disk; a bare `torch` would pull a multi-GB CUDA build.
TORCH  ?= torch==2.13.0

.PHONY: test test-fast lint lint-imports chat bench install install-test install-models clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.torch: | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH)"
	touch $@

$(VENV)/.installed-%: pyproject.toml $(VENV)/.torch
	$(PIP) install -q -e ".[$*]"
	touch $@

install: $(VENV)/.installed-test
install-test: $(VENV)/.installed-test
install-models: $(VENV)/.installed-models

# Everything, the slow tests too, on TEST_WORKERS pytest-xdist workers (one a core here; each computes on one
# thread, conftest.py). With worksteal each starts on its half of the tests in file order and one that is done
# takes tests from the other. TEST_WORKERS=0 runs them in this one process.
TEST_WORKERS ?= 2
test: install-test install-models lint lint-imports
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal

# The fast default: a small case of every guarantee (no slow tests), on the same workers.
test-fast: install-test lint lint-imports
	$(PY) -m pytest -q -m "not slow" -n $(TEST_WORKERS) --dist worksteal

chat: install-models
	$(PY) infer.py

# e.g. make bench BENCH_ARGS="--quick"
BENCH_ARGS ?=
bench: install-models $(VENV)/.installed-bench
	$(PY) -m specchat.bench $(BENCH_ARGS)

# Lint and format (pyproject.toml's [tool.ruff]); `ruff format .` writes the format it checks. mypy: strict on
# speculative/, config.py, settings.py and api.py (pyproject.toml's [tool.mypy]). Dead code: scripts/dead_code.py.
lint: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(PY) scripts/dead_code.py

# The layers and the no-circle rule of pyproject.toml's [tool.importlinter]
lint-imports: install-test
	$(VENV)/bin/lint-imports

clean:
	rm -rf $(VENV) .pytest_cache
