# tier: unit
"""Issue 37 item 1: the family record is the only place a family fact lives, read from the code itself (ast), the way
tests/test_house.py reads the import graph.

- No production module outside quantkit/naming/archs/ compares a config's `model_type` or `architectures` (a family
  fact chosen by a model_type string is a fact outside its record).
- Every field of Family, MoeLayout, Wrapper and DraftLayout is read by production code outside naming/family.py
  (a field nobody reads gives false confidence: it is deleted).
- io/ is handed the record's facts by its callers: no module under quantkit/io imports quantkit.naming, lazily or not.
- The config.json schema built from the records' declared keys never blames a valid published config.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from quantkit.errors import CheckpointError
from quantkit.io.config import validate_model_config
from quantkit.naming import archs
from quantkit.naming.family import DraftLayout, Family, MoeLayout, Wrapper

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "quantkit"
ARCHS = PKG / "naming" / "archs"
# Keys whose value names a model family. `speculators_model_type` is a format marker (like quant_method), not one.
FAMILY_KEYS = {"model_type", "architectures"}
# vLLM's own model_type rule for a model no record describes (vllm/config/model.py _get_and_verify_max_len:
# `"gemma3" not in hf_config.model_type` skips the RoPE factor); max_model_len applies it to any config, records or
# not (acceptance and eval measure models quantkit cannot name). The one compare outside naming/archs/, by name.
ALLOWED = {("quantkit/io/config.py", "max_model_len")}


def _production() -> list[Path]:
    return sorted(p for p in PKG.rglob("*.py") if ARCHS not in p.parents)


def _mentions_family_key(node: ast.AST) -> bool:
    """Whether `node` reads a config's model_type / architectures: `c.get("model_type")`, `c["architectures"]`,
    `cfg.model_type`, or a variable named for one."""
    for sub in ast.walk(node):
        if isinstance(sub, ast.Call) and any(isinstance(a, ast.Constant) and a.value in FAMILY_KEYS for a in sub.args):
            return True
        if isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Constant) and sub.slice.value in FAMILY_KEYS:
            return True
        if isinstance(sub, ast.Name) and sub.id in ("model_type", "mt", "arch", "archs", "architectures"):
            return True
        if isinstance(sub, ast.Attribute) and sub.attr in FAMILY_KEYS:
            return True
    return False


def _is_table(node: ast.AST, tables: set[str]) -> bool:
    """A string, a collection of strings, or a table this module defines: what a family fact is chosen against."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return True
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):  # TABLE.values(), TABLE.keys()
        return _is_table(node.func.value, tables)
    return isinstance(node, ast.Name) and node.id in tables


