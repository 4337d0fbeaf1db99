"""Issue 18 (hangs and crashes, items 12-14, and two cases that said too little): typed inputs and sequence lengths.

The table cases run the real CLI in a subprocess and assert test_bad_inputs.py's contract (`_assert_contract`): exit
status 2, exactly one `error:` line, no traceback, no output that looks complete, every input byte for byte unchanged,
and for `light` cases nothing heavy (torch, Quark, transformers, vLLM, lm-eval) imported before the error. They cover
one class each, with variants:

- a sequence longer than the target holds (item 12): `--context-lengths`, `--max-new-tokens`, a long prompt, the
  gate's acceptance and serve budgets; the limit is the one vLLM derives (checked against vLLM's own
  `_get_and_verify_max_len` below; `deploy --max-model-len` beyond it is an error finding, tested below);
- a document that Python's parsers choke on (item 13): a 5,000-digit integer in config.json, a header, the index, a
  prompts file, a recipe, a gate config and a `--report`; NaN where JSON or safetensors forbid it;
- a document of the wrong shape (item 13): every parsed document is validated against a typed schema at the boundary
  (config.json's keys, the index, headers, fp8 / compressed-tensors quantization configs, prompts, recipes, gate
  configs, reports), so a float for an int, a list for an object, null, a boolean for a number or a 10 MB string is a
  one-line error naming the file and the field;
- options (item 13): `--devices cuda:²`, a gate candidate named `../x`;
- what said too little: a keep or override pattern that matches nothing, a Kimi-K2.5 config without text_config.

Beyond the table: `deploy --out` into a missing folder works; GITHUB_STEP_SUMMARY pointing at a folder costs one
warning line, not the verdict; junit.xml parses whatever the names and messages hold (item 14).
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import TINY, require_vllm
from tests.e2e.test_bad_inputs import GATE_OK, RECIPE_OK, Bad, Ctx, _acceptance, _assert_contract, _preview, _publish
from tests.fixtures import hostile
from tests.fixtures.hostile import error_lines, run_cli, tree_digest

BIG = "9" * 5000  # past Python's int-digit limit (sys.get_int_max_str_digits() == 4300)
TEN_MB = "x" * 10_000_000
LIMIT = 4096  # max_position_embeddings of the bundled tiny models

CASES: dict[str, tuple[Callable[[Ctx], Bad], tuple[Any, ...]]] = {}


def case(name: str, *marks: Any) -> Callable[[Callable[[Ctx], Bad]], Callable[[Ctx], Bad]]:
    def register(fn: Callable[[Ctx], Bad]) -> Callable[[Ctx], Bad]:
        assert name not in CASES, name
        CASES[name] = (fn, marks)
        return fn

    return register


def _cases(prefix: str, variants: dict[str, Any], build: Callable[[Ctx, Any], Bad], *marks: Any) -> None:
    """One table case per variant: `<prefix>-<variant>`."""
    for label, value in variants.items():
        case(f"{prefix}-{label}", *marks)(lambda t, value=value: build(t, value))


def _edit_json(path: Path, edit: Callable[[dict[str, Any]], Any], *, raw: dict[str, str] | None = None) -> None:
    """Apply `edit` to a JSON file; `raw` replaces quoted placeholders by raw JSON text (numbers Python cannot dump)."""
    data = json.loads(path.read_text())
    edit(data)
    text = json.dumps(data)
    for placeholder, literal in (raw or {}).items():
        text = text.replace(json.dumps(placeholder), literal)
    path.write_text(text)


def _set(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    for p in parents:
        data = data[p]
    data[last] = value


# --- item 12: sequences longer than the target holds ----------------------------------------------------------


@case("acceptance-context-length-1000000-on-a-4096-position-target")
def _(t: Ctx) -> Bad:
    # Ran past 240 s before: the preamble grew one note at a time towards a million tokens.
    return Bad(
        _acceptance(t, "--context-lengths", "256,1000000"),
        light=True,
        max_seconds=30,
        timeout=120,
        mentions=("--context-lengths 1000000", f"{LIMIT} positions", "max_position_embeddings"),
    )


@case("acceptance-context-length-one-past-the-limit")
def _(t: Ctx) -> Bad:
    # 4028 + 2 new + 3 speculative = 4033 fits; 4092 + 2 + 3 = 4097 does not
    return Bad(
        _acceptance(t, "--context-lengths", "4028,4092"),
        light=True,
        mentions=("--context-lengths 4092", "use lengths up to 4091"),
    )


@case("acceptance-max-new-tokens-beyond-the-target")
def _(t: Ctx) -> Bad:
    return Bad(
        [*_acceptance(t), "--max-new-tokens", "5000"],
        light=True,
        mentions=("--max-new-tokens 5000", f"{LIMIT} positions", "use --max-new-tokens 4092 or less"),
    )


@case("acceptance-candidate-target-holds-fewer-positions")
def _(t: Ctx) -> Bad:
    short = t.model("target", "short-target")
    _edit_json(short / "config.json", lambda c: c.update(max_position_embeddings=64))
    return Bad(
        [*_acceptance(t, "--candidate-target", str(short)), "--max-new-tokens", "100"],
        light=True,
        mentions=("short-target", "64 positions"),
    )


@case("acceptance-rope-scaled-target-still-has-a-limit")
def _(t: Ctx) -> Bad:
    # linear RoPE scaling x2: vLLM derives 8192 positions, so 8192 + new tokens no longer fits
    tgt = t.model("target", "tgt")
    _edit_json(
        tgt / "config.json",
        lambda c: c.update(rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}),
    )
    return Bad(
        _acceptance(t, "--context-lengths", "8192", target=tgt),
        light=True,
        mentions=("8192 positions", "rope factor 2", "use lengths up to 8187"),
    )


@case("acceptance-prompt-longer-than-the-target")
def _(t: Ctx) -> Bad:
    long = t.file("long.jsonl", json.dumps({"id": "essay", "prompt": "The capital of France is Paris. " * 800}) + "\n")
    # found once tokenized, so transformers is imported: not light, but still before any model loads
    return Bad(_acceptance(t, prompts=long), mentions=("'essay'", "tokens", f"{LIMIT} positions"))


def _gate_lengths(t: Ctx, steps: str, section: str) -> Bad:
    out = t.tmp / "gate-out"
    cfg = t.file("gate.yaml", GATE_OK.replace("steps: [check]", steps) + section)
    return Bad(["gate", str(cfg), "--out", str(out)], light=True, absent=(out,), mentions=("gate.yaml", "positions"))


@case("gate-acceptance-max-new-tokens-beyond-the-target")
def _(t: Ctx) -> Bad:
    return _gate_lengths(t, "steps: [check, acceptance]", "acceptance: {max_new_tokens: 5000}\n")


@case("gate-serve-max-new-tokens-beyond-the-target")
def _(t: Ctx) -> Bad:
    return _gate_lengths(t, "steps: [check, serve]", "serve: {max_new_tokens: 4094}\n")


# --- item 13: documents Python's parsers choke on -------------------------------------------------------------


@case("inspect-config-5000-digit-integer")
def _(t: Ctx) -> Bad:
    src = t.model("target", "src")
    _edit_json(src / "config.json", lambda c: c.update(bos_token_id="BIG"), raw={"BIG": BIG})
    return Bad(["inspect", str(src)], light=True, mentions=("config.json", "5000 digits"), max_chars=400)


@case("inspect-config-5000-digit-negative-integer-deep-inside")
def _(t: Ctx) -> Bad:
    src = t.model("target", "src")
    _edit_json(src / "config.json", lambda c: c.update(extra={"a": [{"b": "BIG"}]}), raw={"BIG": "-" + BIG})
    return Bad(["inspect", str(src)], light=True, mentions=("config.json", "5000 digits"), max_chars=400)


@case("inspect-header-5000-digit-integer")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    header, data = hostile.read_header(src / "model.safetensors")
    header["fc.weight"]["shape"][0] = "BIG"
    raw = json.dumps(header, separators=(",", ":")).replace('"BIG"', BIG).encode()
    hostile.write_safetensors(src / "model.safetensors", raw, data)
    return Bad(["inspect", str(src)], light=True, mentions=("model.safetensors", "5000 digits"), max_chars=400)


@case("check-header-nan-offset")
def _(t: Ctx) -> Bad:
    # safetensors parses headers with serde_json, which refuses NaN: so does quantkit
    src = t.model("eagle3-draft", "src")
    header, data = hostile.read_header(src / "model.safetensors")
    header["fc.weight"]["data_offsets"][0] = "NAN"
    raw = json.dumps(header, separators=(",", ":")).replace('"NAN"', "NaN").encode()
    hostile.write_safetensors(src / "model.safetensors", raw, data)
    return Bad(["check", str(src), "--vllm", "off"], light=True, mentions=("model.safetensors", "NaN"))


@case("inspect-index-5000-digit-integer")
def _(t: Ctx) -> Bad:
    src = t.model("moe-target", "src")
    _edit_json(src / "model.safetensors.index.json", lambda c: c["metadata"].update(total_size="BIG"), raw={"BIG": BIG})
    return Bad(["inspect", str(src)], light=True, mentions=("model.safetensors.index.json", "5000 digits"))


@case("acceptance-prompts-5000-digit-integer")
def _(t: Ctx) -> Bad:
    p = t.file("prompts.jsonl", '{"prompt": "hi", "id": ' + BIG + "}\n")
    return Bad(_acceptance(t, prompts=p), light=True, mentions=("prompts.jsonl:1", "5000 digits"))


@case("recipes-show-5000-digit-integer")
def _(t: Ctx) -> Bad:
    f = t.file("r.yaml", RECIPE_OK.replace("calibration: none", f"calibration: {{samples: {BIG}, seq_len: 512}}"))
    return Bad(["recipes", "show", str(f)], light=True, mentions=("r.yaml", "5000 digits"), max_chars=400)


@case("recipes-show-5000-digit-hexadecimal-integer")
def _(t: Ctx) -> Bad:
    # int() has no digit limit in base 16, but printing the value in decimal would
    f = t.file(
        "r.yaml", RECIPE_OK.replace("calibration: none", f"calibration: {{samples: 0x{'f' * 5000}, seq_len: 512}}")
    )
    return Bad(["recipes", "show", str(f)], light=True, mentions=("r.yaml", "digits"), max_chars=400)


@case("recipes-show-impossible-date")
def _(t: Ctx) -> Bad:
    # YAML reads 2024-13-45 as a timestamp: PyYAML's constructor raises a bare ValueError
    f = t.file("r.yaml", RECIPE_OK.replace("calibration: none", "calibration: {samples: 2024-13-45, seq_len: 512}"))
    return Bad(["recipes", "show", str(f)], light=True, mentions=("r.yaml", "line 12"))


@case("gate-config-5000-digit-integer")
def _(t: Ctx) -> Bad:
    out = t.tmp / "gate-out"
    cfg = t.file("gate.yaml", GATE_OK.replace('  vllm: "off"', f'  vllm: "off"\n  tp: {BIG}'))
    return Bad(
        ["gate", str(cfg), "--out", str(out)],
        light=True,
        absent=(out,),
        mentions=("gate.yaml", "5000 digits"),
        max_chars=400,
    )


def _report_case(t: Ctx, text: str, *mentions: str) -> Bad:
    out = hostile.fake_quantkit_output(TINY / "target", t.tmp / "out")
    t.copies.append(out)
    rep = t.file("report.json", text)
    return Bad(
        _publish(out, "--report", str(rep)),
        light=True,
        absent=(_preview(out),),
        mentions=("report.json", *mentions),
        max_chars=500,
    )


@case("publish-report-5000-digit-integer")
def _(t: Ctx) -> Bad:
    return _report_case(t, '{"schema_version": 1, "eval": {"limit": ' + BIG + "}}", "5000 digits")


# --- item 13: documents of the wrong shape ----------------------------------------------------------------------


def _config_case(
    t: Ctx, edit: tuple[str, Any], model: str = "target", command: str = "inspect", mentions: tuple[str, ...] = ()
) -> Bad:
    key, value = edit
    src = t.model(model, "src")
    _edit_json(src / "config.json", lambda c: _set(c, key, value), raw={"NAN": "NaN", "INF": "Infinity"})
    args = {
        "inspect": ["inspect", str(src)],
        "check": ["check", str(src), "--vllm", "off"],
        "apply": [
            "apply",
            "--recipe",
            "fp8-target",
            "--model",
            str(src),
            "--output",
            str(t.tmp / "out"),
            "--dry-run",
            "--devices",
            "cpu",
        ],
        "deploy": ["deploy", str(src), "--out", str(t.tmp / "deploy-out")],
    }[command]
    return Bad(
        args,
        light=True,
        absent=(t.tmp / "out", t.tmp / "deploy-out"),
        max_chars=700,
        mentions=("config.json", key.split(".")[-1], *mentions),
    )


# A wrong type for a key quantkit reads, for each command that reads it.
CONFIG_TYPES = {
    "num-hidden-layers-a-string": ("num_hidden_layers", "4"),
    "num-hidden-layers-a-float": ("num_hidden_layers", 4.0),
    "num-hidden-layers-a-boolean": ("num_hidden_layers", True),
    "num-hidden-layers-negative": ("num_hidden_layers", -4),
    "num-hidden-layers-nan": ("num_hidden_layers", "NAN"),
    "hidden-size-a-list": ("hidden_size", [256]),
    "vocab-size-an-object": ("vocab_size", {"n": 1}),
    "architectures-a-string": ("architectures", "LlamaForCausalLM"),
    "architectures-holds-a-number": ("architectures", [1]),
    "max-position-embeddings-infinity": ("max_position_embeddings", "INF"),
    "max-position-embeddings-zero": ("max_position_embeddings", 0),
    "tie-word-embeddings-a-string": ("tie_word_embeddings", "yes"),
    "rope-parameters-a-list": ("rope_parameters", [10000.0]),
    "text-config-a-list": ("text_config", [1, 2]),
    "text-config-with-a-string-layer-count": ("text_config", {"num_hidden_layers": "4"}),
    "quantization-config-a-string": ("quantization_config", "fp8"),
}
for _command in ("inspect", "check", "apply", "deploy"):
    _cases(f"{_command}-config", CONFIG_TYPES, lambda t, e, c=_command: _config_case(t, e, command=c))

DRAFT_CONFIG_TYPES = {
    "aux-layer-ids-strings": ("eagle_aux_hidden_state_layer_ids", ["1", "2", "3"]),
    "eagle-config-a-string": ("eagle_config", "eagle3"),
    "nested-aux-layer-ids-null-entry": ("eagle_config.eagle_aux_hidden_state_layer_ids", [1, None, 3]),
    "draft-vocab-size-a-float": ("draft_vocab_size", 256.0),
}
_cases("inspect-draft-config", DRAFT_CONFIG_TYPES, lambda t, e: _config_case(t, e, model="eagle3-draft"))


@case("inspect-config-10mb-architecture-name")
def _(t: Ctx) -> Bad:
    src = t.model("target", "src")
    _edit_json(src / "config.json", lambda c: c.update(architectures=[TEN_MB]))
    return Bad(["inspect", str(src)], light=True, max_chars=800, max_seconds=20)


@case("inspect-config-text-config-nested-300-deep")
def _(t: Ctx) -> Bad:
    src = t.model("target", "src")
    nested: dict[str, Any] = {}
    inner = nested
    for _ in range(300):
        inner["text_config"] = {}
        inner = inner["text_config"]
    _edit_json(src / "config.json", lambda c: c.update(nested))
    return Bad(["inspect", str(src)], light=True, max_chars=500, mentions=("config.json", "levels"))


def _index_case(t: Ctx, weight_map_edit: Callable[[dict[str, Any]], Any], *mentions: str) -> Bad:
    src = t.model("moe-target", "src")
    _edit_json(src / "model.safetensors.index.json", lambda c: weight_map_edit(c))
    return Bad(["inspect", str(src)], light=True, mentions=("model.safetensors.index.json", *mentions), max_chars=500)


INDEX_SHAPES: dict[str, tuple[Callable[[dict[str, Any]], Any], tuple[str, ...]]] = {
    "weight-map-a-list": (lambda c: c.update(weight_map=list(c["weight_map"])), ("weight_map",)),
    "shard-name-a-number": (lambda c: c["weight_map"].update({"lm_head.weight": 5}), ("lm_head.weight",)),
    "shard-name-null": (lambda c: c["weight_map"].update({"lm_head.weight": None}), ("lm_head.weight",)),
    "shard-name-outside-the-folder": (
        lambda c: c["weight_map"].update({"lm_head.weight": "../x.safetensors"}),
        ("../x.safetensors",),
    ),
    "shard-name-absolute": (
        lambda c: c["weight_map"].update({"lm_head.weight": "/etc/model.safetensors"}),
        ("/etc/model.safetensors",),
    ),
    "shard-name-not-safetensors": (
        lambda c: c["weight_map"].update({"lm_head.weight": "config.json"}),
        ("config.json",),
    ),
}
_cases("inspect-index", INDEX_SHAPES, lambda t, v: _index_case(t, v[0], *v[1]))


def _header_case(t: Ctx, edit: Callable[[dict[str, Any]], Any]) -> Bad:
    src = t.model("eagle3-draft", "src")
    header, data = hostile.read_header(src / "model.safetensors")
    edit(header)
    hostile.write_safetensors(src / "model.safetensors", header, data)
    return Bad(["inspect", str(src)], light=True, mentions=("model.safetensors",))


HEADER_SHAPES = {
    "shape-holds-a-boolean": lambda h: h["fc.weight"].update(shape=[True, *h["fc.weight"]["shape"][1:]]),
    "offsets-floats": lambda h: h["fc.weight"].update(data_offsets=[float(x) for x in h["fc.weight"]["data_offsets"]]),
    "metadata-value-a-number": lambda h: h.update(__metadata__={"format": 1}),
    "entry-a-list": lambda h: h.update({"fc.weight": [1, 2]}),
}
_cases("inspect-header", HEADER_SHAPES, _header_case)


def _source_case(t: Ctx, qcfg: dict[str, Any], *mentions: str) -> Bad:
    # The typed check comes before the tensors are compared with the config, so a BF16 copy of the target serves.
    src = t.model("target", "src")
    _edit_json(src / "config.json", lambda c: c.update(quantization_config=qcfg))
    return Bad(
        ["apply", "--recipe", "fp8-target", "--model", str(src), "--output", str(t.tmp / "out"), "--devices", "cpu"],
        light=True,
        absent=(t.tmp / "out",),
        mentions=("config.json", *mentions),
    )


FP8 = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
CT_WEIGHTS = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}
CT = {
    "quant_method": "compressed-tensors",
    "format": "pack-quantized",
    "config_groups": {"group_0": {"targets": ["Linear"], "weights": CT_WEIGHTS}},
    "ignore": ["lm_head"],
}
SOURCE_CONFIGS = {
    "fp8-ignored-layers-7": ({**FP8, "ignored_layers": 7}, ("quantization_config.ignored_layers",)),
    "fp8-modules-to-not-convert-a-string": ({**FP8, "modules_to_not_convert": "lm_head"}, ("modules_to_not_convert",)),
    "fp8-block-size-strings": ({**FP8, "weight_block_size": ["128", "128"]}, ("weight_block_size[0]",)),
    "ct-ignore-5": ({**CT, "ignore": 5}, ("quantization_config.ignore",)),
    "ct-a-string-in-config-groups": ({**CT, "config_groups": {"group_0": "int4"}}, ("config_groups.group_0",)),
    "ct-config-groups-a-list": ({**CT, "config_groups": [CT["config_groups"]["group_0"]]}, ("config_groups",)),
    # "false" is truthy: read as a flag it would decode asymmetric INT4 as symmetric
    "ct-symmetric-the-string-false": (
        {**CT, "config_groups": {"group_0": {"weights": {**CT_WEIGHTS, "symmetric": "false"}}}},
        ("symmetric",),
    ),
    "ct-num-bits-null-group-size-a-float": (
        {**CT, "config_groups": {"group_0": {"weights": {**CT_WEIGHTS, "group_size": 32.0}}}},
        ("group_size",),
    ),
}
_cases("apply-source", SOURCE_CONFIGS, lambda t, v: _source_case(t, v[0], *v[1]))


def _prompts_case(t: Ctx, record: Any, *mentions: str) -> Bad:
    p = t.file("prompts.jsonl", json.dumps(record) + "\n")
    return Bad(_acceptance(t, prompts=p), light=True, mentions=("prompts.jsonl:1", *mentions), max_chars=600)


PROMPT_SHAPES = {
    "id-a-boolean": ({"prompt": "hi", "id": True}, ("id",)),
    "domain-a-list": ({"prompt": "hi", "domain": ["a"]}, ("domain",)),
    "messages-empty": ({"messages": []}, ("messages",)),
    "messages-an-object": ({"messages": {"role": "user", "content": "hi"}}, ("messages",)),
    "role-null": ({"messages": [{"role": None, "content": "hi"}]}, ("messages[0].role",)),
    "both-prompt-and-messages": ({"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}, ("exactly one",)),
    "a-json-list": ([{"prompt": "hi"}], ("not an object",)),
    "prompt-a-number": ({"prompt": 5}, ("prompt",)),
}
_cases("acceptance-prompts", PROMPT_SHAPES, lambda t, v: _prompts_case(t, v[0], *v[1]))


RECIPE_SHAPES = {
    "keep-a-number": RECIPE_OK.replace("keep:\n  - role: fc", "keep: 5\nx:\n  - role: fc"),
    "name-a-boolean": RECIPE_OK.replace("name: fp8-draft-copy", "name: true"),
    "quantize-an-object": RECIPE_OK.replace("quantize: [decoder_linears]", "quantize: {decoder_linears: 1}"),
    "keep-entry-null": RECIPE_OK.replace("keep:\n  - role: fc", "keep:\n  - null\n  - role: fc"),
    "calibration-samples-a-float": RECIPE_OK.replace("calibration: none", "calibration: {samples: 1.5, seq_len: 4}"),
    "reason-10mb": RECIPE_OK
    + "overrides:\n  - role: decoder_linears\n    scheme: 7\n    reason: "
    + "y" * 10_000_000
    + "\n",
}
_cases(
    "recipes-show",
    RECIPE_SHAPES,
    lambda t, text: Bad(
        ["recipes", "show", str(t.file("r.yaml", text))],
        light=True,
        mentions=("r.yaml",),
        max_chars=700,
        max_seconds=60,
    ),
)


def _gate_case(t: Ctx, text: str, *mentions: str) -> Bad:
    out = t.tmp / "gate-out"
    cfg = t.file("gate.yaml", text)
    return Bad(
        ["gate", str(cfg), "--out", str(out)],
        light=True,
        absent=(out,),
        mentions=("gate.yaml", *mentions),
        max_chars=700,
    )


GATE_SHAPES = {
    "tp-a-boolean": (GATE_OK.replace('  vllm: "off"', '  vllm: "off"\n  tp: true'), ("check.tp",)),
    "candidates-an-object": (GATE_OK.replace("  - name: c\n    path:", "  name: c\n  path:"), ("candidates",)),
    "batch-sizes-floats": (GATE_OK + "serve: {batch_sizes: [1.5]}\n", ("serve.batch_sizes",)),
    "target-null": (GATE_OK.replace(f"target: {TINY / 'target'}", "target: null"), ("target",)),
    "path-10mb": (GATE_OK.replace(f"    path: {TINY / 'eagle3-draft'}", "    path: " + TEN_MB), ("path",)),
    "prompts-missing": (GATE_OK + "acceptance: {prompts: no-such-prompts.jsonl}\n", ("acceptance.prompts",)),
}
_cases("gate-config", GATE_SHAPES, lambda t, v: _gate_case(t, v[0], *v[1]))

# A candidate's name becomes file names, JUnit classnames and Markdown: a plain file-name component or nothing.
CANDIDATE_NAMES = {
    "parent-folder": "../x",
    "path": "a/b",
    "absolute": "/tmp/x",
    "hidden": ".x",
    "empty": "",
    "control-characters": "c\x1b[31mred",
    "nul": "c\x00d",
    "newline": "c\nd",
    "65-characters": "c" * 65,
    "non-ascii": "caf\u00e9",
    "10mb": TEN_MB,
}
_cases(
    "gate-candidate-named",
    CANDIDATE_NAMES,
    lambda t, name: _gate_case(t, GATE_OK.replace("  - name: c", f"  - name: {json.dumps(name)}"), "candidates.0.name"),
)


@case("gate-name-with-control-characters")
def _(t: Ctx) -> Bad:
    return _gate_case(t, GATE_OK.replace("name: g", 'name: "g\\u0007\\u0000"'), "name")


REPORT_SHAPES = {
    # a whole-gate report whose candidates' `model` is not a path: this picked the candidate with Path(5)
    "candidate-model-a-number": (
        json.dumps({"schema_version": 1, "candidates": {"a": {"model": 5}, "b": {"model": 6}}}),
        ("candidates",),
    ),
    "candidate-model-with-a-nul-byte": (
        json.dumps({"schema_version": 1, "candidates": {"a": {"model": "x\x00y"}, "b": {"model": "z"}}}),
        ("candidates",),
    ),
    "schema-version-a-boolean": (json.dumps({"schema_version": True}), ("schema_version",)),
    "num-items-nan": (
        '{"schema_version": 1, "eval": {"tasks": [{"task": "t", "metric": "m", "num_items": NaN}]}}',
        ("eval.tasks.0.num_items",),
    ),
    "acceptance-a-list": (json.dumps({"schema_version": 1, "acceptance": [1]}), ("acceptance",)),
}
_cases("publish-report", REPORT_SHAPES, lambda t, v: _report_case(t, v[0], *v[1]))


# --- item 13: options ---------------------------------------------------------------------------------------------

DEVICES = {
    "superscript-two": "cuda:\u00b2",
    "arabic-indic-three": "cuda:\u0663",
    "fullwidth-one": "cuda:\uff11",
    "negative": "cuda:-1",
    "huge": "cuda:" + "9" * 5000,
    "trailing-comma-garbage": "cpu,cuda:0x",
}
_cases(
    "apply-devices",
    DEVICES,
    lambda t, d: Bad(
        [
            "apply",
            "--recipe",
            "fp8-draft",
            "--model",
            str(TINY / "eagle3-draft"),
            "--output",
            str(t.tmp / "out"),
            "--devices",
            d,
        ],
        light=True,
        absent=(t.tmp / "out",),
        mentions=("--devices",),
        max_chars=300,
    ),
)


@case("deploy-out-parent-is-a-file")
def _(t: Ctx) -> Bad:
    f = t.file("afile", "x\n")
    return Bad(["deploy", str(TINY / "target"), "--out", str(f / "sub")], light=True, watch=(f,), mentions=("--out",))


@case("deploy-out-is-a-file")
def _(t: Ctx) -> Bad:
    f = t.file("afile", "x\n")
    return Bad(["deploy", str(TINY / "target"), "--out", str(f)], kind="either", light=True, watch=(f,))


# --- what said too little ---------------------------------------------------------------------------------------


def _pattern_recipe(t: Ctx, entry: str) -> Path:
    return t.file("r.yaml", RECIPE_OK + entry)


@case("apply-keep-pattern-matches-nothing")
def _(t: Ctx) -> Bad:
    f = t.file("r.yaml", RECIPE_OK.replace("keep:\n", "keep:\n  - pattern: '*.mlp.gaet_proj'\n    reason: typo\n"))
    return Bad(
        [
            "apply",
            "--recipe",
            str(f),
            "--model",
            str(TINY / "eagle3-draft"),
            "--output",
            str(t.tmp / "out"),
            "--dry-run",
            "--devices",
            "cpu",
        ],
        light=True,
        absent=(t.tmp / "out",),
        mentions=("keep[0].pattern", "*.mlp.gaet_proj", "matches no module"),
    )


@case("apply-override-pattern-matches-nothing")
def _(t: Ctx) -> Bad:
    f = _pattern_recipe(t, "overrides:\n  - pattern: 'layers.*.mlp.down'\n    scheme: mxfp4\n    reason: smaller\n")
    return Bad(
        [
            "apply",
            "--recipe",
            str(f),
            "--model",
            str(TINY / "eagle3-draft"),
            "--output",
            str(t.tmp / "out"),
            "--devices",
            "cpu",
        ],
        light=True,
        absent=(t.tmp / "out",),
        mentions=("overrides[0].pattern", "matches no module"),
    )


@case("apply-kimi-wrapper-without-text-config")
def _(t: Ctx) -> Bad:
    # Was blamed on the recipe ("applies to moe-target checkpoints, but ... is a dense-target").
    src = t.model("moe-target", "kimi")
    _edit_json(
        src / "config.json",
        lambda c: c.update(architectures=["KimiK25ForConditionalGeneration"], model_type="kimi_k25"),
    )
    return Bad(
        ["apply", "--recipe", "mxfp4-moe", "--model", str(src), "--output", str(t.tmp / "out"), "--dry-run"],
        light=True,
        absent=(t.tmp / "out",),
        mentions=("config.json", "text_config"),
    )


@case("inspect-kimi-wrapper-with-null-text-config")
def _(t: Ctx) -> Bad:
    src = t.model("moe-target", "kimi")
    _edit_json(
        src / "config.json", lambda c: c.update(architectures=["KimiK25ForConditionalGeneration"], text_config=None)
    )
    return Bad(["inspect", str(src)], light=True, mentions=("config.json", "text_config"))


# --- the table ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", [pytest.param(n, marks=marks, id=n) for n, (_, marks) in CASES.items()])
def test_safety_input(name: str, tmp_path: Path) -> None:
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


def test_the_table_covers_each_class() -> None:
    names = " ".join(CASES)
    for needle in (
        "context-length",
        "max-new-tokens",
        "5000-digit",
        "nan",
        "config-",
        "index-",
        "header-",
        "source-",
        "prompts-",
        "recipes-show-",
        "gate-config-",
        "candidate-named",
        "publish-report-",
        "devices-",
        "deploy-out",
        "pattern-matches-nothing",
        "kimi",
    ):
        assert needle in names, needle
    assert len(CASES) >= 150


# --- beyond the table ---------------------------------------------------------------------------------------------


def _no_constants(name: str) -> Any:
    raise AssertionError(f"JSON output holds {name}")


def test_deploy_out_into_a_missing_folder_creates_it(tmp_path: Path) -> None:
    """It ended in `error: unexpected FileNotFoundError`; a folder that can be made is made, as `gate --out` does."""
    out = tmp_path / "new" / "deeper"
    run = run_cli(
        [
            "deploy",
            str(TINY / "eagle3-draft"),
            "--target",
            str(TINY / "target"),
            "--platform",
            "cpu",
            "--out",
            str(out),
            "--json",
        ],
        cwd=tmp_path,
        forbid_heavy=True,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    written = json.loads((out / "deploy.json").read_text())
    assert written == json.loads(run.stdout, parse_constant=_no_constants)
    assert written["max_model_len"] == LIMIT


def test_deploy_max_model_len_beyond_the_target_is_an_error_finding(tmp_path: Path) -> None:
    """deploy's way to say "vLLM would refuse this": an error finding naming the limit (exit 1), the manifest still
    written (VLLM_ALLOW_LONG_MAX_MODEL_LEN=1 makes vLLM take it); at the limit, no finding."""
    args = [
        "deploy",
        str(TINY / "target"),
        "--platform",
        "cpu",
        "--out",
        str(tmp_path),
        "--overwrite",
        "--json",
        "--max-model-len",
    ]
    run = run_cli([*args, str(LIMIT + 1)], cwd=tmp_path, forbid_heavy=True)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    found = [f for f in json.loads(run.stdout)["findings"] if f["code"] == "max-model-len-beyond-positions"]
    assert len(found) == 1 and found[0]["severity"] == "error", found
    assert f"{LIMIT} positions" in found[0]["message"] and found[0]["fix"] == f"use --max-model-len {LIMIT} or less"
    assert json.loads((tmp_path / "deploy.json").read_text())["ok"] is False
    run = run_cli([*args, str(LIMIT)], cwd=tmp_path, forbid_heavy=True)
    assert run.returncode == 0 and not json.loads(run.stdout)["findings"], run.stdout[-2000:]


def _summary_gate(tmp_path: Path, summary: Path) -> tuple[Any, Path]:
    cfg = tmp_path / "gate.yaml"
    cfg.write_text(GATE_OK)
    out = tmp_path / "out"
    run = run_cli(["gate", str(cfg), "--out", str(out)], cwd=tmp_path, env={"GITHUB_STEP_SUMMARY": str(summary)})
    return run, out


def test_a_step_summary_that_cannot_be_written_costs_a_warning_not_the_verdict(tmp_path: Path) -> None:
    """GITHUB_STEP_SUMMARY pointing at a folder lost the verdict (`error: unexpected IsADirectoryError`, exit 1 from
    the crash, not from the verdict). The gate over a BF16 "candidate" fails (verdict regression, exit 1)."""
    folder = tmp_path / "summary.d"
    folder.mkdir()
    run, out = _summary_gate(tmp_path, folder)
    where = f"\nexit {run.returncode}\nstderr: {run.stderr[-3000:]}"
    assert run.returncode == 1, where
    assert "Traceback" not in run.stderr and not error_lines(run.stderr), where
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "GITHUB_STEP_SUMMARY" in warnings[0] and str(out / "report.md") in warnings[0], where
    assert any(line.startswith("gate verdict: regression") for line in run.stderr.splitlines()), where
    report = json.loads((out / "report.json").read_text())
    assert report["gate"]["verdict"] == "regression" and not report["gate"]["passed"]
    ET.parse(out / "junit.xml")
    assert list(folder.iterdir()) == []


def test_a_writable_step_summary_gets_the_report(tmp_path: Path) -> None:
    """The other side: an existing summary file is appended to, and no warning is printed."""
    summary = tmp_path / "summary.md"
    summary.write_text("earlier step\n")
    run, out = _summary_gate(tmp_path, summary)
    assert run.returncode == 1, run.stderr[-2000:]
    assert not [line for line in run.stderr.splitlines() if line.startswith("warning:")], run.stderr
    assert summary.read_text() == "earlier step\n" + (out / "report.md").read_text()


# Every character XML 1.0 forbids (even as a character reference), and some it allows that need escaping.
HOSTILE_TEXT = "".join(map(chr, range(0x20))) + "\x7f\ud800\udfff\ufffe\uffff <&>\"' caf\u00e9 \U0001f600"


def test_junit_parses_whatever_the_names_and_messages_hold() -> None:
    """Item 14: names are refused at config load, but messages quote exceptions and files; the writer must still give
    a document an XML 1.0 parser reads, with the printable text intact."""
    from quantkit.gate.reports import render_junit
    from quantkit.gate.run import GateResult
    from quantkit.results import GateCheck

    checks = [
        GateCheck(
            candidate="c" + HOSTILE_TEXT,
            step="check",
            name="check.errors" + HOSTILE_TEXT,
            value=1.0,
            threshold=0.0,
            op="<=",
            passed=False,
            message="first: " + HOSTILE_TEXT,
        ),
        GateCheck(candidate="c", step="check", name="ok", value=0.0, threshold=0.0, op="<=", passed=True),
    ]
    result = GateResult(
        name="g" + HOSTILE_TEXT,
        config="x",
        passed=False,
        verdict="regression",
        checks=checks,
        candidates={},
        seconds=1.0,
    )
    root = ET.fromstring(render_junit(result).encode("utf-8"))
    suite = root.find("testsuite")
    assert suite is not None and suite.get("name", "").startswith("quantkit-gate g")
    failure = root.find(".//failure")
    assert failure is not None and failure.text is not None
    for text in (failure.text, failure.get("message", ""), suite.get("name", "")):
        assert " <&>\"' caf\u00e9 \U0001f600" in text, text  # printable text survives, escaped and unescaped
        assert "\\x00" in text and "\\x1b" in text and "\\ud800" in text, text  # forbidden ones become visible escapes
        assert not re.search("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]", text), text
    assert [c.get("name") for c in root.iter("testcase")][1] == "ok"


def test_junit_of_a_real_gate_whose_step_message_holds_control_characters(tmp_path: Path) -> None:
    """End to end: a candidate folder holding a tokenizer file whose name has control characters (allowed on Linux);
    the tokenizer-drift figure fails naming it, and junit.xml still parses, the characters shown as escapes."""
    bad = hostile.copy_model(TINY / "eagle3-draft", tmp_path / "bad")
    (bad / "evil\x01\x1b[31m.tiktoken").write_text("x")
    cfg = tmp_path / "gate.yaml"
    cfg.write_text(GATE_OK.replace(f"    path: {TINY / 'eagle3-draft'}", f"    path: {bad}"))
    out = tmp_path / "out"
    run = run_cli(["gate", str(cfg), "--out", str(out)], cwd=tmp_path)
    assert run.returncode == 1, run.stderr[-2000:]
    assert "Traceback" not in run.stderr
    root = ET.parse(out / "junit.xml").getroot()
    messages = [f.get("message", "") + (f.text or "") for f in root.iter("failure")]
    assert any("evil\\x01\\x1b[31m.tiktoken" in m for m in messages), messages


# --- the length rule against vLLM's own ------------------------------------------------------------------------

ROPE_VARIANTS = {
    "plain": {},
    "linear-x2": {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}},
    "dynamic-x4": {"rope_parameters": {"rope_type": "dynamic", "factor": 4.0, "rope_theta": 10000.0}},
    "yarn-prescaled": {
        "rope_parameters": {
            "rope_type": "yarn",
            "factor": 4.0,
            "rope_theta": 10000.0,
            "original_max_position_embeddings": 1024,
        }
    },
    "llama3-prescaled": {
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024,
        }
    },
    "legacy-rope-scaling-wins": {"rope_scaling": {"type": "linear", "factor": 3.0}},
    "smallest-key-wins": {"max_position_embeddings": 1000, "n_positions": 500},
    "model-max-length-overrides": {"max_position_embeddings": 1000, "model_max_length": 2000},
}


@pytest.mark.parametrize("edit", list(ROPE_VARIANTS.values()), ids=list(ROPE_VARIANTS))
def test_max_model_len_is_the_one_vllm_derives(edit: dict[str, Any]) -> None:
    """quantkit.io.config.max_model_len against vLLM's own derivation (model_arch_config_convertor.py
    derive_max_model_len_and_key, then config/model.py _get_and_verify_max_len) on the same config.json."""
    require_vllm()
    import copy
    from types import SimpleNamespace

    import vllm.config  # noqa: F401  (imports the modules below in the order vLLM itself does)
    from transformers import AutoConfig
    from vllm.config.model import _get_and_verify_max_len
    from vllm.transformers_utils.config import get_hf_text_config, patch_rope_parameters
    from vllm.transformers_utils.model_arch_config_convertor import ModelArchConfigConvertorBase

    from quantkit.io.config import max_model_len

    config = json.loads((TINY / "target" / "config.json").read_text())
    config.update(copy.deepcopy(edit))
    ours = max_model_len(copy.deepcopy(config))
    fields = {k: v for k, v in copy.deepcopy(config).items() if k != "model_type"}
    hf = AutoConfig.for_model(config["model_type"], **fields)
    patch_rope_parameters(hf)
    text = get_hf_text_config(hf)
    derived = SimpleNamespace(
        derived_max_model_len_and_key=ModelArchConfigConvertorBase(hf, text).derive_max_model_len_and_key()
    )
    theirs = _get_and_verify_max_len(text, derived, None, None, False, None)
    assert ours is not None and ours.tokens == theirs, (ours, theirs)


def test_max_model_len_of_a_wrapper_reads_its_text_config() -> None:
    """Kimi-K2.5 keeps the language model's length under text_config (vLLM: get_hf_text_config); values by hand."""
    from quantkit.io.config import fit_max_model_len, max_model_len

    wrapper = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": {"max_position_embeddings": 262144, "rope_scaling": {"type": "yarn", "factor": 64.0}},
    }
    got = max_model_len(wrapper)
    assert got is not None and got.tokens == 262144 and got.key == "text_config.max_position_embeddings"
    assert max_model_len({"architectures": ["X"]}) is None  # vLLM assumes 2048 but takes any explicit length
    assert fit_max_model_len(wrapper, 300000) == 262144 and fit_max_model_len({}, 300000) == 300000


