"""Issue 10: every quantkit command against bad and hostile inputs, through the real CLI in a subprocess.

The contract each table case asserts (`_assert_contract`):
- the exit status (2 for bad input unless stated);
- stderr holds exactly one line starting with `error:` (Click's `Error:` for usage errors) and no traceback;
- for errors found before any work (`light`), no heavy package (torch, Quark, transformers, vLLM, lm-eval) was
  imported, stdout is empty and stderr is exactly that one line;
- no output folder that looks complete: outputs named by the case do not exist (an existing one is unchanged),
  and a hidden temporary folder left beside one (`.NAME.quantkit-*`) holds a journal (resumable);
- every input (the copies of the bundled models a case damages, and the bundled models themselves) is byte
  for byte unchanged, and hostile code (pickles, `auto_map` modules, YAML python tags) never ran.

Inputs are built in tmp_path from copies of examples/tiny/* (tests/fixtures/hostile.py builds the hostile files).
Most cases fail in well under 2 s; the few that need Quark are marked slow.
"""

from __future__ import annotations

import json
import os
import re
import resource
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TINY
from tests.fixtures import hostile
from tests.fixtures.hostile import FORBIDDEN_HEAVY_EXIT, Run, error_lines, run_cli, tree_digest

DRAFT_DOWN = "midlayer.mlp.down_proj.weight"


@dataclass
class Bad:
    """One bad input: the command line and what must (not) happen."""

    args: list[str]
    code: int = 2
    kind: str = "error"  # "error": one `error:` line; "usage": Click's `Error:`; "either": one of the two
    light: bool = False  # found before any work: no heavy import, stdout empty, stderr exactly the error line
    mentions: tuple[str, ...] = ()  # substrings of the error line
    absent: tuple[Path, ...] = ()  # outputs that must not exist afterwards
    watch: tuple[Path, ...] = ()  # extra paths that must be byte-identical afterwards
    markers: tuple[Path, ...] = ()  # files hostile code would write if it ran
    stdin: bytes | None = None
    max_chars: int | None = None  # the error line is short (hostile sizes must not be echoed)
    max_seconds: float | None = None
    env: dict[str, str] = field(default_factory=dict)
    preexec_fn: Callable[[], Any] | None = None
    timeout: float = 600


class Ctx:
    """A case's workspace: copies of the bundled models, files, mounts; copies are watched automatically."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.copies: list[Path] = []
        self.mounts: list[Path] = []

    def model(self, name: str, dst: str | Path | None = None, drop: tuple[str, ...] = ()) -> Path:
        path = self.tmp / (dst or name) if not isinstance(dst, Path) else dst
        path.parent.mkdir(parents=True, exist_ok=True)
        hostile.copy_model(TINY / name, path, drop=drop)
        self.copies.append(path)
        return path

    def file(self, name: str, content: str | bytes) -> Path:
        path = self.tmp / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path

    def prompts(self) -> Path:
        return self.file("ok-prompts.jsonl", json.dumps({"prompt": "The capital of France is", "domain": "x"}) + "\n")

    def marker(self, name: str = "hostile-code-ran") -> Path:
        return self.tmp / name

    def mount_tmpfs(self, name: str, options: str) -> Path | None:
        """A tmpfs at tmp/NAME (we run as root in CI and here); None where mounting is not allowed."""
        path = self.tmp / name
        path.mkdir()
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True)
        if done.returncode != 0:
            return None
        self.mounts.append(path)
        return path

    def read_only_dir(self, name: str = "ro") -> Path:
        path = self.mount_tmpfs(name, "ro,size=1M")
        if path is None:
            if os.geteuid() != 0:
                os.chmod(self.tmp / name, 0o555)
                return self.tmp / name
            pytest.skip("cannot mount a read-only tmpfs here, and root ignores permission bits")
        return path

    def cleanup(self) -> None:
        for m in self.mounts:
            if subprocess.run(["umount", str(m)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(m)], capture_output=True)


CASES: dict[str, tuple[Callable[[Ctx], Bad], tuple[Any, ...]]] = {}


def case(name: str, *marks: Any) -> Callable[[Callable[[Ctx], Bad]], Callable[[Ctx], Bad]]:
    def register(fn: Callable[[Ctx], Bad]) -> Callable[[Ctx], Bad]:
        assert name not in CASES, name
        CASES[name] = (fn, marks)
        return fn

    return register


def _usage(args: list[str]) -> Bad:
    return Bad(args, kind="usage", light=True)


# --- top level and recipes ----------------------------------------------------------------------------------------

# A valid recipe (the built-in fp8-draft's content) that cases damage one key at a time.
RECIPE_OK = """name: fp8-draft-copy
description: "EAGLE-3 draft: decoder linears in FP8 (ptpc), fc and lm_head kept BF16"
applies_to: eagle3-draft
scheme: ptpc_fp8
quantize: [decoder_linears]
keep:
  - role: fc
    reason: fc's input concatenates three target hidden states with very different scales
  - role: lm_head
    reason: vLLM cannot load a quantized EAGLE-3 draft lm_head
