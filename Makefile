# Two-command quickstart: `make demo` (set up, then run the demo) and `make test`; `make lint`: ruff and mypy.
PYTHON ?= python3
VENV   ?= .venv
BIN     = $(VENV)/bin
STAMP   = $(VENV)/.diskflow-installed
# the top-level packages setup.py maps into `diskflow` (flow, operators, native, cli, ...), linked with
# diskflow/*.py under one `diskflow` folder for mypy
SOURCES   = $(filter-out diskflow tests,$(patsubst %/__init__.py,%,$(wildcard */__init__.py)))
TYPECHECK = build/typecheck/diskflow

.PHONY: demo test install lint clean

$(STAMP): pyproject.toml setup.py constraints.txt $(wildcard native/*.cpp native/*.h)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt torch==2.13.0
	$(BIN)/python -m pip install -q -c constraints.txt -e ".[test]"
	touch $(STAMP)

install: $(STAMP)

# The main job, out of core, in one to two minutes on 2 cores: synth -> ingest -> prepare belady at a 10%
# feature budget -> pipelined direct-I/O training, checked loss for loss against in-memory; MLP baseline.
demo: $(STAMP)
	$(BIN)/diskflow demo

# two pytest processes, one test file each at a time (module fixtures such as a test cluster start once)
test: $(STAMP)
	$(BIN)/python -m pytest -q -n 2 --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check .
	rm -rf $(TYPECHECK) && mkdir -p $(TYPECHECK)
	ln -s $(addprefix $(CURDIR)/,$(SOURCES) $(wildcard diskflow/*.py)) $(TYPECHECK)/
	$(BIN)/mypy

clean:
	rm -rf $(VENV) build *.egg-info native/*.so
