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

# pytest exits 5 when no test ran; make treats that as a failure, as it should.
test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(PY) -m bench.run

# Times the Pallas kernels against jax.jit on a GPU (needs a CUDA build of jax); refuses without one.
.PHONY: bench-gpu
bench-gpu: $(STAMP)
	$(PY) -m bench.gpu

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
