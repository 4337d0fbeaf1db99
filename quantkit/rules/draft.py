"""EAGLE-3 drafts: vocabulary maps, aux hidden-state layer ids, and the fit with the target
(vllm/model_executor/models/llama_eagle3.py, models/llama.py and interfaces.py, v1/worker/gpu_model_runner.py).

The rules `vocab_maps`, `aux_layers`, `target_fit` and `target_unknown` (check's; deploy runs `aux_layers` too) and
deploy's `check_draft_vocab`, which also reads d2t's header, until it merges into vocab_maps and target_fit."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from quantkit.io.config import config_int, draft_config, text_config
from quantkit.io.headers import TensorInfo
from quantkit.naming.precision import PLACEHOLDER, LoadedCheckpoint
from quantkit.results.check import Finding
from quantkit.rules.deploy_context import DeployContext, finding
from quantkit.rules.rule import Findings, RuleContext

AUX_IDS = "eagle_aux_hidden_state_layer_ids"


@dataclass(frozen=True)
class _Draft:
    """The values of a draft's config.json (and fc tensor) the draft rules read."""

    layer_cfg: dict[str, Any]
    vocab: Any
    draft_vocab: Any
    target_hidden: Any
    use_aux: Any
    top_ids: Any
    nested_ids: Any
    ids: Any
    fc: TensorInfo | None
    n_aux: int | None


def _draft(ck: LoadedCheckpoint) -> _Draft:
    config = ck.config
    raw_layer_cfg = config.get("transformer_layer_config")
    layer_cfg: dict[str, Any] = raw_layer_cfg if isinstance(raw_layer_cfg, dict) else config
    tensors = ck.tensors
    vocab = layer_cfg.get("vocab_size") or config.get("vocab_size")
    draft_vocab = config.get("draft_vocab_size") or layer_cfg.get("draft_vocab_size") or vocab
    hidden = layer_cfg.get("hidden_size")
    target_hidden = config.get("target_hidden_size") or layer_cfg.get("target_hidden_size") or hidden
    raw_eagle = config.get("eagle_config")
    eagle: dict[str, Any] = raw_eagle if isinstance(raw_eagle, dict) else {}
    use_aux = eagle.get("use_aux_hidden_state", True)
    top_ids = config.get("eagle_aux_hidden_state_layer_ids")
    # eagle_config's ids as vLLM reads them: a DFlash draft's dflash_config.target_layer_ids override them
    nested_ids = eagle.get("eagle_aux_hidden_state_layer_ids")
    if isinstance(config.get("dflash_config"), dict):
        nested_ids = draft_config(config).aux_layer_ids_eagle_config
    ids = top_ids or nested_ids  # gpu_model_runner: the top-level attribute first, then eagle_config's
    fc = tensors.get("fc.weight")
    n_aux = None
    if fc is not None and len(fc.shape) == 2 and isinstance(target_hidden, int) and target_hidden > 0:
        n_aux = fc.shape[1] // target_hidden if fc.shape[1] % target_hidden == 0 else None
    return _Draft(layer_cfg, vocab, draft_vocab, target_hidden, use_aux, top_ids, nested_ids, ids, fc, n_aux)


def vocab_maps(ctx: RuleContext) -> None:
    """draft-vocab-maps: lm_head rows = draft_vocab_size; d2t (and t2d) map the draft vocabulary into the target's."""
    ck, findings = ctx.subject.loaded, ctx.findings
    d = _draft(ck)
    head = ck.tensors.get("lm_head.weight")
    if head is not None and isinstance(d.draft_vocab, int) and head.shape and head.shape[0] != d.draft_vocab:
        findings.add(
            "error",
            "draft-vocab-size",
            "lm_head.weight",
            f"lm_head has {head.shape[0]} rows but draft_vocab_size is {d.draft_vocab} (llama_eagle3.py "
            "builds lm_head with draft_vocab_size rows)",
            "set draft_vocab_size in config.json to the lm_head rows",
        )
    if isinstance(d.vocab, int) and isinstance(d.draft_vocab, int) and d.draft_vocab != d.vocab:
        _vocab_maps(ck, d.vocab, d.draft_vocab, findings)


