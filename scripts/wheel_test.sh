#!/usr/bin/env bash
# The wheel as a user gets it: build it, install it (not editable) into a fresh venv, and from a folder outside the
# checkout run --help, `recipes list`, an import of every module, and the demo on the bundled tiny models.
# Usage: bash scripts/wheel_test.sh [WORK_DIR]   (default: a new temporary folder)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK="${1:-$(mktemp -d)}"
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
rm -rf "$WORK/dist"
"$PY" -m pip wheel --quiet --no-deps --no-build-isolation . -w "$WORK/dist"
WHEEL=$(ls "$WORK"/dist/quantkit-*.whl)
echo "built $WHEEL ($(du -h "$WHEEL" | cut -f1))" >&2
QUANTKIT_SPEC="$WHEEL" bash scripts/setup.sh "$WORK/venv" "vllm"
cd "$WORK"   # outside the checkout: nothing may come from the source tree
export PYTHONPATH=
"$WORK/venv/bin/quantkit" --help >/dev/null
"$WORK/venv/bin/quantkit" recipes list
"$WORK/venv/bin/python" - <<'PY'
import importlib, pathlib, pkgutil, sys
import quantkit
where = pathlib.Path(quantkit.__file__).parent
assert "site-packages" in str(where), f"quantkit imported from {where}, not from the installed wheel"
names = [m.name for m in pkgutil.walk_packages([str(where)], "quantkit.")]
skip = {"quantkit.__main__"}
for name in names:
    if name not in skip:
        importlib.import_module(name)
print(f"imported {len(names)} modules from {where}", file=sys.stderr)
PY
"$WORK/venv/bin/quantkit" demo --workdir "$WORK/demo"
test -f "$WORK/demo/gate-report/report.json"
echo "wheel test passed: $WHEEL" >&2