path: in-memory
calibration: none
"""


@case("unknown-command")
def _(t: Ctx) -> Bad:
    return _usage(["frobnicate"])


@case("recipes-list-extra-argument")
def _(t: Ctx) -> Bad:
    return _usage(["recipes", "list", "extra"])


@case("recipes-show-unknown-name")
def _(t: Ctx) -> Bad:
    return Bad(["recipes", "show", "no-such-recipe"], light=True, mentions=("no-such-recipe",))


@case("recipes-show-unknown-scheme")
def _(t: Ctx) -> Bad:
    f = t.file("r.yaml", RECIPE_OK.replace("scheme: ptpc_fp8", "scheme: int3_magic"))
    return Bad(["recipes", "show", str(f)], light=True, mentions=("scheme",))


@case("recipes-show-unknown-key")
def _(t: Ctx) -> Bad:
    f = t.file("r.yaml", RECIPE_OK + "bogus_key: 1\n")
    return Bad(["recipes", "show", str(f)], light=True, mentions=("bogus_key",))


def _bomb_recipe(t: Ctx) -> Path:
    head = "\n".join(line for line in RECIPE_OK.splitlines() if not line.startswith("quantize:"))
    return t.file("bomb.yaml", hostile.alias_bomb_yaml(prefix=head + "\n", key="quantize"))


@case("recipes-show-yaml-alias-bomb")
def _(t: Ctx) -> Bad:
    return Bad(["recipes", "show", str(_bomb_recipe(t))], light=True, max_chars=500, max_seconds=5, timeout=60)


@case("recipes-show-yaml-python-tag")
def _(t: Ctx) -> Bad:
    m = t.marker()
    f = t.file(
        "r.yaml",
        RECIPE_OK.replace('description: "', f'description: !!python/object/apply:os.system ["touch {m}"]\nx: "'),
    )
    return Bad(["recipes", "show", str(f)], light=True, markers=(m,))


@case("recipes-show-folder-as-file")
def _(t: Ctx) -> Bad:
    d = t.tmp / "recipe-folder.yaml"
    d.mkdir()
    return Bad(["recipes", "show", str(d)], light=True)


@case("recipes-show-non-utf8")
def _(t: Ctx) -> Bad:
    f = t.file("r.yaml", RECIPE_OK.encode().replace(b"EAGLE-3", b"EAGLE\xff\xfe-3"))
    return Bad(["recipes", "show", str(f)], light=True, mentions=("r.yaml",))


@case("recipes-show-yaml-deep-nesting")
def _(t: Ctx) -> Bad:
    f = t.file("deep.yaml", "quantize: " + hostile.nested_json())
    return Bad(["recipes", "show", str(f)], light=True, mentions=("deep.yaml",), max_chars=500, timeout=60)


@case("recipes-show-empty-file")
def _(t: Ctx) -> Bad:
    return Bad(["recipes", "show", str(t.file("empty.yaml", ""))], light=True, mentions=("empty.yaml",))


# --- apply: where the output goes ---------------------------------------------------------------------------------


def _apply(src: Path, out: Path | str, *extra: str, recipe: str = "fp8-draft") -> list[str]:
    return ["apply", "--recipe", recipe, "--model", str(src), "--output", str(out), *extra]


@case("apply-output-equals-source")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    return Bad(_apply(src, src, "--overwrite"), light=True)


@case("apply-output-equals-source-that-has-a-manifest")
def _(t: Ctx) -> Bad:
    # The source even looks like a quantkit output, so only the "output is the source" rule can refuse it.
    src = t.model("eagle3-draft", "src")
    (src / "quantkit.json").write_text('{"layers": []}\n')
    return Bad(_apply(src, src, "--overwrite"), light=True)


@case("apply-output-inside-source")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    return Bad(_apply(src, src / "out", "--overwrite"), light=True, absent=(src / "out",))


@case("apply-output-contains-source")
def _(t: Ctx) -> Bad:
    # The parent is a previous quantkit output (it has quantkit.json), so --overwrite would otherwise replace it,
    # and the source with it.
    parent = t.tmp / "parent"
    src = t.model("eagle3-draft", parent / "src")
    (parent / "quantkit.json").write_text('{"layers": []}\n')
    return Bad(_apply(src, parent, "--overwrite"), light=True, watch=(parent,))


@case("apply-output-symlink-to-source")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    (src / "quantkit.json").write_text('{"layers": []}\n')
    link = t.tmp / "link"
    link.symlink_to(src)
    return Bad(_apply(src, link, "--overwrite"), light=True, watch=(link,))


@case("apply-output-inside-source-via-symlink")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    link = t.tmp / "link"
    link.symlink_to(src)
    return Bad(_apply(src, link / "out", "--overwrite"), light=True, absent=(src / "out",))


@case("apply-overwrite-of-a-folder-not-written-by-quantkit")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    out = t.tmp / "my-notes"
    out.mkdir()
    (out / "notes.txt").write_text("precious\n")
    return Bad(_apply(src, out, "--overwrite"), light=True, watch=(out,), mentions=(str(out),))


@case("apply-output-exists-without-overwrite")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    out = hostile.fake_quantkit_output(TINY / "target", t.tmp / "previous")
    return Bad(_apply(src, out), light=True, watch=(out,), mentions=(str(out),))


@case("apply-output-is-a-file")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    out = t.file("out", "a file\n")
    return Bad(_apply(src, out, "--overwrite"), light=True, watch=(out,))


@case("apply-output-parent-is-a-file")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    parent = t.file("afile", "a file\n")
    return Bad(_apply(src, parent / "out"), light=True, watch=(parent,), mentions=(str(parent),))


@case("apply-output-parent-read-only")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    ro = t.read_only_dir()
    return Bad(_apply(src, ro / "out"), light=True, absent=(ro / "out",), mentions=(str(ro),))


# --- apply: the model, its config and headers ---------------------------------------------------------------------


@case("apply-model-missing")
def _(t: Ctx) -> Bad:
    out = t.tmp / "out"
    return Bad(_apply(t.tmp / "no-such-model", out), light=True, absent=(out,), mentions=("no-such-model",))


@case("apply-model-is-a-file")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    out = t.tmp / "out"
    return Bad(_apply(src / "config.json", out), light=True, absent=(out,))


@case("apply-model-symlink-loop")
def _(t: Ctx) -> Bad:
    (t.tmp / "a").symlink_to(t.tmp / "b")
    (t.tmp / "b").symlink_to(t.tmp / "a")
    out = t.tmp / "out"
    return Bad(_apply(t.tmp / "a", out), light=True, absent=(out,))


@case("apply-config-is-a-json-list")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    (src / "config.json").write_text("[1, 2, 3]\n")
    return Bad(_apply(src, t.tmp / "out"), light=True, absent=(t.tmp / "out",), mentions=("config.json",))


@case("apply-config-non-utf8")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    (src / "config.json").write_bytes((src / "config.json").read_bytes().replace(b'"llama"', b'"ll\xff\xfema"'))
    return Bad(_apply(src, t.tmp / "out"), light=True, absent=(t.tmp / "out",), mentions=("config.json",))


@case("apply-config-deep-nesting")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    (src / "config.json").write_text(hostile.nested_json())
    return Bad(
        _apply(src, t.tmp / "out"), light=True, absent=(t.tmp / "out",), mentions=("config.json",), max_chars=500
    )


@case("apply-config-20mb-json-string")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    (src / "config.json").write_text('"' + "A" * 20_000_000 + '"')
    return Bad(
        _apply(src, t.tmp / "out"), light=True, absent=(t.tmp / "out",), mentions=("config.json",), max_chars=500
    )


@case("apply-header-deep-nesting")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    hostile.write_safetensors(src / "model.safetensors", hostile.nested_json().encode())
    return Bad(
        _apply(src, t.tmp / "out"), light=True, absent=(t.tmp / "out",), mentions=("model.safetensors",), max_chars=500
    )


@case("apply-header-length-2**40")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    hostile.set_header_length(src / "model.safetensors", 2**40)
    return Bad(_apply(src, t.tmp / "out"), light=True, absent=(t.tmp / "out",), mentions=("model.safetensors",))


@case("apply-header-unknown-dtype-F99")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    hostile.set_dtype(src / "model.safetensors", DRAFT_DOWN, "F99")
    return Bad(_apply(src, t.tmp / "out"), light=True, absent=(t.tmp / "out",), mentions=("F99",))


@case("apply-index-deep-nesting")
def _(t: Ctx) -> Bad:
    src = t.model("moe-target", "src")
    (src / "model.safetensors.index.json").write_text(hostile.nested_json())
    return Bad(
        _apply(src, t.tmp / "out", recipe="mxfp4-moe"),
        light=True,
        absent=(t.tmp / "out",),
        mentions=("model.safetensors.index.json",),
        max_chars=500,
    )


@case("apply-pickle-only-folder")
def _(t: Ctx) -> Bad:
    m = t.marker()
    src = hostile.pickle_only_folder(TINY / "target", t.tmp / "src", m)
    t.copies.append(src)
    return Bad(_apply(src, t.tmp / "out", recipe="fp8-target"), light=True, absent=(t.tmp / "out",), markers=(m,))


@case("apply-recipe-yaml-alias-bomb")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    bomb = _bomb_recipe(t)
    return Bad(
        ["apply", "--recipe", str(bomb), "--model", str(src), "--output", str(t.tmp / "out")],
        light=True,
        absent=(t.tmp / "out",),
        max_chars=500,
        max_seconds=5,
        timeout=60,
    )


@case("apply-recipe-unknown-scheme")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    f = t.file("r.yaml", RECIPE_OK.replace("scheme: ptpc_fp8", "scheme: int3_magic"))
    return Bad(
        ["apply", "--recipe", str(f), "--model", str(src), "--output", str(t.tmp / "out")],
        light=True,
        absent=(t.tmp / "out",),
        mentions=("scheme",),
    )


@case("apply-recipe-is-a-folder")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    d = t.tmp / "recipes.d"
    d.mkdir()
    return Bad(
        ["apply", "--recipe", str(d), "--model", str(src), "--output", str(t.tmp / "out")],
        light=True,
        absent=(t.tmp / "out",),
    )


@case("apply-recipe-for-another-kind-of-model")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    return Bad(_apply(src, t.tmp / "out", recipe="mxfp4-moe"), light=True, absent=(t.tmp / "out",))


@case("apply-target-too-few-layers-for-aux-ids")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    tgt = t.model("target", "tgt")
    cfg = json.loads((tgt / "config.json").read_text())
    cfg["num_hidden_layers"] = 2  # the draft reads hidden states of layers 1, 2, 3
    (tgt / "config.json").write_text(json.dumps(cfg))
    return Bad(_apply(src, t.tmp / "out", "--target", str(tgt)), light=True, absent=(t.tmp / "out",))


@case("apply-device-unknown")
def _(t: Ctx) -> Bad:
    return _usage(_apply(TINY / "eagle3-draft", t.tmp / "out", "--device", "tpu"))


@case("apply-path-unknown")
def _(t: Ctx) -> Bad:
    return _usage(_apply(TINY / "eagle3-draft", t.tmp / "out", "--path", "sideways"))


@case("apply-recipe-option-missing")
def _(t: Ctx) -> Bad:
    return _usage(["apply", "--model", str(TINY / "eagle3-draft"), "--output", str(t.tmp / "out")])


# Non-finite source weights in a layer to be quantized: three kinds, three model families (draft, dense target,
# sharded MoE expert). Two bad values each: the message names the first.
def _poisoned(t: Ctx, model: str, recipe: str, shard: str, tensor: str, value: str) -> Bad:
    src = t.model(model, "src")
    hostile.poison_bf16(src / shard, tensor, (5, 1), value)
    hostile.poison_bf16(src / shard, tensor, (3, 7), value)
    return Bad(
        _apply(src, t.tmp / "out", recipe=recipe),
        absent=(t.tmp / "out",),
        mentions=(f"{tensor.rsplit('.', 2)[-2]}.weight[3, 7]",),
    )


@case("apply-nan-in-draft-weight")
def _(t: Ctx) -> Bad:
    return _poisoned(t, "eagle3-draft", "fp8-draft", "model.safetensors", DRAFT_DOWN, "nan")


@case("apply-plus-inf-in-dense-target-weight")
def _(t: Ctx) -> Bad:
    return _poisoned(t, "target", "fp8-target", "model.safetensors", "model.layers.2.mlp.down_proj.weight", "+inf")


@case("apply-minus-inf-in-moe-expert-weight")
def _(t: Ctx) -> Bad:
    index = json.loads((TINY / "moe-target" / "model.safetensors.index.json").read_text())["weight_map"]
    tensor = next(
        n
        for n, f in sorted(index.items())
        if f.endswith("00002-of-00002.safetensors") and re.search(r"experts\.\d+\.down_proj\.weight$", n)
    )
    return _poisoned(t, "moe-target", "mxfp4-moe", index[tensor], tensor, "-inf")


@case("apply-disk-full")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    small = t.mount_tmpfs("small", "size=256k")
    if small is not None:
        out = small / "out"
        return Bad(_apply(src, out), absent=(out,), mentions=(str(small),))
    # No mount here: a file size limit instead (Python ignores SIGXFSZ, so a write past it fails with EFBIG).
    out = t.tmp / "out"
    return Bad(
        _apply(src, out),
        absent=(out,),
        mentions=(str(out),),
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000)),
    )


# --- inspect ------------------------------------------------------------------------------------------------------


@case("inspect-empty-folder")
def _(t: Ctx) -> Bad:
    d = t.tmp / "empty"
    d.mkdir()
    return Bad(["inspect", str(d)], light=True, mentions=(str(d),))


@case("inspect-missing-folder")
def _(t: Ctx) -> Bad:
    return Bad(["inspect", str(t.tmp / "nothing-here")], light=True, mentions=("nothing-here",))


@case("inspect-file-instead-of-folder")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    return Bad(["inspect", str(src / "model.safetensors")], light=True)


@case("inspect-config-is-a-json-list")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    (src / "config.json").write_text("[]")
    return Bad(["inspect", str(src)], light=True, mentions=("config.json",))


@case("inspect-config-non-utf8")
def _(t: Ctx) -> Bad:
    src = t.model("target", "src")
    (src / "config.json").write_bytes(b'{"model_type": "\xc3\x28\xa0\xa1"}')
    return Bad(["inspect", str(src)], light=True, mentions=("config.json",))


@case("inspect-config-deep-nesting")
def _(t: Ctx) -> Bad:
    src = t.model("target", "src")
    (src / "config.json").write_text('{"quantization_config": ' + hostile.nested_json() + "}")
    return Bad(["inspect", str(src)], light=True, mentions=("config.json",), max_chars=500)


@case("inspect-config-20mb-json-string")
def _(t: Ctx) -> Bad:
    src = t.model("target", "src")
    (src / "config.json").write_text('"' + "A" * 20_000_000 + '"')
    return Bad(["inspect", str(src)], light=True, mentions=("config.json",), max_chars=500)


@case("inspect-config-symlink-loop")
def _(t: Ctx) -> Bad:
    src = t.model("target", "src")
    (src / "config.json").unlink()
    (src / "config.json").symlink_to(src / "config.json")
    return Bad(["inspect", str(src)], light=True, mentions=("config.json",))


@case("inspect-folder-symlink-loop")
def _(t: Ctx) -> Bad:
    (t.tmp / "a").symlink_to(t.tmp / "b")
    (t.tmp / "b").symlink_to(t.tmp / "a")
    return Bad(["inspect", str(t.tmp / "a")], light=True)


@case("inspect-header-deep-nesting")
def _(t: Ctx) -> Bad:
    src = t.model("target", "src")
    hostile.write_safetensors(src / "model.safetensors", hostile.nested_json().encode())
    return Bad(["inspect", str(src)], light=True, mentions=("model.safetensors",), max_chars=500)


@case("inspect-header-length-2**40")
def _(t: Ctx) -> Bad:
    src = t.model("target", "src")
    hostile.set_header_length(src / "model.safetensors", 2**40)
    return Bad(["inspect", str(src)], light=True, mentions=("model.safetensors",))


@case("inspect-header-unknown-dtype-F99")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    hostile.set_dtype(src / "model.safetensors", DRAFT_DOWN, "F99")
    return Bad(["inspect", str(src)], light=True, mentions=("F99",))


@case("inspect-header-20mb-tensor-name-out-of-bounds")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    header, data = hostile.read_header(src / "model.safetensors")
    header["w" * 20_000_000] = {"dtype": "BF16", "shape": [4], "data_offsets": [0, 10**9]}
    hostile.write_safetensors(src / "model.safetensors", header, data)
    # The bound is about not echoing 20 MB, not a house limit on line length (a clipped name may show).
    return Bad(["inspect", str(src)], light=True, mentions=("model.safetensors",), max_chars=1000)


@case("inspect-index-deep-nesting")
def _(t: Ctx) -> Bad:
    src = t.model("moe-target", "src")
    (src / "model.safetensors.index.json").write_text('{"weight_map": ' + hostile.nested_json() + "}")
    return Bad(["inspect", str(src)], light=True, mentions=("model.safetensors.index.json",), max_chars=500)


@case("inspect-index-is-a-json-list")
def _(t: Ctx) -> Bad:
    src = t.model("moe-target", "src")
    (src / "model.safetensors.index.json").write_text("[]")
    return Bad(["inspect", str(src)], light=True, mentions=("model.safetensors.index.json",))


@case("inspect-pickle-only-folder")
def _(t: Ctx) -> Bad:
    m = t.marker()
    src = hostile.pickle_only_folder(TINY / "target", t.tmp / "src", m)
    t.copies.append(src)
    return Bad(["inspect", str(src)], light=True, markers=(m,))


@case("inspect-target-missing")
def _(t: Ctx) -> Bad:
    return Bad(
        ["inspect", str(TINY / "eagle3-draft"), "--target", str(t.tmp / "no-target")],
        light=True,
        mentions=("no-target",),
    )


# --- check --------------------------------------------------------------------------------------------------------


@case("check-tp-0")
def _(t: Ctx) -> Bad:
    return _usage(["check", str(TINY / "eagle3-draft"), "--tp", "0", "--vllm", "off"])


@case("check-tp-not-a-number")
def _(t: Ctx) -> Bad:
    return _usage(["check", str(TINY / "eagle3-draft"), "--tp", "eight", "--vllm", "off"])


@case("check-load-timeout-0")
def _(t: Ctx) -> Bad:
    return _usage(["check", str(TINY / "eagle3-draft"), "--load-timeout", "0"])


@case("check-load-timeout-negative")
def _(t: Ctx) -> Bad:
    return _usage(["check", str(TINY / "eagle3-draft"), "--load-timeout", "-5"])


@case("check-platform-unknown")
def _(t: Ctx) -> Bad:
    return _usage(["check", str(TINY / "eagle3-draft"), "--platform", "gfx000"])


@case("check-numeric-without-source")
def _(t: Ctx) -> Bad:
    return Bad(["check", str(TINY / "eagle3-draft"), "--numeric", "--vllm", "off"], light=True, mentions=("--source",))


@case("check-numeric-source-missing")
def _(t: Ctx) -> Bad:
    return Bad(
        ["check", str(TINY / "eagle3-draft"), "--numeric", "--source", str(t.tmp / "no-source"), "--vllm", "off"],
        light=True,
        mentions=("no-source",),
    )


@case("check-empty-folder")
def _(t: Ctx) -> Bad:
    d = t.tmp / "empty"
    d.mkdir()
    return Bad(["check", str(d), "--vllm", "off"], light=True, mentions=(str(d),))


@case("check-config-is-a-json-list")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    (src / "config.json").write_text("[]")
    return Bad(["check", str(src), "--vllm", "off"], light=True, mentions=("config.json",))


@case("check-header-unknown-dtype-F99")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    hostile.set_dtype(src / "model.safetensors", DRAFT_DOWN, "F99")
    return Bad(["check", str(src), "--vllm", "off"], light=True, mentions=("F99",))


@case("check-header-deep-nesting")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    hostile.write_safetensors(src / "model.safetensors", hostile.nested_json().encode())
    return Bad(["check", str(src), "--vllm", "off"], light=True, mentions=("model.safetensors",), max_chars=500)


@case("check-pickle-only-folder")
def _(t: Ctx) -> Bad:
    m = t.marker()
    src = hostile.pickle_only_folder(TINY / "target", t.tmp / "src", m)
    t.copies.append(src)
    return Bad(["check", str(src), "--vllm", "off"], light=True, markers=(m,))


@case("check-header-length-2**40")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    hostile.set_header_length(src / "model.safetensors", 2**40)
    return Bad(["check", str(src), "--vllm", "off"], light=True, mentions=("model.safetensors",))


# --- acceptance ---------------------------------------------------------------------------------------------------


def _acceptance(
    t: Ctx,
    *extra: str,
    target: Path | None = None,
    draft: Path | None = None,
    candidate: Path | None = None,
    prompts: Path | None = None,
) -> list[str]:
    """An otherwise valid, cheap acceptance run (reference engine, 2 new tokens, one prompt)."""
    return [
        "acceptance",
        "--target",
        str(target or TINY / "target"),
        "--draft",
        str(draft or TINY / "eagle3-draft"),
        "--candidate",
        str(candidate or TINY / "eagle3-draft"),
        "--backend",
        "reference",
        "--prompts",
        str(prompts or t.prompts()),
        "--max-new-tokens",
        "2",
        *extra,
    ]


@case("acceptance-max-new-tokens-0")
def _(t: Ctx) -> Bad:
    return _usage([*_acceptance(t), "--max-new-tokens", "0"])


@case("acceptance-max-new-tokens-negative")
def _(t: Ctx) -> Bad:
    return _usage([*_acceptance(t), "--max-new-tokens", "-5"])


@case("acceptance-num-speculative-tokens-0")
def _(t: Ctx) -> Bad:
    return _usage(_acceptance(t, "--num-speculative-tokens", "0"))


@case("acceptance-temperature-negative")
def _(t: Ctx) -> Bad:
    return _usage(_acceptance(t, "--temperature", "-1"))


@case("acceptance-context-lengths-0")
def _(t: Ctx) -> Bad:
    return _usage(_acceptance(t, "--context-lengths", "0"))


@case("acceptance-context-lengths-not-numbers")
def _(t: Ctx) -> Bad:
    return _usage(_acceptance(t, "--context-lengths", "abc"))


@case("acceptance-backend-unknown")
def _(t: Ctx) -> Bad:
    return _usage([*_acceptance(t), "--backend", "tensorrt"])


@case("acceptance-out-is-a-folder")
def _(t: Ctx) -> Bad:
    d = t.tmp / "out-dir"
    d.mkdir()
    return Bad(_acceptance(t, "--out", str(d)), kind="either", light=True, watch=(d,))


def _bad_prompts(t: Ctx, content: str | bytes, *mentions: str, **kw: Any) -> Bad:
    p = t.file("prompts.jsonl", content)
    return Bad(_acceptance(t, prompts=p), light=True, mentions=("prompts.jsonl", *mentions), **kw)


@case("acceptance-prompts-content-not-a-string")
def _(t: Ctx) -> Bad:
    return _bad_prompts(t, json.dumps({"messages": [{"role": "user", "content": 5}]}) + "\n")


@case("acceptance-prompts-prompt-not-a-string")
def _(t: Ctx) -> Bad:
    return _bad_prompts(t, json.dumps({"prompt": {"text": "hi"}}) + "\n")


@case("acceptance-prompts-not-json")
def _(t: Ctx) -> Bad:
    return _bad_prompts(t, "this is not json\n")


@case("acceptance-prompts-empty-file")
def _(t: Ctx) -> Bad:
    return _bad_prompts(t, "")


@case("acceptance-prompts-deep-nesting")
def _(t: Ctx) -> Bad:
    return _bad_prompts(t, hostile.nested_json() + "\n", max_chars=500)


@case("acceptance-prompts-non-utf8")
def _(t: Ctx) -> Bad:
    return _bad_prompts(t, b'{"prompt": "caf\xe9 \xff"}\n')


@case("acceptance-prompts-is-a-folder")
def _(t: Ctx) -> Bad:
    d = t.tmp / "prompts.d"
    d.mkdir()
    return Bad(_acceptance(t, prompts=d), light=True, mentions=("prompts.d",))


@case("acceptance-target-layers-do-not-fit-aux-ids")
def _(t: Ctx) -> Bad:
    tgt = t.model("target", "tgt")
    cfg = json.loads((tgt / "config.json").read_text())
    cfg["num_hidden_layers"] = 2  # the draft reads hidden states of layers 1, 2, 3
    (tgt / "config.json").write_text(json.dumps(cfg))
    return Bad(_acceptance(t, target=tgt), light=True)


@case("acceptance-target-is-a-draft")
def _(t: Ctx) -> Bad:
    return Bad(_acceptance(t, target=TINY / "eagle3-draft"), light=True)


@case("acceptance-draft-is-a-target")
def _(t: Ctx) -> Bad:
    return Bad(_acceptance(t, draft=TINY / "target"), light=True)


@case("acceptance-candidate-config-deep-nesting")
def _(t: Ctx) -> Bad:
    cand = t.model("eagle3-draft", "cand")
    (cand / "config.json").write_text(hostile.nested_json())
    return Bad(_acceptance(t, candidate=cand), light=True, mentions=("config.json",), max_chars=500)


@case("acceptance-target-pickle-only")
def _(t: Ctx) -> Bad:
    m = t.marker()
    tgt = hostile.pickle_only_folder(TINY / "target", t.tmp / "tgt", m)
    t.copies.append(tgt)
    return Bad(_acceptance(t, target=tgt), light=True, markers=(m,))


@case("acceptance-target-remote-code")
def _(t: Ctx) -> Bad:
    m = t.marker()
    tgt = t.model("target", "tgt")
    hostile.add_remote_code(tgt, m)
    return Bad(_acceptance(t, target=tgt), stdin=b"y\n" * 100, markers=(m,), mentions=("--trust-remote-code",))


@case("acceptance-target-without-tokenizer")
def _(t: Ctx) -> Bad:
    tgt = t.model("target", "tgt", drop=("tokenizer*", "chat_template.jinja"))
    return Bad(_acceptance(t, target=tgt), mentions=("tokenizer",))


# --- eval ---------------------------------------------------------------------------------------------------------


def _eval(model: Path, baseline: Path, *extra: str) -> list[str]:
    return [
        "eval",
        "--model",
        str(model),
        "--baseline",
        str(baseline),
        "--tasks",
        "tiny_french_mc",
        "--limit",
        "1",
        *extra,
    ]


@case("eval-limit-0")
def _(t: Ctx) -> Bad:
    return _usage([*_eval(TINY / "target", TINY / "target"), "--limit", "0"])


@case("eval-batch-size-0")
def _(t: Ctx) -> Bad:
    return _usage(_eval(TINY / "target", TINY / "target", "--batch-size", "0"))


@case("eval-out-is-a-folder")
def _(t: Ctx) -> Bad:
    d = t.tmp / "out-dir"
    d.mkdir()
    return Bad(_eval(TINY / "target", TINY / "target", "--out", str(d)), kind="either", light=True, watch=(d,))


@case("eval-model-is-an-eagle3-draft")
def _(t: Ctx) -> Bad:
    return Bad(_eval(TINY / "eagle3-draft", TINY / "target"), light=True)


@case("eval-baseline-missing")
def _(t: Ctx) -> Bad:
    return Bad(_eval(TINY / "target", t.tmp / "no-baseline"), light=True, mentions=("no-baseline",))


@case("eval-model-is-a-file")
def _(t: Ctx) -> Bad:
    return Bad(_eval(TINY / "target" / "config.json", TINY / "target"), light=True)


@case("eval-model-pickle-only")
def _(t: Ctx) -> Bad:
    m = t.marker()
    model = hostile.pickle_only_folder(TINY / "target", t.tmp / "model", m)
    t.copies.append(model)
    return Bad(_eval(model, TINY / "target"), light=True, markers=(m,))


@case("eval-model-remote-code")
def _(t: Ctx) -> Bad:
    m = t.marker()
    model = t.model("target", "model")
    hostile.add_remote_code(model, m)
    return Bad(_eval(model, TINY / "target"), stdin=b"y\n" * 100, markers=(m,), mentions=("--trust-remote-code",))


@case("eval-model-without-tokenizer")
def _(t: Ctx) -> Bad:
    model = t.model("target", "model", drop=("tokenizer*", "chat_template.jinja"))
    return Bad(_eval(model, TINY / "target"), mentions=("tokenizer",))


# --- gate ---------------------------------------------------------------------------------------------------------

GATE_OK = f"""name: g
target: {TINY / "target"}
draft: {TINY / "eagle3-draft"}
candidates:
  - name: c
    path: {TINY / "eagle3-draft"}
