# Quick start: `make demo` and `make test` on a fresh machine (each creates the virtual environment).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo test bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m superopt.demo

# pytest exits 5 when no test ran; make treats that as a failure, as it should. The suite runs on one
# worker per core, at most 4 (each worker loads JAX; tests are independent and write only to tmp dirs).
test: $(STAMP)
	$(PY) -m pytest -q -n auto --maxprocesses=4

bench: $(STAMP)
	$(PY) -m bench.run
	$(PY) -m bench.scale
	$(PY) -m bench.everyday
	$(PY) -m bench.synthesis

# Longer fuzzing than `make test` runs (tests/test_fuzz.py): fresh random programs every run, about 200 per
# target and backend plus 1500 extracted for every target (tens of minutes); a failure prints as source.
# SUPEROPT_FUZZ_PER_COMBO and SUPEROPT_FUZZ_EXTRACTED change the budget.
.PHONY: fuzz
fuzz: $(STAMP)
	SUPEROPT_FUZZ=long $(PY) -m pytest -q -p no:cacheprovider tests/test_fuzz.py

# Times the Pallas kernels against jax.jit on a GPU (needs a CUDA build of jax); refuses without one.
.PHONY: bench-gpu
bench-gpu: $(STAMP)
	$(PY) -m bench.gpu

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