def aux_layers(ctx: RuleContext) -> None:
    """draft-aux-layers: the aux hidden-state layer ids vLLM uses exist in the target and match fc's input."""
    findings = ctx.findings
    d = _draft(ctx.subject.loaded)
    where = AUX_IDS
    if d.top_ids and d.nested_ids and list(d.top_ids) != list(d.nested_ids):
        findings.add(
            "warning",
            "aux-layer-ids",
            where,
            f"top-level eagle_aux_hidden_state_layer_ids {d.top_ids} differ from eagle_config's "
            f"{d.nested_ids}; vLLM uses the top-level ones",
            "make both the same",
        )
    n_target = ctx.target_num_layers
    if ctx.target is None or n_target is None:
        return  # draft-target-unknown says what is not checked (deploy: a target config without a layer count)
    if d.use_aux:
        effective = list(d.ids) if d.ids else [2, n_target // 2, n_target - 3]
        source_txt = f"{where} {effective}" if d.ids else f"vLLM's default aux layer ids {effective} (none in config)"
        bad = [i for i in effective if not isinstance(i, int) or i < 0 or i > n_target]
        if bad:
            findings.add(
                "error",
                "aux-layer-out-of-range",
                where,
                f"{source_txt}: {bad} outside the target's hidden states 0..{n_target} (the target has "
                f"{n_target} layers; llama.py collects the state after layer i for aux id i), so vLLM never "
                "collects them and the fc input has the wrong size",
                f"use ids within 0..{n_target} (the draft's training used the target's layer numbering; "
                "is --target the draft's target?)",
            )
        elif len(set(effective)) != len(effective):
            findings.add(
                "error",
                "aux-layer-ids",
                where,
                f"{source_txt} repeats a layer; vLLM then fails with a shape error",
                "write explicit distinct ids at the top level and in eagle_config",
            )
        if d.n_aux is not None and d.n_aux != len(effective):
            findings.add(
                "error",
                "aux-layer-ids",
                where,
                f"fc takes {d.n_aux} x {d.target_hidden} inputs but {len(effective)} aux layer ids are given",
                f"give exactly {d.n_aux} aux layer ids",
            )


# The config.json keys vLLM's parallel drafting takes the mask token from, in its order after dflash_config's
# mask_token_id (vllm/v1/spec_decode/llm_base_proposer.py _init_parallel_drafting_params; `hasattr` for the last three)
MASK_TOKEN_KEYS = ("mask_token_id", "dspark_noise_token_id", "pard_token", "ptd_token_id")


def mask_token(ctx: RuleContext) -> None:
    """draft-mask-token: a P-EAGLE or DFlash draft (it drafts in parallel) names the mask token vLLM feeds its masked
    slots; without one vLLM refuses at load. SpecForge's P-EAGLE training takes the mask token as an argument and does
    not write it into config.json."""
    from quantkit.naming.archs import parallel_drafting, speculative_method

    config = ctx.subject.loaded.config
    method = speculative_method(config)
    if not parallel_drafting(config) and method != "dflash":  # DSpark's configs carry their noise token by class
        return
    nested = config.get("dflash_config")
    if isinstance(nested, dict) and "mask_token_id" in nested:
        return
    if config.get("mask_token_id") is not None or any(k in config for k in MASK_TOKEN_KEYS[1:]):
        return
    ctx.findings.add(
        "error",
        "draft-mask-token",
        "config.json",
        f"this {(config.get('architectures') or ['?'])[0]} draft drafts in parallel (speculative method {method}) but "
        "config.json names no mask token (dflash_config.mask_token_id, mask_token_id, dspark_noise_token_id, "
        "pard_token or ptd_token_id): vLLM raises ValueError when it loads the draft",
        'add "mask_token_id": <the token id the draft was trained with as its mask> to config.json',
    )


def target_fit(ctx: RuleContext) -> None:
    """draft-target-fit: the draft's target hidden size and vocabulary are the target's."""
    assert ctx.target is not None  # needs="pair"
    findings = ctx.findings
    d = _draft(ctx.subject.loaded)
    tcfg = text_config(ctx.target.config)
    t_hidden, t_vocab = tcfg.get("hidden_size"), tcfg.get("vocab_size")
    fc, target_hidden, vocab = d.fc, d.target_hidden, d.vocab
    if isinstance(t_hidden, int) and isinstance(target_hidden, int) and t_hidden != target_hidden:
        findings.add(
            "error",
            "hidden-size-mismatch",
            "model.fc",
            f"the draft expects target hidden size {target_hidden} but the target's hidden_size is {t_hidden}",
            "is --target the draft's target? (set target_hidden_size in the draft config if it differs)",
        )
    elif fc is not None and isinstance(t_hidden, int) and len(fc.shape) == 2 and fc.shape[1] % t_hidden:
        findings.add(
            "error",
            "hidden-size-mismatch",
            "model.fc",
            f"fc.weight input dim {fc.shape[1]} is not a multiple of the target's hidden_size {t_hidden}",
            "is --target the draft's target?",
        )
    if isinstance(t_vocab, int) and isinstance(vocab, int) and t_vocab != vocab:
        findings.add(
            "error",
            "vocab-size-mismatch",
            "vocab_size",
            f"the draft's vocab_size {vocab} differs from the target's {t_vocab}; d2t maps into the target vocabulary",
            "is --target the draft's target?",
        )


def target_unknown(ctx: RuleContext) -> None:
    """draft-target-unknown: without --target, say what is not checked (check/run.py adds target-layers-assumed)."""
    if ctx.target is not None:
        return
    ck = ctx.subject.loaded
    named = (
        f"the draft's decoder layers are named model.layers.{PLACEHOLDER}.* (N = the target's layer count), and "
        if any(PLACEHOLDER in layer.name for layer in ck.layers)
        else ""
    )
    ctx.findings.add(
        "info",
        "target-unknown",
        "--target",
        f"no --target: {named}aux layer ids, hidden sizes and the real load are not checked",
        "pass --target TARGET_DIR",
    )


def _vocab_maps(ck: LoadedCheckpoint, vocab: int, draft_vocab: int, findings: Findings) -> None:
    import numpy as np

    from quantkit.io.tensordata import TensorReader

    d2t, t2d = ck.tensors.get("d2t"), ck.tensors.get("t2d")
    if d2t is None:
        findings.add(
            "error",
            "d2t-missing",
            "d2t",
            f"draft vocab ({draft_vocab}) differs from vocab ({vocab}) but there is no d2t tensor; vLLM "
            "keeps draft_id_to_target_id at zeros and maps every draft token to the wrong target token",
            "save d2t (draft id -> target id offset) with the draft",
        )
        return
    if t2d is None:
        findings.add(
            "warning",
            "t2d-missing",
            "t2d",
            "no t2d tensor; vLLM skips t2d on load, but it is the only record of the draft vocabulary to "
            "check d2t against",
            "save t2d with the draft",
        )
    reader = TensorReader(ck.path)
    if d2t.dtype not in ("I64", "I32") or len(d2t.shape) != 1 or d2t.shape[0] != draft_vocab:
        findings.add(
            "error",
            "d2t-invalid",
            "d2t",
            f"d2t is {d2t.dtype} {list(d2t.shape)}; vLLM loads it into an int64 [{draft_vocab}] parameter "
            "(draft_vocab_size)",
            "save d2t as int64 with draft_vocab_size entries",
        )
        return
    offsets = reader.array(d2t.file, "d2t").astype(np.int64)
    targets = np.arange(draft_vocab, dtype=np.int64) + offsets
    if targets.min() < 0 or targets.max() >= vocab or len(np.unique(targets)) != draft_vocab:
        findings.add(
            "error",
            "d2t-invalid",
            "d2t",
            f"arange(draft_vocab) + d2t gives target ids outside 0..{vocab - 1} or repeated ids",
            "regenerate d2t from the draft vocabulary",
        )
        return
    if t2d is None:
        return
    if len(t2d.shape) != 1 or t2d.shape[0] != vocab:
        findings.add(
            "error",
            "t2d-invalid",
            "t2d",
            f"t2d has shape {list(t2d.shape)}; expected [{vocab}] (vocab_size)",
            "regenerate t2d: a mask over the target vocabulary",
        )
        return
    mask = reader.array(t2d.file, "t2d").astype(bool)
    if int(mask.sum()) != draft_vocab:
        findings.add(
            "error",
            "t2d-invalid",
            "t2d",
            f"t2d marks {int(mask.sum())} target tokens; draft_vocab_size is {draft_vocab}",
            "regenerate t2d from the draft vocabulary",
        )
        return
    if not np.array_equal(np.sort(targets), np.nonzero(mask)[0]):
        findings.add(
            "error",
            "d2t-t2d-mismatch",
            "d2t",
            "arange(draft_vocab) + d2t does not give the target ids t2d marks: draft tokens map to the "
            "wrong target tokens",
            "regenerate d2t and t2d together",
        )


def check_draft_vocab(ctx: DeployContext) -> list[Finding]:
    assert ctx.draft_config is not None and ctx.draft_tensors is not None
    layer = ctx.draft_layer
    out = []
    t_vocab = config_int(ctx.target_text.get("vocab_size"))
    d_vocab = config_int(layer.get("vocab_size")) or config_int(ctx.draft_config.get("vocab_size"))
    draft_vocab = (
        config_int(ctx.draft_config.get("draft_vocab_size")) or config_int(layer.get("draft_vocab_size")) or d_vocab
    )
    if t_vocab and d_vocab and t_vocab != d_vocab:
        out.append(
            finding(
                "draft-vocab-mismatch",
                "error",
                "draft-vocab-mismatch",
                "vocab_size",
                f"the draft's vocab_size {d_vocab} differs from the target's {t_vocab}: its d2t map and "
                "embeddings index the target's vocabulary",
                f"is {ctx.target_path} the draft's target?",
            )
        )
    if t_vocab and draft_vocab and draft_vocab > t_vocab:
        out.append(
            finding(
                "draft-vocab-mismatch",
                "error",
                "draft-vocab-mismatch",
                "draft_vocab_size",
                f"draft_vocab_size {draft_vocab} exceeds the target's vocab_size {t_vocab}",
                f"is {ctx.target_path} the draft's target?",
            )
        )
    d2t = ctx.draft_tensors.get("d2t")
    if draft_vocab and t_vocab and draft_vocab != t_vocab and d2t is None:
        out.append(
            finding(
                "draft-vocab-mismatch",
                "error",
                "draft-d2t-missing",
                "d2t",
                f"draft vocab {draft_vocab} differs from the target's {t_vocab} but the draft has no d2t "
                "tensor, so vLLM maps draft token i to target token i",
                "re-export the draft with d2t",
            )
        )
    elif d2t is not None and draft_vocab and d2t.shape and d2t.shape[0] != draft_vocab:
        out.append(
            finding(
                "draft-vocab-mismatch",
                "error",
                "draft-d2t-shape",
                "d2t",
                f"d2t has {d2t.shape[0]} entries but draft_vocab_size is {draft_vocab}",
                "fix draft_vocab_size in the draft's config.json, or re-export d2t",
            )
        )
    t_hidden = config_int(ctx.target_text.get("hidden_size"))
    d_target_hidden = config_int(ctx.draft_config.get("target_hidden_size")) or config_int(
        layer.get("target_hidden_size")
    )
    if t_hidden and d_target_hidden and t_hidden != d_target_hidden:
        out.append(
            finding(
                "draft-vocab-mismatch",
                "error",
                "draft-hidden-mismatch",
                "target_hidden_size",
                f"the draft expects target hidden size {d_target_hidden}, the target has {t_hidden}",
                f"is {ctx.target_path} the draft's target?",
            )
        )
    return out


def qkv_prefix(ctx: RuleContext) -> None:
    """draft-qkv-prefix (vLLM < 0.26): the first draft layer's qkv_proj is built as `...layers.N.qkv_proj`
    (models/llama_eagle3.py before PR #48068), so an exclude entry that matches its 0.26+ name
    `...layers.N.self_attn.qkv_proj` but not the old one leaves it quantized: the 2*hidden qkv then fails
    load_qkv_weight."""
    from dataclasses import replace

    from quantkit.naming.exclude import is_excluded

    view = ctx.subject
    if not view.is_quark or not isinstance(view.qc, dict) or not isinstance(view.qc.get("exclude"), list):
        return
    exclude = [e for e in view.qc["exclude"] if isinstance(e, str)]
    qkv = [layer for layer in view.loaded.layers if layer.name.endswith(".self_attn.qkv_proj")]
    if not qkv:
        return
    first = min(qkv, key=lambda layer: layer.layer_index if layer.layer_index is not None else 0)
    old = replace(
        first,
        name=first.name.replace(".self_attn.qkv_proj", ".qkv_proj"),
        shards=tuple(s.replace(".self_attn.", ".") for s in first.shards),
    )
    try:
        now, then = is_excluded(first, exclude), is_excluded(old, exclude)
    except Exception:  # noqa: BLE001 - an invalid exclude list is exclude-matching's finding
        return
    if now and not then:
        ctx.findings.add(
            "error",
            "draft-qkv-prefix",
            first.name,
            f"vLLM {ctx.serving.vllm_version} names this layer {old.name} (the self_attn segment came "
            "with vLLM 0.26, PR #48068): the exclude entry that keeps it BF16 does not match there, so "
            "vLLM quantizes the 2*hidden qkv and fails to load it",
            f"serve with vLLM >= 0.26, or add the exclude entry {old.name!r}",
        )