steps: [check]
check:
  vllm: "off"
"""


def _gate(t: Ctx, text: str | bytes, **kw: Any) -> Bad:
    cfg = t.file("gate.yaml", text)
    out = t.tmp / "gate-out"
    return Bad(["gate", str(cfg), "--out", str(out)], light=True, absent=(out,), **kw)


@case("gate-yaml-alias-bomb")
def _(t: Ctx) -> Bad:
    text = hostile.alias_bomb_yaml(prefix=GATE_OK.replace("steps: [check]", "steps: [check, eval]"), key="eval")
    return _gate(t, text, max_chars=500, max_seconds=5, timeout=60)


@case("gate-unknown-step")
def _(t: Ctx) -> Bad:
    return _gate(t, GATE_OK.replace("steps: [check]", "steps: [check, deploy]"), mentions=("steps",))


@case("gate-unknown-key")
def _(t: Ctx) -> Bad:
    return _gate(t, GATE_OK + "colour: blue\n", mentions=("colour",))


@case("gate-yaml-deep-nesting")
def _(t: Ctx) -> Bad:
    return _gate(t, GATE_OK + "extra: " + hostile.nested_json() + "\n", mentions=("gate.yaml",), max_chars=500)


@case("gate-yaml-python-tag")
def _(t: Ctx) -> Bad:
    m = t.marker()
    return _gate(t, GATE_OK.replace("name: g", f'name: !!python/object/apply:os.system ["touch {m}"]'), markers=(m,))


@case("gate-config-is-a-list")
def _(t: Ctx) -> Bad:
    return _gate(t, "- check\n- acceptance\n", mentions=("gate.yaml",))


@case("gate-config-non-utf8")
def _(t: Ctx) -> Bad:
    return _gate(t, GATE_OK.encode().replace(b"name: g", b"name: g\xff\xfe"), mentions=("gate.yaml",))


@case("gate-config-missing")
def _(t: Ctx) -> Bad:
    out = t.tmp / "gate-out"
    return Bad(
        ["gate", str(t.tmp / "no-gate.yaml"), "--out", str(out)],
        kind="either",
        light=True,
        absent=(out,),
        mentions=("no-gate.yaml",),
    )


@case("gate-config-is-a-folder")
def _(t: Ctx) -> Bad:
    d = t.tmp / "gate.d"
    d.mkdir()
    out = t.tmp / "gate-out"
    return Bad(["gate", str(d), "--out", str(out)], kind="either", light=True, absent=(out,))


@case("gate-out-is-a-file")
def _(t: Ctx) -> Bad:
    cfg = t.file("gate.yaml", GATE_OK)
    out = t.file("gate-out", "a file\n")
    return Bad(["gate", str(cfg), "--out", str(out)], kind="either", light=True, watch=(out,))


# --- publish ------------------------------------------------------------------------------------------------------


def _publish(folder: Path, *extra: str, repo_id: str = "org/name") -> list[str]:
    return ["publish", str(folder), "--repo-id", repo_id, "--dry-run", *extra]


def _preview(folder: Path) -> Path:
    return folder.with_name(folder.name + ".publish-preview")


@case("publish-folder-not-written-by-quantkit")
def _(t: Ctx) -> Bad:
    src = t.model("target", "src")
    return Bad(_publish(src), light=True, absent=(_preview(src),), mentions=(str(src),))


@case("publish-folder-missing")
def _(t: Ctx) -> Bad:
    f = t.tmp / "no-folder"
    return Bad(_publish(f), light=True, absent=(_preview(f),), mentions=("no-folder",))


@case("publish-folder-is-a-file")
def _(t: Ctx) -> Bad:
    f = t.file("afile", "x\n")
    return Bad(_publish(f), light=True, absent=(_preview(f),))


@case("publish-bad-repo-id")
def _(t: Ctx) -> Bad:
    out = hostile.fake_quantkit_output(TINY / "target", t.tmp / "out")
    t.copies.append(out)
    return Bad(_publish(out, repo_id="not a repo id"), light=True, absent=(_preview(out),), mentions=("not a repo id",))


@case("publish-repo-id-path-traversal")
def _(t: Ctx) -> Bad:
    out = hostile.fake_quantkit_output(TINY / "target", t.tmp / "out")
    t.copies.append(out)
    return Bad(_publish(out, repo_id="../../etc"), light=True, absent=(_preview(out),))


@case("publish-report-deep-nesting")
def _(t: Ctx) -> Bad:
    out = hostile.fake_quantkit_output(TINY / "target", t.tmp / "out")
    t.copies.append(out)
    rep = t.file("report.json", hostile.nested_json())
    return Bad(
        _publish(out, "--report", str(rep)),
        light=True,
        absent=(_preview(out),),
        mentions=("report.json",),
        max_chars=500,
    )


@case("publish-report-not-json")
def _(t: Ctx) -> Bad:
    out = hostile.fake_quantkit_output(TINY / "target", t.tmp / "out")
    t.copies.append(out)
    rep = t.file("report.json", "{not json")
    return Bad(_publish(out, "--report", str(rep)), light=True, absent=(_preview(out),), mentions=("report.json",))


@case("publish-report-is-a-folder")
def _(t: Ctx) -> Bad:
    out = hostile.fake_quantkit_output(TINY / "target", t.tmp / "out")
    t.copies.append(out)
    d = t.tmp / "report.d"
    d.mkdir()
    return Bad(_publish(out, "--report", str(d)), kind="either", light=True, absent=(_preview(out),))


@case("publish-manifest-deep-nesting")
def _(t: Ctx) -> Bad:
    out = hostile.fake_quantkit_output(TINY / "target", t.tmp / "out")
    (out / "quantkit.json").write_text(hostile.nested_json())
    t.copies.append(out)
    return Bad(_publish(out), light=True, absent=(_preview(out),), mentions=("quantkit.json",), max_chars=500)


# --- demo ---------------------------------------------------------------------------------------------------------


@case("demo-workdir-parent-is-a-file")
def _(t: Ctx) -> Bad:
    f = t.file("afile", "x\n")
    return Bad(["demo", "--workdir", str(f / "work")], light=True, watch=(f,), mentions=(str(f),))


@case("demo-workdir-parent-read-only")
def _(t: Ctx) -> Bad:
    ro = t.read_only_dir()
    return Bad(["demo", "--workdir", str(ro / "work")], light=True, absent=(ro / "work",), mentions=(str(ro),))


@case("demo-workdir-is-a-file")
def _(t: Ctx) -> Bad:
    f = t.file("afile", "x\n")
    return Bad(["demo", "--workdir", str(f)], kind="either", light=True, watch=(f,))


@case("demo-unknown-option")
def _(t: Ctx) -> Bad:
    return _usage(["demo", "--fast"])


# --- the contract -------------------------------------------------------------------------------------------------


def _leftover_temp_folders(path: Path) -> list[Path]:
    """Hidden temporary folders beside `path` that hold no journal (so cannot be resumed)."""
    if not path.parent.is_dir():
        return []
    found = []
    for p in path.parent.glob(f".{path.name}.quantkit-*"):
        if not (p.is_dir() and any("journal" in q.name for q in p.iterdir())):
            found.append(p)
    return found


def _assert_contract(bad: Bad, run: Run, before: dict[Path, dict[str, str]]) -> None:
    shown = " ".join(run.args)
    where = (
        f"\n$ quantkit {shown[:400]}\nexit {run.returncode} after {run.seconds:.1f}s\n"
        f"stderr: {run.stderr[-3000:]!r}\nstdout: {run.stdout[-1000:]!r}"
    )
    assert run.returncode != FORBIDDEN_HEAVY_EXIT, "imported a heavy package before finding the error" + where
    assert "Traceback" not in run.stderr, where
    assert run.returncode == bad.code, where
    prefixes = {"error": ("error:",), "usage": ("Error:",), "either": ("error:", "Error:")}[bad.kind]
    lines = [line for p in prefixes for line in error_lines(run.stderr, p)]
    assert len(lines) == 1, f"expected exactly one {' or '.join(prefixes)} line" + where
    line = lines[0]
    if bad.light and line.startswith("error:"):
        assert run.stderr == line + "\n", "an error found before any work is all there is on stderr" + where
        assert run.stdout == "", where
    for text in bad.mentions:
        assert text in line, f"the error line should mention {text!r}" + where
    if bad.max_chars is not None:
        assert len(line) < bad.max_chars, f"error line of {len(line)} characters" + where[:2000]
    if bad.max_seconds is not None:
        assert run.seconds < bad.max_seconds, where
    for p in bad.absent:
        assert not p.exists() and not p.is_symlink(), f"{p} exists afterwards" + where
    for p in [*bad.absent, *bad.watch]:
        assert not _leftover_temp_folders(p), f"temporary folders left: {_leftover_temp_folders(p)}" + where
    for m in bad.markers:
        assert not m.exists(), f"hostile code ran: {m} was written" + where
    for p, digest in before.items():
        assert tree_digest(p) == digest, f"{p} changed" + where


@pytest.mark.parametrize("name", [pytest.param(n, marks=marks, id=n) for n, (_, marks) in CASES.items()])
def test_bad_input(name: str, tmp_path: Path) -> None:
    build, _ = CASES[name]
    ctx = Ctx(tmp_path)
    try:
        bad = build(ctx)
        watched = [TINY, *ctx.copies, *bad.watch]
        before = {p: tree_digest(p) for p in watched}
        run = run_cli(
            bad.args,
            cwd=tmp_path,
            stdin=bad.stdin,
            env=bad.env,
            forbid_heavy=bad.light,
            timeout=bad.timeout,
            preexec_fn=bad.preexec_fn,
        )
        _assert_contract(bad, run, before)
    finally:
        ctx.cleanup()


def test_the_table_is_big_enough_and_covers_every_command() -> None:
    assert len(CASES) >= 60
    commands = {n.split("-")[0] for n in CASES}
    assert {"recipes", "apply", "inspect", "check", "acceptance", "eval", "gate", "publish", "demo"} <= commands


# --- beyond the table: checks on good runs, signals, JSON output, the gate's verdict ------------------------------


def _no_constants(name: str) -> Any:
    raise AssertionError(f"JSON output holds {name}")


def test_check_only_gate_over_an_unquantized_candidate_fails(tmp_path: Path) -> None:
    """Issue 10 (9): a gate whose only step is check must not pass a BF16 checkpoint as a quantized candidate."""
    cfg = tmp_path / "gate.yaml"
    cfg.write_text(GATE_OK)
    run = run_cli(["gate", str(cfg), "--out", str(tmp_path / "out"), "--json"], cwd=tmp_path)
    where = f"\nexit {run.returncode}\nstderr: {run.stderr[-3000:]}"
    assert run.returncode == 1, where
    assert "Traceback" not in run.stderr, where
    assert any(line.startswith("gate failed:") for line in run.stderr.splitlines()), where
    json.loads(run.stdout, parse_constant=_no_constants)


@pytest.fixture(scope="session")
def applied_draft(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Run]:
    """fp8-draft applied through the CLI under umask 022, into an empty folder that exists already."""
    root = tmp_path_factory.mktemp("bad-inputs-apply")
    out = root / "draft-fp8"
    out.mkdir()
    run = run_cli(
        [
            "apply",
            "--recipe",
            "fp8-draft",
            "--model",
            str(TINY / "eagle3-draft"),
            "--target",
            str(TINY / "target"),
            "--output",
            str(out),
            "--overwrite",
            "--json",
        ],
        cwd=root,
        preexec_fn=lambda: os.umask(0o022),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    return out, run


def test_apply_into_an_empty_folder_writes_files_others_can_read(applied_draft: tuple[Path, Run]) -> None:
    """Issue 10 (1) an empty existing output folder is fine; (3) outputs are 0644 / 0755 under umask 022."""
    out, run = applied_draft
    json.loads(run.stdout, parse_constant=_no_constants)
    modes = {str(p.relative_to(out)) or ".": oct(p.stat().st_mode & 0o777) for p in [out, *out.rglob("*")]}
    want = {k: oct(0o755) if (out / k).is_dir() else oct(0o644) for k in modes}
    assert modes == want
    assert not list(out.parent.glob(".draft-fp8.quantkit-*"))


def test_json_output_never_holds_nan_or_infinity(applied_draft: tuple[Path, Run], tmp_path: Path) -> None:
    """Issue 10 (6): `check --json` and `inspect --json` of a checkpoint whose scales are inf / nan stay JSON."""
    out, _ = applied_draft
    damaged = tmp_path / "damaged"
    hostile.copy_model(out, damaged)
    header, _ = hostile.read_header(damaged / "model.safetensors")
    scales = sorted(n for n in header if n.endswith("weight_scale"))
    assert len(scales) >= 2, scales
    hostile.poison_f32_or_bf16_scalar(damaged / "model.safetensors", scales[0], float("inf"))
    hostile.poison_f32_or_bf16_scalar(damaged / "model.safetensors", scales[1], float("nan"))
    check = run_cli(["check", str(damaged), "--target", str(TINY / "target"), "--vllm", "off", "--json"], cwd=tmp_path)
    assert check.returncode == 1, check.stderr[-3000:]
    found = json.loads(check.stdout, parse_constant=_no_constants)
    assert any(f["code"] == "scale-not-finite" for f in found["findings"]), found["findings"]
    inspect = run_cli(["inspect", str(damaged), "--json"], cwd=tmp_path)
    assert inspect.returncode == 0, inspect.stderr[-3000:]
    json.loads(inspect.stdout, parse_constant=_no_constants)


def test_eval_json_never_holds_nan_when_the_baseline_scores_zero(tmp_path: Path) -> None:
    """Issue 10 (6): recovery = candidate / baseline is undefined at a zero baseline; the JSON must say so without
    NaN. moe-target scores 0.007 on tiny_json_gen, so its first 3 items score 0."""
    moe = TINY / "moe-target"
    run = run_cli(
        ["eval", "--model", str(moe), "--baseline", str(moe), "--tasks", "tiny_json_gen", "--limit", "3", "--json"],
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(run.stdout, parse_constant=_no_constants)
    assert data["tasks"] and all(t["baseline"] == 0 for t in data["tasks"]), data["tasks"]


def _run_and_signal(args: list[str], cwd: Path, sig: int, when: Callable[[str, float], bool]) -> tuple[Run, bool]:
    """Start `quantkit ARGS`, send `sig` once `when(stderr so far, seconds)` holds; (run, whether it was sent)."""
    env = {**os.environ, "QUARK_DISABLE_COMPILE": "1"}
    env.pop("QUANTKIT_DEBUG", None)
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "quantkit", *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # SIGINT as a user's terminal delivers it: a suite started in the background (`cmd &`) has SIGINT ignored,
        # and the child would inherit that and never see the signal
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    err: list[str] = []
    reader = threading.Thread(
        target=lambda: err.extend(iter(lambda: proc.stderr.readline().decode(errors="replace"), "")), daemon=True
    )
    reader.start()
    sent = False
    while proc.poll() is None and time.perf_counter() - t0 < 300:
        if when("".join(err), time.perf_counter() - t0):
            proc.send_signal(sig)
            sent = True
            break
        time.sleep(0.05)
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise AssertionError(f"quantkit {' '.join(args)} did not stop within 120 s of signal {sig}") from None
    reader.join(10)  # the reader alone reads stderr (communicate() here would race it for the last lines)
    out = proc.stdout.read() if proc.stdout else b""
    return Run(args, proc.returncode, out.decode(errors="replace"), "".join(err), time.perf_counter() - t0), sent


def _in_quark_work(stderr: str, _seconds: float) -> bool:
    # apply's progress lines after Quark is imported: the transformers load, then quantization and export.
    return bool(re.search(r"loading the model|quantizing with Quark", stderr))


def _during_import(_stderr: str, seconds: float) -> bool:
    return seconds > 3.0  # torch and Quark take 20-30 s to import; planning before it takes under a second


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("phase", ["import", "quantize"])
def test_signal_during_apply(sig: int, phase: str, tmp_path: Path) -> None:
    """Issue 10 (8): an interrupted apply leaves no output folder, prints one `error:` line, exits 128 + signal."""
    src = tmp_path / "src"
    if phase == "quantize":
        # Large enough (about 25 MB in 24 shards) that Quark is still working when the signal lands: the bundled
        # 6 MB model is done within a second of the "quantizing" line on a quiet machine.
        from tests.fixtures import checkpoints as ck

        ck.make("qwen3_moe", src, layers=6, experts=16, hidden=256, inter=256, vocab=1024, shard_bytes=1_500_000)
    else:
        hostile.copy_model(TINY / "moe-target", src)
    before = tree_digest(src)
    out = tmp_path / "out"
    # Quark's engine: its import and run take long enough to be interrupted in each phase (quantkit's own shard
    # executor finishes this model in about a second; its interrupts are tested in test_apply_resume.py).
    run, sent = _run_and_signal(
        ["apply", "--recipe", "mxfp4-moe", "--model", str(src), "--output", str(out), "--engine", "quark"],
        tmp_path,
        sig,
        _during_import if phase == "import" else _in_quark_work,
    )
    where = f"\nexit {run.returncode}\nstderr: {run.stderr[-3000:]!r}"
    assert sent, "the run ended before the signal could be sent" + where
    assert run.returncode == 128 + sig, where
    assert "Traceback" not in run.stderr, where
    assert len(error_lines(run.stderr)) == 1, where
    assert not out.exists(), where
    assert not _leftover_temp_folders(out), where
    assert tree_digest(src) == before
