# Quick start: `make demo` and `make test` on a fresh machine (each creates the virtual environment).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: install demo test bench clean

TESTED := $(VENV)/.installed-test

# `make demo` installs superopt alone; `make test` adds the test extra (pytest, Ray, the import linter).
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $(STAMP)

$(TESTED): $(STAMP)
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(TESTED)

install: $(TESTED)

demo: $(STAMP)
	$(PY) -m superopt.demo

# pytest exits 5 when no test ran; make treats that as a failure, as it should. The suite runs on one
# worker per core, at most 4 (each worker loads JAX; tests are independent and write only to tmp dirs). The 25
# slowest tests are listed at the end: where the suite's time goes (issue 59).
test: $(TESTED)
	$(PY) -m pytest -q -n auto --maxprocesses=4 --durations=25

# The inner loop: everything but the tests marked slow (whole models, worker processes, long searches) and
# timing (measurements of this machine); pyproject.toml lists the markers. Under 90 s on two idle cores.
.PHONY: test-fast
test-fast: $(TESTED)
	$(PY) -m pytest -q -n auto --maxprocesses=4 -m "not slow and not timing"

bench: $(TESTED)
	$(PY) -m bench.run
	$(PY) -m bench.scale
	$(PY) -m bench.everyday
	$(PY) -m bench.guard
	$(PY) -m bench.synthesis

# Longer fuzzing than `make test` runs (tests/test_fuzz.py): fresh random programs every run, about 200 per
# target and backend plus 1500 extracted for every target, 100 of each kind (integer, histogram, float64, loops)
# through superopt and 100 extracted, and 150 differentiated; a failure prints as source. A kind's program
# took 0.7 to 3.1 s with one worker on a 2-core machine (RELIABILITY.md, "The kinds' longer runs").
# SUPEROPT_FUZZ_PER_COMBO, SUPEROPT_FUZZ_EXTRACTED, SUPEROPT_FUZZ_PER_KIND, SUPEROPT_FUZZ_EXTRACTED_PER_KIND
# and SUPEROPT_FUZZ_DIFFERENTIATED change the budget; pytest's -k picks properties or kinds.
.PHONY: fuzz
fuzz: $(TESTED)
	SUPEROPT_FUZZ=long $(PY) -m pytest -q -p no:cacheprovider tests/test_fuzz.py

# Times the Pallas kernels against jax.jit on a GPU (needs a CUDA build of jax); refuses without one.
.PHONY: bench-gpu
bench-gpu: $(TESTED)
	$(PY) -m bench.gpu

# The wheels the GPU machine lacks (it has Python 3.12, jax with CUDA, no network), into the ignored .whl/:
# carry .whl with the device command that runs .ci/gpu-run (docs/pallas.md, "Running on a GPU"). egglog 14, the
# newer side of the declared range (Python 3.12 only), and what it imports at import time (cloudpickle, black,
# graphviz, opentelemetry-api; its anywidget is imported only for notebooks).
GPU_WHEELS := egglog==14.0.0 cloudpickle==3.1.3 highspy==1.16.0 black==26.10.1 graphviz==0.21 \
              opentelemetry-api==1.45.2 platformdirs==4.14.8 pytokens==0.4.1
.PHONY: gpu-wheels
gpu-wheels:
	rm -rf .whl && mkdir -p .whl
	$(PYTHON) -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
	    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
	    -d .whl $(GPU_WHEELS)
	@du -sh .whl

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
