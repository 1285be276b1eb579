# The two commands of the README:
#   make demo   set up ./.venv and run the main job (bundled SmolLM2-135M + bundled text: every preset vs BF16)
#   make test   set up ./.venv and run the test suite (GPU tests skip without a GPU)
VENV ?= .venv
PYTEST_ARGS ?=

.PHONY: setup demo test gpu-test

setup:
	VENV=$(VENV) bash scripts/setup.sh

demo: setup
	HF_HUB_OFFLINE=1 $(VENV)/bin/fp8-linear compare

test: setup
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -q -rs $(PYTEST_ARGS); rc=$$?; \
	  if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; exit 1; fi; exit $$rc

gpu-test:
	HF_HUB_OFFLINE=1 $(VENV)/bin/python -m pytest -q -m gpu $(PYTEST_ARGS)
