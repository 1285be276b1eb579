# The two commands of the README:
#   make demo   set up ./.venv and run the main job (bundled SmolLM2-135M + bundled text: every preset vs
#               the unquantized fp32 model; table and plots in ./fp8-compare/)
#   make test   set up ./.venv and run the test suite (GPU tests skip without a GPU)
# and, for checking a new CPU:
#   make test-matrix   the suite under every CPU capability in CAPABILITIES (native, avx2 = what an
#                      AVX2-only CPU computes, default = unvectorized ATen) x every thread count in THREADS,
#                      one after the other; a pass-count line per setting, logs in test-matrix/ (scripts/test_matrix.sh)
SHELL := /bin/bash
VENV ?= .venv
PYTEST_ARGS ?=
CAPABILITIES ?= default avx2 native
THREADS ?= 1 2

.PHONY: setup demo test gpu-test test-matrix

setup:
	VENV=$(VENV) bash scripts/setup.sh

demo: setup
	HF_HUB_OFFLINE=1 $(VENV)/bin/fp8-linear compare

test: setup
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -q -rs $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

gpu-test:
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -q -m gpu $(PYTEST_ARGS)

test-matrix: setup
	VENV=$(VENV) CAPABILITIES="$(CAPABILITIES)" THREADS="$(THREADS)" PYTEST_ARGS="$(PYTEST_ARGS)" bash scripts/test_matrix.sh