def test_eval_engines_get_one_length_that_both_models_hold() -> None:
    """lm-eval's vLLM engines used a fixed 2048: vLLM refuses it for a model of fewer positions."""
    from types import SimpleNamespace

    from quantkit.evaluate.run import EvalError, _engine_length

    def src(n: int | None) -> SimpleNamespace:
        return SimpleNamespace(
            hub_id=None, path=Path(f"m{n}"), config={} if n is None else {"max_position_embeddings": n}
        )

    assert _engine_length({"baseline": src(4096), "candidate": src(4096)}, None) == 2048
    assert _engine_length({"baseline": src(1024), "candidate": src(4096)}, None) == 1024
    assert _engine_length({"baseline": src(None), "candidate": src(None)}, None) == 2048
    assert _engine_length({"baseline": src(4096), "candidate": src(4096)}, 3000) == 3000
    with pytest.raises(EvalError, match="max_model_len 3000: m1024 holds 1024 positions"):
        _engine_length({"baseline": src(1024), "candidate": src(4096)}, 3000)


def test_context_lengths_up_to_the_limit_still_run(tmp_path: Path) -> None:
    """The other side of the limit: the longest context that fits runs, and the preamble fills it (bisection finds
    the most notes that fit: within one note, about 12 tokens, of the length asked)."""
    from quantkit.acceptance.run import with_context
    from quantkit.io.hf import load_tokenizer
    from quantkit.io.prompts import PromptRecord

    tok = load_tokenizer(TINY / "target")
    record = PromptRecord("p", "d", None, "The capital of France is")
    for n in (64, 1000, LIMIT - 5):
        long = with_context(record, tok, n)
        tokens = len(tok(long.render(tok), add_special_tokens=False)["input_ids"])
        assert n - 16 <= tokens <= n, (n, tokens)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "The capital of France is", "domain": "x"}) + "\n")
    run = run_cli(
        [
            "acceptance",
            "--target",
            str(TINY / "target"),
            "--draft",
            str(TINY / "eagle3-draft"),
            "--candidate",
            str(TINY / "eagle3-draft"),
            "--backend",
            "reference",
            "--prompts",
            str(prompts),
            "--max-new-tokens",
            "2",
            "--context-lengths",
            str(LIMIT - 5),
            "--json",
        ],
        cwd=tmp_path,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    data = json.loads(run.stdout, parse_constant=_no_constants)
    assert data["settings"]["context_lengths"] == [LIMIT - 5]


def test_gate_config_names_and_paths_are_checked_before_any_step(tmp_path: Path) -> None:
    """A valid name passes; the ../x that crashed after every step had run is refused before the first (no out)."""
    from quantkit.gate.config import GateConfigError, load_gate_config

    for name in ("draft-fp8", "moe.mxfp4_v2", "A1"):
        cfg = tmp_path / "ok.yaml"
        cfg.write_text(GATE_OK.replace("  - name: c", f"  - name: {name}"))
        assert load_gate_config(cfg)[0].candidates[0].name == name
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {**yaml.safe_load(GATE_OK), "candidates": [{"name": "../x", "path": str(TINY / "eagle3-draft")}]}
        )
    )
    with pytest.raises(GateConfigError, match=r"candidates\.0\.name: '\.\./x' is not a candidate name"):
        load_gate_config(cfg)


