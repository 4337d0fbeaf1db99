# tier: e2e
"""Issue 35 item 9: a config key a family record reads, with the wrong type, is one `error:` line naming the key and
the file (exit 2), from `inspect` and `apply --dry-run` alike, never a crash in the record's builder. The keys are
the records' own declarations (Family.config_keys), from which quantkit.io.config builds the schema."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from tests.fixtures.checkpoints import DEEPSEEK_V32_CONFIG, LLAMA4_CONFIG, QWEN3_NEXT_CONFIG
from tests.fixtures.hostile import error_lines, run_cli, tree_digest, write_safetensors


def _llama4(value):
    config = copy.deepcopy(LLAMA4_CONFIG)
    config["text_config"]["interleave_moe_layer_step"] = value
    return config


CASES = {
    "llama4-interleave-str": (_llama4("1"), "interleave_moe_layer_step"),
    "llama4-interleave-negative": (_llama4(-1), "interleave_moe_layer_step"),
    "qwen3-next-interval-str": ({**QWEN3_NEXT_CONFIG, "full_attention_interval": "4"}, "full_attention_interval"),
    "qwen3-next-interval-zero": ({**QWEN3_NEXT_CONFIG, "full_attention_interval": 0}, "full_attention_interval"),
    "qwen3-next-layer-types-str": ({**QWEN3_NEXT_CONFIG, "layer_types": "full_attention"}, "layer_types"),
    "dsv32-freq-str": ({**DEEPSEEK_V32_CONFIG, "index_topk_freq": "2"}, "index_topk_freq"),
    "dsv32-pattern-int": ({**DEEPSEEK_V32_CONFIG, "index_topk_pattern": 5}, "index_topk_pattern"),
    "dsv32-topk-method-list": ({**DEEPSEEK_V32_CONFIG, "topk_method": ["noaux_tc"]}, "topk_method"),
    "dsv32-norm-topk-str": ({**DEEPSEEK_V32_CONFIG, "norm_topk_prob": "true"}, "norm_topk_prob"),
}


def _folder(tmp_path: Path, config: dict) -> Path:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    write_safetensors(
        folder / "model.safetensors",
        {"lm_head.weight": {"dtype": "BF16", "shape": [2, 2], "data_offsets": [0, 8]}},
        b"\0" * 8,
    )
    return folder


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("command", ["inspect", "apply"])
def test_a_mistyped_record_key_is_one_line_naming_key_and_file(tmp_path, case, command):
    config, key = CASES[case]
    folder = _folder(tmp_path, config)
    before = tree_digest(folder)
    args = (
        ["inspect", str(folder)]
        if command == "inspect"
        else ["apply", "--recipe", "mxfp4-moe", "--model", str(folder), "--output", str(tmp_path / "out"), "--dry-run"]
    )
    run = run_cli(args, cwd=tmp_path)
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    lines = error_lines(run.stderr)
    assert len(lines) == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert key in lines[0] and str(folder / "config.json") in lines[0], lines[0]
    assert not (tmp_path / "out").exists()
    assert tree_digest(folder) == before
