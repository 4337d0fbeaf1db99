"""`quantkit deploy`: the `vllm serve` command, environment and deploy.json for a checkpoint or a draft + target pair."""

from __future__ import annotations

from pathlib import Path

import click

from quantkit.cli.app import exit_failed, main
from quantkit.cli.options import check_writable_folder, json_option, make_console, print_json, vllm_version_option
from quantkit.vocab import PLATFORMS


@main.command("deploy")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--target", default=None, help="For an EAGLE-3 draft: the target it is served with (folder or Hub id).")
@click.option("--platform", type=click.Choice(PLATFORMS), default="gfx950", show_default=True,
              envvar="QUANTKIT_PLATFORM", help="Where it will be served: MI355X (gfx950), MI300X (gfx942), CUDA, CPU.")
@click.option("--tp", type=click.IntRange(1, 64), default=1, show_default=True, help="Tensor-parallel size.")
@click.option("--max-model-len", type=click.IntRange(16, 10_000_000), default=None,
              help="Default: the length vLLM derives from the target's config (max_position_embeddings, RoPE "
                   "scaling); a longer one is an error finding, as vLLM refuses it.")
@click.option("--kv-cache-dtype", default="auto", show_default=True, help="vLLM --kv-cache-dtype.")
@click.option("--num-speculative-tokens", "k", type=click.IntRange(1, 64), default=3, show_default=True)
@click.option("--block-size", type=click.IntRange(1, 4096), default=None,
              help="vLLM --block-size (default: vLLM's). Never 1 with a draft.")
@click.option("--dtype", default=None,
              help="vLLM --dtype: auto, half, float16, bfloat16, float, float32 (default: the config's).")
@click.option("--draft-attention-backend", default=None,
              help="The drafter's attention backend in --speculative-config (default on ROCm: "
                   "ROCM_AITER_UNIFIED_ATTN; 'auto': vLLM's pick).")
@click.option("--pin-backends", is_flag=True, default=False,
              help="Pin the MXFP4 MoE backend (--moe-backend aiter on ROCm): vLLM then raises instead of emulating.")
@click.option("--model-ref", default=None, help="What the command names for the model (e.g. its Hub id once published).")
@click.option("--draft-ref", default=None, help="Likewise for the draft.")
@click.option("--nodes", type=click.IntRange(1, 1024), default=1, show_default=True,
              help="Nodes to serve on: > 1 emits vLLM's multi-node launch over Ray (--tp GPUs per node, "
                   "--pipeline-parallel-size = nodes), checked per rank.")
@vllm_version_option()
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("."),
              show_default=True, help="Folder to write deploy.json into (created when missing).")
@json_option("Print the manifest as JSON.")
def deploy_command(folder: Path, target: str | None, platform: str, tp: int, max_model_len: int | None,
                   kv_cache_dtype: str, k: int, block_size: int | None, dtype: str | None,
                   draft_attention_backend: str | None, pin_backends: bool, model_ref: str | None,
                   draft_ref: str | None, nodes: int, vllm_version: str | None, out_dir: Path, as_json: bool) -> None:
    """Write deploy.json and print the `vllm serve` command line and its environment.

    \b
    quantkit deploy MOE-MXFP4 --platform gfx950 --tp 8
    quantkit deploy DRAFT-FP8 --target MOE-MXFP4 --platform gfx950 --tp 8 --num-speculative-tokens 3

    Platform environment variables come from vLLM's own envs.py and AMD's ROCm recipes (each with its source).
    The combination is checked against known-bad ones (quantized draft lm_head, aux layers beyond the target, a TP
    size that splits an MXFP4 group, a KV-cache dtype the draft cannot use, ...), each with its source; findings use
    check's format. Exit 0 when no error was found, 1 otherwise, 2 for bad input.
    """
    from quantkit.deploy.run import run as deploy_manifest

    check_writable_folder(out_dir, "--out")
    manifest = deploy_manifest(folder, target=target, platform=platform, tp=tp, max_model_len=max_model_len,
                               kv_cache_dtype=kv_cache_dtype, num_speculative_tokens=k, model_ref=model_ref,
                               draft_ref=draft_ref, block_size=block_size, dtype=dtype,
                               draft_attention_backend=draft_attention_backend, pin_backends=pin_backends,
                               nodes=nodes, vllm_version=vllm_version)
    path = manifest.write(out_dir)
    if as_json:
        print_json(manifest.to_dict())
    else:
        console = make_console()
        console.print("environment:")
        for e in manifest.env:
            console.print(f"  {e.name}={e.value}    # {e.why} ({e.source})")
        if manifest.multi_node is not None:
            import shlex

            m = manifest.multi_node
            console.print(f"multi-node ({m.nodes} nodes, TP {m.tensor_parallel_size} x PP {m.pipeline_parallel_size}, "
                          "Ray): on every node set " + " ".join(m.env))
            console.print(f"  head:    {shlex.join(m.head)}")
            console.print(f"  workers: {shlex.join(m.worker)}")
            console.print(f"  per rank: {m.per_rank}")
        console.print("command:" + (" (on the head, once every worker has joined)" if manifest.multi_node else ""))
        console.print(f"  {manifest.command}")
        console.print(f"vLLM {manifest.vllm_version}; needs >= {manifest.vllm_min_version or 'any'}"
                      + "".join(f"\n  >= {n.version}: {n.why} ({n.source})" for n in manifest.vllm_min_version_why))
        if manifest.predicted_backends:
            console.print("predicted backends: " + ", ".join(f"{k}={v}" for k, v in manifest.predicted_backends.items()))
        for f in manifest.findings:
            console.print(f"{f.severity}: {f.code} {f.layer_or_tensor}: {f.message}" + (f" Fix: {f.fix}" if f.fix else "")
                          + (f" [{f.source}]" if f.source else ""))
        console.print(f"wrote {path}")
    if not manifest.ok:
        exit_failed()
