"""`quantkit deploy`: the `vllm serve` command, environment and deploy.json for a checkpoint or a draft + target pair."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

import click

from quantkit.cli.app import exit_failed, main
from quantkit.cli.options import (
    check_file_free,
    check_writable_folder,
    default_out,
    json_option,
    print_command,
    print_json,
    verdict_line,
    vllm_version_option,
)
from quantkit.cli.params import Count
from quantkit.vocab import PLATFORMS

if TYPE_CHECKING:  # the result type only; pydantic is imported when the command runs
    from quantkit.results.deploy import DeployManifest


@main.command("deploy")
@click.argument("folder", type=click.Path(path_type=Path))
@click.option("--target", default=None, help="For an EAGLE-3 draft: the target it is served with (folder or Hub id).")
@click.option(
    "--platform",
    type=click.Choice(PLATFORMS),
    default="gfx950",
    show_default=True,
    envvar="QUANTKIT_PLATFORM",
    help="Where it will be served: MI355X (gfx950), MI300X (gfx942), CUDA, CPU.",
)
@click.option("--tp", type=Count(1, 64), default=1, show_default=True, help="Tensor-parallel size.")
@click.option(
    "--max-model-len",
    type=Count(16, 10_000_000),
    default=None,
    help="Default: the length vLLM derives from the target's config (max_position_embeddings, RoPE "
    "scaling); a longer one is an error finding, as vLLM refuses it.",
)
@click.option("--kv-cache-dtype", default="auto", show_default=True, help="vLLM --kv-cache-dtype.")
@click.option(
    "--num-speculative-tokens",
    "k",
    type=Count(1, 64),
    default=None,
    help="Draft tokens per round. Default: the K `quantkit tune --apply` wrote into the draft folder "
    "(tune.json), else 3.",
)
@click.option(
    "--block-size", type=Count(1, 4096), default=None, help="vLLM --block-size (default: vLLM's). Never 1 with a draft."
)
@click.option(
    "--dtype", default=None, help="vLLM --dtype: auto, half, float16, bfloat16, float, float32 (default: the config's)."
)
@click.option(
    "--draft-attention-backend",
    default=None,
    help="The drafter's attention backend in --speculative-config (default on ROCm: "
    "ROCM_AITER_UNIFIED_ATTN; 'auto': vLLM's pick).",
)
@click.option(
    "--pin-backends",
    is_flag=True,
    default=False,
    help="Pin the MXFP4 MoE backend (--moe-backend aiter on ROCm): vLLM then raises instead of emulating.",
)
@click.option(
    "--model-ref", default=None, help="What the command names for the model (e.g. its Hub id once published)."
)
@click.option("--draft-ref", default=None, help="Likewise for the draft.")
@click.option(
    "--nodes",
    type=Count(1, 1024),
    default=1,
    show_default=True,
    help="Nodes to serve on: > 1 emits vLLM's multi-node launch over Ray (--tp GPUs per node, "
    "--pipeline-parallel-size = nodes), checked per rank.",
)
@vllm_version_option()
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Folder to write deploy.json into (created when missing). Default: ./quantkit-out/deploy-<FOLDER's name>/.",
)
@click.option("--overwrite", is_flag=True, default=False, help="Replace a deploy.json an earlier run wrote there.")
@click.option(
    "--command-only",
    "command_only",
    is_flag=True,
    default=False,
    help="Print only the `vllm serve` command (shell-quoted, one line: for $(...) or a script); writes "
    "deploy.json only when --out is given. Nothing on stdout, and exit 1, when the deployment is "
    "refused.",
)
@json_option("Print the manifest as JSON.")
def deploy_command(
    folder: Path,
    target: str | None,
    platform: str,
    tp: int,
    max_model_len: int | None,
    kv_cache_dtype: str,
    k: int | None,
    block_size: int | None,
    dtype: str | None,
    draft_attention_backend: str | None,
    pin_backends: bool,
    model_ref: str | None,
    draft_ref: str | None,
    nodes: int,
    vllm_version: str | None,
    out_dir: Path | None,
    overwrite: bool,
    command_only: bool,
    as_json: bool,
) -> None:
    """Write deploy.json and print the `vllm serve` command line and its environment.

    \b
    quantkit deploy MOE-MXFP4 --platform gfx950 --tp 8
    quantkit deploy DRAFT-FP8 --target MOE-MXFP4 --platform gfx950 --tp 8 --num-speculative-tokens 3

    Platform environment variables come from vLLM's own envs.py and AMD's ROCm recipes (each with its source).
    The combination is checked against known-bad ones (quantized draft lm_head, aux layers beyond the target, a TP
    size that splits an MXFP4 group, a KV-cache dtype the draft cannot use, ...), each with its source; findings use
    check's format. The command is printed on its own line, shell-quoted and never wrapped, so it pastes as checked;
    a refused deployment (any error) prints no command. Exit 0 when no error was found, 1 otherwise, 2 for bad input.
    """
    from quantkit.deploy.run import run as deploy_manifest
    from quantkit.io.files import check_model_folders
    from quantkit.results.deploy import DEPLOY_FILE

    write = out_dir is not None or not command_only
    out = out_dir if out_dir is not None else default_out("deploy", folder)
    check_model_folders(
        [folder, target], out if write else None, "--out" if out_dir is not None else "the default --out"
    )
    if write:
        check_writable_folder(out, "--out")
        check_file_free(out / DEPLOY_FILE, overwrite)
    manifest = deploy_manifest(
        folder,
        target=target,
        platform=platform,
        tp=tp,
        max_model_len=max_model_len,
        kv_cache_dtype=kv_cache_dtype,
        num_speculative_tokens=k,
        model_ref=model_ref,
        draft_ref=draft_ref,
        block_size=block_size,
        dtype=dtype,
        draft_attention_backend=draft_attention_backend,
        pin_backends=pin_backends,
        nodes=nodes,
        vllm_version=vllm_version,
    )
    path = manifest.write(out) if write else None
    if as_json:
        print_json(manifest.to_dict())
    elif command_only:
        if manifest.ok:
            print_command(manifest.argv)
        else:
            click.echo(_refused_line(manifest, path) + " (run without --command-only for the findings)", err=True)
    else:
        _render(manifest, path)
    if not manifest.ok:
        exit_failed()


def _refused_line(manifest: DeployManifest, path: Path | None) -> str:
    return verdict_line(
        False,
        manifest.findings,
        "vLLM would refuse this deployment or serve it wrong, so no command "
        "is printed" + (f' ({path} keeps it, with "ok": false)' if path else ""),
        failed="deploy refused",
    )


def _render(manifest: DeployManifest, path: Path | None) -> None:
    """Verdict first, then the findings, then (only when it may be used) the environment and the command, each a
    line that pastes as it is (never wrapped: no rich console here)."""
    echo = click.echo
    if manifest.ok:
        echo(
            verdict_line(
                True,
                manifest.findings,
                f"deploy of {manifest.model}"
                + (f" with {manifest.draft}" if manifest.draft else "")
                + f" on {manifest.platform}",
            )
        )
    else:
        echo(_refused_line(manifest, path))
    for f in manifest.findings:
        echo(f.sentence())
    if manifest.ok:
        if manifest.env:
            echo("environment (export before vllm serve):")
            for e in manifest.env:
                echo(f"export {e.name}={shlex.quote(e.value)}  # {e.why} ({e.source})")
        if manifest.multi_node is not None:
            m = manifest.multi_node
            echo(
                f"multi-node ({m.nodes} nodes, TP {m.tensor_parallel_size} x PP {m.pipeline_parallel_size}, Ray): "
                "on every node set " + " ".join(m.env)
            )
            echo("head:")
            print_command(m.head)
            echo("each worker:")
            print_command(m.worker)
            echo(f"per rank: {m.per_rank}")
        echo("command" + (" (on the head, once every worker has joined)" if manifest.multi_node else "") + ":")
        print_command(manifest.argv)
    needs = manifest.vllm_min_version_why
    if needs:
        echo(f"vLLM {manifest.vllm_version} checked; this deployment needs vLLM >= {manifest.vllm_min_version}:")
        for n in needs:
            echo(f"  >= {n.version}: {n.why} ({n.source})")
    else:
        echo(f"vLLM {manifest.vllm_version} checked; no rule asks for a newer vLLM")
    from quantkit.rules.vllm_versions import unknown_version_note

    note = unknown_version_note(manifest.vllm_version) if manifest.vllm_version else None
    if note:
        echo(f"note: {note}")
    if manifest.predicted_backends:
        echo("predicted backends: " + ", ".join(f"{k}={v}" for k, v in manifest.predicted_backends.items()))
    if path is not None:
        echo(f"wrote {path}" + (' (refused: "ok": false)' if not manifest.ok else ""))