def _looks_up_family(node: ast.AST, tables: set[str]) -> bool:
    """TABLE.get(<model_type>) or TABLE[<model_type>] on a table this module defines: a fact chosen by the string."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
        return _is_table(node.func.value, tables) and any(map(_mentions_family_key, node.args[:1]))
    if isinstance(node, ast.Subscript):
        return _is_table(node.value, tables) and _mentions_family_key(node.slice)
    return False


def _compares_family(node: ast.Compare, tables: set[str]) -> bool:
    sides = [node.left, *node.comparators]
    return any(
        _mentions_family_key(a) and any(_is_table(b, tables) for b in sides if b is not a) for a in sides
    ) or any(
        _mentions_family_key(a)
        and isinstance(a, ast.Call)
        and isinstance(a.func, ast.Attribute)
        and a.func.attr in ("startswith", "endswith")
        for a in sides
    )


def _family_compares(path: Path) -> list[tuple[str, int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    tables = {
        t.id
        for stmt in tree.body
        if isinstance(stmt, (ast.Assign, ast.AnnAssign))
        for t in (stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target])
        if isinstance(t, ast.Name)
    }
    found = []
    for func in [tree, *(n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))]:
        body = func.body if isinstance(func, ast.Module) else [func]
        for stmt in body:
            if isinstance(func, ast.Module) and isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(stmt):
                startswith = (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("startswith", "endswith")
                    and _mentions_family_key(node.func.value)
                )
                if (
                    startswith
                    or _looks_up_family(node, tables)
                    or (isinstance(node, ast.Compare) and _compares_family(node, tables))
                ):
                    name = func.name if not isinstance(func, ast.Module) else "<module>"
                    found.append((name, node.lineno, ast.unparse(node)))
    return found


def test_no_model_type_or_architecture_compare_outside_the_records():
    found = {(str(p.relative_to(ROOT)), fn, line, src) for p in _production() for fn, line, src in _family_compares(p)}
    bad = [f"{path}:{line} ({fn}): {src}" for path, fn, line, src in found if (path, fn) not in ALLOWED]
    assert not bad, "family facts chosen outside naming/archs/:\n" + "\n".join(sorted(bad))
    assert {(path, fn) for path, fn, _l, _s in found} >= ALLOWED, "an ALLOWED entry no longer compares: remove it"


def test_the_compare_detector_finds_what_the_old_code_did(tmp_path):
    """The detector can fail: the compares issue 37 names (rules/kernels.py, io/formats.py) are found."""
    old = tmp_path / "old.py"
    old.write_text(
        'T = {"gpt_oss": 1}\n\ndef routing(text):\n    mt = str(text.get("model_type", ""))\n'
        '    return mt.startswith("deepseek")\n\ndef kimi(text):\n    return "kimi" in text["model_type"]\n\n'
        'def fused(config):\n    return str(config.get("model_type")) not in T\n\n'
        'def view(config, K):\n    return config.get("model_type") != "kimi_k25"\n\n'
        'def table(config):\n    return T.get(str(config.get("model_type")))\n\n'
        "def wrap(self):\n    return self.model_type in T.values()\n\n"
        'def fine(config, k, M):\n    return k not in ("architectures", "x") and config.get("model_type") in M\n'
    )
    assert [f for f, _l, _s in _family_compares(old)] == ["routing", "kimi", "fused", "view", "table", "wrap"]


@pytest.mark.parametrize("record", [Family, MoeLayout, Wrapper, DraftLayout])
def test_every_record_field_is_read_by_production_code(record):
    """An attribute read of the field's name in production code outside naming/family.py, or inside a method of the
    record (Family.quark_template, .mtp_exclusions, .kind) that production code calls."""
    reads: set[str] = set()
    for path in _production() + sorted(ARCHS.glob("*.py")):
        if path == PKG / "naming" / "family.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                reads.add(node.attr)
    family_py = ast.parse((PKG / "naming" / "family.py").read_text())
    cls = next(n for n in family_py.body if isinstance(n, ast.ClassDef) and n.name == record.__name__)
    for method in (n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in reads):
        reads |= {
            n.attr
            for n in ast.walk(method)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self"
        }
    unread = [f.name for f in dataclasses.fields(record) if f.name not in reads]
    assert not unread, f"{record.__name__} fields no production code reads: {unread}; use them or delete them"


def test_io_is_handed_the_records_facts_and_imports_no_naming():
    for path in sorted((PKG / "io").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not [n for n in names if n.startswith("quantkit.naming")], f"{path}: imports {names}"


def test_every_record_key_is_in_the_schema_and_valid_configs_pass():
    """Each declared key reaches the schema (a wrong type is refused, naming the key), and the published shapes of
    the same keys pass, among them MiniMax-M3's per-layer moe_layer_freq list."""
    for family in archs.families():
        for key in family.config_keys:
            with pytest.raises(CheckpointError, match=key):
                validate_model_config({key: {"not": "a value of any declared type"}}, "config.json")
    valid = [
        {"moe_layer_freq": [0, 1, 1]},
        {"moe_layer_freq": 1},
        {"index_topk_pattern": "FSSF"},
        {"index_topk_pattern": None},
        {"index_topk_freq": 2},
        {"full_attention_interval": 4},
        {"layer_types": ["linear_attention", "full_attention"]},
        {"interleave_moe_layer_step": 0},
        {"text_config": {"interleave_moe_layer_step": 1}},
        {"topk_method": "noaux_tc"},
        {"topk_method": None},
        {"scoring_func": "sigmoid", "use_routing_bias": True, "norm_topk_prob": False, "n_group": 8},
    ]
    for config in valid:
        assert validate_model_config(config, "config.json") is config


def test_every_config_key_the_records_read_is_typed():
    """Every key a record's code reads from config.json (`config.get("k")`, `text["k"]`, a router `Key("k")`) is typed
    at the boundary: a field of io.config.ModelConfig or a key some record declares (Family.config_keys)."""
    from quantkit.io.config import ModelConfig

    declared = set(ModelConfig.model_fields) | {k for f in archs.families() for k in f.config_keys}
    read: dict[str, str] = {}
    for path in [*sorted(ARCHS.glob("*.py")), PKG / "naming" / "builder.py"]:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            key = None
            if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
                is_get = (
                    isinstance(node.func, ast.Attribute)
                    and node.func.attr == "get"
                    and ast.unparse(node.func.value) in ("config", "text", "c", "cfg", "layer_cfg")
                )
                if is_get or (isinstance(node.func, ast.Name) and node.func.id == "Key"):
                    key = node.args[0].value
            elif (
                isinstance(node, ast.Subscript)
                and isinstance(node.slice, ast.Constant)
                and ast.unparse(node.value) in ("config", "text", "c", "cfg")
            ):
                key = node.slice.value
            if isinstance(key, str):
                read.setdefault(key, f"{path.name}:{node.lineno}")
    assert len(read) >= 25  # the scan reads the records
    untyped = {k: where for k, where in read.items() if k not in declared}
    assert not untyped, f"config keys read by a record but typed nowhere (add them to its config_keys): {untyped}"


def test_replica_configs_of_every_family_pass_the_schema():
    """The configs the suite builds after the releases (tests/fixtures/checkpoints/) are valid."""
    from tests.fixtures.checkpoints import deepseek, glm, gpt_oss, llama4, qwen

    configs = {
        f"{m.__name__}.{k}": v
        for m in (deepseek, glm, gpt_oss, llama4, qwen)
        for k, v in vars(m).items()
        if k.endswith("_CONFIG") and isinstance(v, dict) and "model_type" in v  # not the quantization configs
    }
    assert len(configs) >= 8
    for name, config in configs.items():
        validate_model_config(config, name)
