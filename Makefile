# The two commands of the README:
#   make demo   set up ./.venv and run the main job (bundled SmolLM2-135M + bundled text: every preset vs
#               the unquantized fp32 model; table and plots in ./fp8-compare/)
#   make test   set up ./.venv and run the test suite (GPU tests skip without a GPU)
# and, for checking a new CPU:
#   make test-matrix   the suite under every ATEN_CPU_CAPABILITY in CAPABILITIES x every thread count in
#                      THREADS, one pass-count line per setting (fails on the first failing setting)
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
	@set -o pipefail; for cap in $(CAPABILITIES); do for t in $(THREADS); do \
	  if [ "$$cap" = native ]; then capenv=(); else capenv=(ATEN_CPU_CAPABILITY=$$cap); fi; \
	  printf 'ATEN_CPU_CAPABILITY=%-8s OMP_NUM_THREADS=%s  ' "$$cap" "$$t"; \
	  env "$${capenv[@]}" OMP_NUM_THREADS=$$t HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -q -p no:cacheprovider \
	    $(PYTEST_ARGS) 2>&1 | tail -1 || exit 1; \
	done; done
