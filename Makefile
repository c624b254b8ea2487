# Two entry points, both self-installing on a machine with only Python and pip:
#   make lab    the main job (the lab report)
#   make test   the test suite
# Everything lives in .venv; the CPU build of PyTorch is installed first where it is available.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
OUT    ?= report

.PHONY: lab test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# Prefer the CPU build (small, local here); fall back to whatever torch pip offers.
	$(BIN)/python -m pip install -q "torch==2.13.0" || $(BIN)/python -m pip install -q "torch>=2.3"
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

lab: $(STAMP)
	$(BIN)/attnlab lab --out $(OUT)

# A worker per core, each test file on one worker (its module fixtures are built once); more than 4 gain little,
# since the largest file alone takes a fifth of the suite. tests/conftest.py gives each worker one torch thread.
test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -n auto --maxprocesses 4 --dist loadfile

lint: $(STAMP)
	$(BIN)/ruff check .

bench: $(STAMP)
	$(BIN)/python bench/encoder_layer.py

clean:
	rm -rf $(VENV) $(OUT) .pytest_cache .ruff_cache