def test_the_parsers_refuse_what_python_chokes_on() -> None:
    """quantkit.io.jsonin and quantkit.io.yamlio: one error type each, whatever json / PyYAML raise inside."""
    from quantkit.io.jsonin import JsonInputError, parse_json
    from quantkit.io.yamlio import load_yaml

    assert parse_json('{"a": ' + "9" * 4300 + "}")["a"] == int("9" * 4300)  # at the limit: read
    assert parse_json("[NaN]")[0] != parse_json("[NaN]")[0]  # NaN is read where allowed (config.json)
    for text, reason in (
        (BIG, "5000 digits"),
        ("-" + BIG, "5000 digits"),
        ("[" * 100_000, "nested too deeply"),
        ("{", "not valid JSON"),
        (b"\xff\xfe\x00", "not"),
    ):
        with pytest.raises(JsonInputError, match=reason):
            parse_json(text)
    with pytest.raises(JsonInputError, match="NaN, which is not JSON"):
        parse_json('{"a": NaN}', allow_nan=False)
    with pytest.raises(JsonInputError, match="Infinity"):
        parse_json("[-Infinity]", allow_nan=False)
    for text, reason in (
        (f"a: {BIG}", "5000 digits"),
        ("a: 2024-13-45", "month must be in 1..12"),
        ("a: !!float abc", "could not convert"),
        ("a: !!int x", "invalid literal"),
    ):
        with pytest.raises(yaml.YAMLError, match=reason):
            load_yaml(text)
    assert load_yaml("a: 2024-01-31")["a"].month == 1
