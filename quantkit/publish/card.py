"""The model card (README.md) of a published checkpoint: metadata (base model, tags, model-index) from quantkit.json (results.ApplyResult) and the gate report (results.CandidateReport), and a body that says what was quantized and kept and why, how to serve it, how it measured, and how it was made."""

from __future__ import annotations

import json
import math
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeGuard

from quantkit.io.markdown import Markup, md_code, md_text
from quantkit.publish.bundle import Publication, prepare
from quantkit.publish.charts import CHART
from quantkit.publish.folder import (
    DEFAULT_NUM_SPECULATIVE_TOKENS,
    MANIFEST,
    QUARK_URL,
    TARGET_PLACEHOLDER,
)
from quantkit.publish.sidecar import BUILTIN_PROMPTS, SIDECAR, prompt_set_name
from quantkit.results import ApplyResult, CandidateReport, LayerDecision
from quantkit.vocab import EAGLE3_DRAFT, MOE_TARGET

if TYPE_CHECKING:
    from huggingface_hub import ModelCard


# --- the model card -----------------------------------------------------------------------------------------------


def _formats(manifest: ApplyResult) -> list[str]:
    schemes = {str(d.scheme) for d in manifest.quantized}
    schemes.add(str(manifest.recipe.get("scheme", "")))
    found = []
    for fmt in ("mxfp4", "fp8"):
        if any(fmt in s for s in schemes):
            found.append(fmt)
    return found


def _kept_roles(manifest: ApplyResult) -> set[str]:
    return {d.role for d in manifest.kept}


def card_tags(manifest: ApplyResult) -> list[str]:
    tags = ["amd-quark", "quantkit", *_formats(manifest)]
    if manifest.model_kind == EAGLE3_DRAFT:
        tags += ["eagle3", "draft-model", "speculative-decoding"]
        if "lm_head" in _kept_roles(manifest):
            tags.append("no-lm-head-quantization")
    elif manifest.model_kind == MOE_TARGET:
        tags.append("moe")
    return tags


def _cell(value: Any) -> str:
    """A table cell: input escaped (quantkit.io.markdown.md_text: HTML, controls, pipes, newlines); Markup as is."""
    return md_text(value)


def _fmt(value: float | None, digits: int = 3) -> str:
    """A figure: `-` when absent, "not measured" when the report holds NaN or an infinity instead of a figure."""
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if math.isfinite(value) else NOT_MEASURED


NOT_MEASURED = "not measured"


_OPS = ("<=", ">=", "<", ">", "==")


def _threshold(op: str | None, shown: str) -> Markup | str:
    """`<= 0.95` as written: a comparison from the closed set is quantkit's own text; anything else is escaped."""
    if op in _OPS:
        return Markup(f"{op} {md_text(shown)}".strip())
    return f"{op or ''} {shown}".strip()


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return lines


def _command(manifest: ApplyResult, target: str | None) -> tuple[str, bool]:
    """The recorded command with the executable shortened to `quantkit`, and whether it was a quantkit command
    (apply called through the Python API records the interpreter's argv instead)."""
    recorded = manifest.command.strip()
    head, _, rest = recorded.partition(" ")
    if Path(head).name == "quantkit":
        return f"quantkit {rest}".strip(), True
    recipe = manifest.recipe.get("name", "RECIPE")
    cmd = f"quantkit apply --recipe {recipe} --model {manifest.source or 'MODEL'} --output OUTPUT"
    if manifest.model_kind == EAGLE3_DRAFT and (target or manifest.target_num_layers):
        cmd += f" --target {target or TARGET_PLACEHOLDER}"
    if manifest.path:
        cmd += f" --path {manifest.path}"
    return cmd, False


def _layer_groups(layers: list[LayerDecision]) -> list[list[Any]]:
    groups: dict[tuple[str, str, str, str], list[str]] = {}
    for d in layers:
        key = (d.role, d.action, d.scheme or "bf16", d.reason)
        groups.setdefault(key, []).append(d.runtime_name)
    rows = []
    for (role, action, scheme, reason), names in groups.items():
        shown = ", ".join(md_code(n) for n in names[:3]) + (f", ... ({len(names)} in all)" if len(names) > 3 else "")
        rows.append([role, action, scheme, Markup(shown), reason])
    return rows


def _dataset_name(prompts: str | None) -> str:
    """The prompt set as model-index names it: quantkit's bundled set, or the prompt file's name (no local path)."""
    if prompts == BUILTIN_PROMPTS:
        return "quantkit-builtin"
    return prompt_set_name(prompts) or "quantkit-prompts"


def _finite(value: float | None) -> TypeGuard[float]:
    return value is not None and math.isfinite(value)


def _eval_results(report: CandidateReport, model_name: str) -> list[Any]:
    from huggingface_hub import EvalResult

    results = []
    acc = report.acceptance
    # A figure that is NaN or infinite is not measured: model-index gets no entry for it (YAML would say .nan).
    if acc is not None and acc.candidate is not None and _finite(acc.candidate.mean_acceptance_length):
        k = acc.settings.num_speculative_tokens or DEFAULT_NUM_SPECULATIVE_TOKENS
        dataset = _dataset_name(acc.settings.prompts)
        results.append(
            EvalResult(
                task_type="text-generation",
                task_name="EAGLE-3 speculative decoding acceptance",
                dataset_type=dataset,
                dataset_name=dataset,
                metric_type="mean_acceptance_length",
                metric_name=f"mean acceptance length (k={k})",
                metric_value=round(acc.candidate.mean_acceptance_length, 4),
            )
        )
        if _finite(acc.ratio):
            results.append(
                EvalResult(
                    task_type="text-generation",
                    task_name="EAGLE-3 speculative decoding acceptance",
                    dataset_type=dataset,
                    dataset_name=dataset,
                    metric_type="acceptance_length_ratio",
                    metric_name="acceptance length ratio vs the BF16 draft",
                    metric_value=round(acc.ratio, 4),
                )
            )
    if report.eval is not None:
        for t in report.eval.tasks:
            if not _finite(t.candidate):
                continue
            results.append(
                EvalResult(
                    task_type="text-generation",
                    task_name=t.task,
                    dataset_type=t.task,
                    dataset_name=t.task,
                    metric_type=t.metric,
                    metric_value=round(t.candidate, 4),
                )
            )
    return results


def build_model_card(
    folder: str | Path,
    report: CandidateReport | str | Path | dict[str, Any] | None = None,
    repo_id: str | None = None,
    base_model: str | None = None,
    target: str | None = None,
) -> ModelCard:
    """The model card (README.md) for an output folder: metadata from quantkit.json and the report, and a body
    that says what was quantized and kept and why, how it was made, how to serve it, and how it measured. Models
    are named by Hub id (`base_model`, `target`, `repo_id`), never by a local path."""
    return render_card(prepare(folder, report, repo_id=repo_id, base_model=base_model, target=target))


def _serve_section(pub: Publication) -> list[str]:
    manifest, repo, target = pub.manifest, pub.repo_id, pub.target_ref
    kind = manifest.model_kind
    body = ["", "## Serve with vLLM on ROCm", ""]
    deploy = pub.deploy_json
    if deploy is not None:
        platform = {"gfx950": "AMD Instinct MI355X (gfx950)", "gfx942": "AMD Instinct MI300X (gfx942)"}.get(
            str(deploy.get("platform")), str(deploy.get("platform"))
        )
        body += [
            f"On {platform} with vLLM's ROCm build (for example AMD's `rocm/vllm` container); vLLM reads the "
            "Quark `quantization_config` from config.json, no extra flag is needed.",
            "",
        ]
        # The placeholder stays unquoted so that it reads as one; every real argument is shell-quoted.
        command = " ".join(a if a == TARGET_PLACEHOLDER else shlex.quote(a) for a in deploy.get("argv", []))
        env = deploy.get("env") or []
        body += ["```bash", *(f"export {e['name']}={shlex.quote(str(e['value']))}" for e in env), command, "```"]
        if env:
            body += ["", *_table(["environment", "value", "why"], [[e["name"], e["value"], e["why"]] for e in env])]
        body += [
            "",
            "Set `--tensor-parallel-size` to your GPU count: `quantkit deploy --tp N` checks a size against "
            "this checkpoint (attention heads, MXFP4 scale groups). `deploy.json` in this repo holds this "
            "command, the environment with each variable's source, and the checks.",
        ]
        predicted = deploy.get("predicted_backends") or {}
        if predicted:
            body += [
                "",
                f"vLLM {deploy.get('vllm_version') or ''} is predicted to run the served target's layers "
                f"on {platform} with: "
                + ", ".join(f"{k} `{v}`" for k, v in predicted.items())
                + " (`quantkit deploy`, from the checkpoint's headers; `kernel_paths` in `deploy.json` has "
                "every layer group).",
            ]
        findings = deploy.get("findings") or []
        if findings:
            from quantkit.results.check import Finding

            body += ["", "Found by `quantkit deploy` for this command:", ""]
            body += [f"- {md_text(Finding.model_validate(f).sentence())}" for f in findings]
    else:
        body += [
            "On AMD Instinct GPUs with vLLM's ROCm build (for example AMD's `rocm/vllm` container); vLLM reads "
            "the Quark `quantization_config` from config.json, no extra flag is needed.",
            "",
        ]
        if kind == EAGLE3_DRAFT:
            spec_config: dict[str, Any] = {
                "method": "eagle3",
                "model": repo,
                "num_speculative_tokens": pub.num_speculative_tokens,
            }
            if pub.k_schedule:  # vllm/config/speculative.py SpeculativeConfig.num_speculative_tokens_per_batch_size
                spec_config["num_speculative_tokens_per_batch_size"] = [list(r) for r in pub.k_schedule]
            spec = json.dumps(spec_config)
            body += ["```bash", f"vllm serve {target or TARGET_PLACEHOLDER} --speculative-config '{spec}'", "```"]
        else:
            body += ["```bash", f"vllm serve {repo}", "```"]
        body += [
            "",
            f"No `deploy.json` in this repo: {md_text(pub.deploy_missing)}; `quantkit deploy` with the checkpoint "
            "folders writes the checked command and environment.",
        ]
    if kind == EAGLE3_DRAFT and pub.k_schedule:
        body += [
            "",
            "The speculative config carries the K per batch size that `quantkit bench` measured fastest "
            f"(`num_speculative_tokens_per_batch_size` {[list(r) for r in pub.k_schedule]}: inclusive batch-size "
            "ranges and their K; see the speedup section for where it was measured).",
        ]
    elif kind == EAGLE3_DRAFT and pub.k_schedule_note:
        body += ["", f"No K schedule in the command: {md_text(pub.k_schedule_note)}."]
    if kind == EAGLE3_DRAFT and pub.measured_target:
        about = f" ({md_text(pub.measured_target_about)})" if pub.measured_target_about else ""
        body += [
            "",
            f"This is the pair the gate measured: this draft served on {md_code(pub.measured_target)}{about}; the "
            "acceptance figures below, the command and the predicted backends are for that target.",
        ]
    if kind == EAGLE3_DRAFT:
        if not target:
            n = manifest.target_num_layers
            layers = f" ({n} decoder layers)" if n else ""
            body += [
                "",
                f"Replace `{TARGET_PLACEHOLDER}` with "
                + (
                    f"the Hub id of {md_code(pub.measured_target)}{layers}, the target the gate measured this draft on."
                    if pub.measured_target
                    else f"the target model this draft was trained for{layers}."
                ),
            ]
        body += ["", "This repo is a draft: it only runs next to its target model."]
    return body


def _acceptance_section(pub: Publication) -> list[str]:
    rep, kind = pub.report, pub.manifest.model_kind
    body = ["", "## Acceptance: BF16 draft vs quantized draft" if kind == EAGLE3_DRAFT else "## Acceptance", ""]
    acc = rep.acceptance if rep else None
    side = pub.sidecar
    if acc is not None and side is not None:
        b, c = acc.baseline, acc.candidate
        prompts = side.prompt_set
        settings = ", ".join(
            x
            for x in (
                f"backend {md_text(side.engine)}" + (f" {md_text(side.engine_version)}" if side.engine_version else "")
                if side.engine
                else "",
                f"{side.num_speculative_tokens} speculative tokens" if side.num_speculative_tokens else "",
                f"{prompts.num_prompts} prompts" if prompts.num_prompts else "",
                f"prompt set {md_text(prompts.name)}" + (f" (sha256 `{prompts.sha256[:16]}`)" if prompts.sha256 else "")
                if prompts.name
                else "",
            )
            if x
        )
        pair = acc.candidate_kind == "pair"
        body += [
            "Acceptance length, pooled (AL = 1 + sum of accepted draft tokens / sum of drafts over all requests, "
            "vLLM's average) and macro (the mean of per-request AL, ModelOpt specdec_bench's average), "
            + (
                "the quantized draft on the quantized target against the BF16 draft on the BF16 target, same "
                "prompts and settings"
                if pair
                else "same target, prompts and settings"
            )
            + (f" ({settings})" if settings else "")
            + ".",
            "",
        ]
        rows = []
        for domain in ["all", *acc.domains()]:
            bv = b.mean_acceptance_length if (b and domain == "all") else (b.domain_al(domain) if b else None)
            cv = c.mean_acceptance_length if (c and domain == "all") else (c.domain_al(domain) if c else None)
            ratio = (
                acc.ratio if domain == "all" and acc.ratio is not None else (cv / bv if bv and cv is not None else None)
            )
            cm = (
                (
                    c.macro_acceptance_length
                    if domain == "all"
                    else (c.per_domain[domain].macro_acceptance_length if domain in c.per_domain else None)
                )
                if c
                else None
            )
            rows.append([Markup("**all**") if domain == "all" else domain, _fmt(bv), _fmt(cv), _fmt(ratio), _fmt(cm)])
        body += _table(
            [
                "domain",
                "BF16 draft AL (pooled)",
                "quantized draft AL (pooled)",
                "ratio (pooled)",
                "quantized draft AL (macro)",
            ],
            rows,
        )
        st = acc.settings
        if st.temperature:
            body += [
                "",
                f"Sampled: temperature {st.temperature}, top_p {st.top_p}, top_k {st.top_k}, draft sampling "
                f"{md_text(st.draft_sample_method)}, {st.num_seeds} seed(s)"
                + (f"; expected AL ratio {_fmt(acc.expected_ratio)}" if acc.expected_ratio else "")
                + ".",
            ]
        src = st.prompt_source
        if src is not None and src.kind == "speed-bench":
            body += [
                "",
                f"Prompts: {md_text(src.name)} from {md_code(src.repo or 'a local copy')}"
                + (f" at revision {md_code(src.revision)}" if src.revision else "")
                + (f", files sha256 `{src.content_sha256[:16]}`" if src.content_sha256 else "")
                + " (not redistributed here: NVIDIA Evaluation Dataset License).",
            ]
        if acc.ratio_ci:
            figures = [acc.ratio, *acc.ratio_ci]
            if all(v is not None and math.isfinite(v) for v in figures):
                body += ["", f"AL ratio {_fmt(acc.ratio)}, 95% CI [{_fmt(acc.ratio_ci[0])}, {_fmt(acc.ratio_ci[1])}]."]
            else:
                body += [
                    "",
                    f"AL ratio and its 95% CI: {NOT_MEASURED} (the gate report holds NaN or an infinity "
                    "in place of a figure: too few drafts or prompts to compute them; run the gate again "
                    "with more prompts).",
                ]
        if pub.chart:
            body += ["", f"![Acceptance rate per position and AL per domain, BF16 vs quantized]({CHART})"]
        body += [
            "",
            f"`{SIDECAR}` in this repo holds these figures (per-position rates, AL per domain, K, the "
            "prompt set's SHA-256, engine and version, both runs) in a versioned format.",
        ]
    else:
        body += [
            "Not measured: no gate report was given when this card was made (`quantkit publish --report`)."
            if rep is None
            else "Not measured: the gate report has no acceptance figures."
        ]
    return body


def _speedup_section(pub: Publication) -> list[str]:
    """The served speedup of the gate's bench step (quantkit.bench.tables: the gate report's renderer), or nothing
    when the report has no bench."""
    if pub.speedup is None:
        return []
    from quantkit.bench.tables import speedup_markdown

    platform = pub.deploy_json.get("platform") if pub.deploy_json else None
    return [
        "",
        "## Served speedup (quantkit bench)",
        "",
        "Output tokens/s served by `vllm serve` under vLLM's own serving benchmark: the target alone, with the "
        "BF16 draft, and with this draft, same server settings; medians over repeats, 95% bootstrap CIs.",
        "",
        *speedup_markdown(pub.speedup, str(platform) if platform else None),
        "",
        f"`{SIDECAR}` in this repo holds these figures under `speedup`.",
    ]


def _redaction_note(pub: Publication) -> list[str]:
    fields = [f for f in pub.redacted if f in ("source", "output", "target", "command")]
    if not pub.redacted:
        return []
    names = {
        "source": "`source` names the base model" + (f" (`{pub.base_ref}`)" if pub.base_ref else " by its folder name"),
        "output": "`output` is the folder's name",
        "target": "`target` names the draft's target"
        + (f" (`{pub.apply_target_ref}`)" if pub.apply_target_ref else " by its folder name"),
        "command": "`command` is rewritten with these names",
    }
    what = "; ".join(names[f] for f in fields)
    other = (
        " Other absolute paths were replaced by their base names." if any(f not in names for f in pub.redacted) else ""
    )
    return [
        "",
        f"Local paths of the machine that ran `apply` are not published: in this repo's `{MANIFEST}`, {what}.{other}",
    ]


def _record_kept_lines(pub: Publication) -> list[str]:
    """What every quantkit recipe keeps in this model's family or draft layout, with the reasons, from its record
    (the `quantkit families` listing): the tensors that are no layer above (norms, d2t/t2d) included; [] for a
    config no record names."""
    from quantkit.errors import QuantkitError
    from quantkit.naming.archs import family_of
    from quantkit.naming.catalog import kept_parts

    try:
        family = family_of(json.loads((pub.folder / "config.json").read_text()))
    except (OSError, ValueError, QuantkitError):
        return []
    out = ["", f"Kept in every quantkit output of {md_code(family.name)} (`quantkit families`):", ""]
    return out + [f"- {md_text(k.part)}: {md_text(k.reason)}" for k in kept_parts(family)]


def _draft_vocab_lines(pub: Publication) -> list[str]:
    """A pruned draft's lm_head (`apply --draft-vocab`: rows kept, from which corpus, why) and the option `quantkit
    tune --apply` chose (tune.json: AL ratio measured, saving estimated from bytes); [] when neither."""
    from quantkit.results import load_tune_option

    dv = pub.manifest.draft_vocab
    tuned = load_tune_option(pub.folder)
    if dv is None and tuned is None:
        return []
    out = ["", "## Draft vocabulary and tuning", ""]
    if dv is not None:
        coverage = f", covering {dv.coverage:.1%} of its {dv.corpus_tokens:,} tokens" if dv.coverage is not None else ""
        out.append(
            f"The lm_head keeps {dv.rows_after:,} of {dv.rows_before:,} rows (target vocabulary "
            f"{dv.target_vocab_size:,}): the most frequent target tokens of `{Path(dv.corpus).name}`{coverage}, "
            f"special and EOS tokens always kept. Why: {dv.reason}"
        )
    if tuned is not None:
        ratio = f"{tuned.al_ratio:.3f}" if tuned.al_ratio is not None else "not measured"
        saving = (
            f"{1 - tuned.cost_ratio:.0%} less time per accepted token than the unpruned BF16 draft "
            f"(estimate from bytes, not a measurement)"
            if tuned.cost_ratio is not None
            else "no cost estimate"
        )
        if dv is not None:
            out.append("")
        out += [
            f"Chosen by `quantkit tune`: body {tuned.body}, {tuned.draft_vocab:,} "
            f"rows, K {tuned.k}; AL ratio against the unpruned BF16 draft {ratio} (measured); {saving}. "
            "`quantkit deploy` serves it with this K."
        ]
    return out


def render_card(pub: Publication) -> ModelCard:
    """The card of a prepared publication (bundle.prepare)."""
    from huggingface_hub import ModelCard, ModelCardData

    manifest = pub.manifest
    rep = pub.report
    repo = pub.repo_id
    name = repo.split("/")[-1]
    kind = manifest.model_kind
    recipe = manifest.recipe
    base = pub.base_ref
    formats = _formats(manifest)

    data = ModelCardData(
        base_model=base,
        library_name="transformers",
        tags=card_tags(manifest),
        pipeline_tag=None if kind == EAGLE3_DRAFT else "text-generation",
        base_model_relation="quantized",
    )
    results = _eval_results(rep, name) if rep else []
    if results:  # model-index needs a model name; without results neither key is written
        data.model_name, data.eval_results = name, results

    what = {EAGLE3_DRAFT: "EAGLE-3 draft model", MOE_TARGET: "mixture-of-experts model"}.get(kind, "model")
    source_md = f"[{md_text(base)}](https://huggingface.co/{base})" if base else md_code(manifest.source or "unknown")
    body: list[str] = [f"# {md_text(name)}", ""]
    body.append(
        f"{' + '.join(f.upper() for f in formats) or 'Quantized'} {what} ({md_text(manifest.architecture)}), "
        f"quantized from {source_md} with [AMD Quark]({QUARK_URL}) by quantkit recipe "
        f"{md_code(recipe.get('name'))} (Quark scheme {md_code(recipe.get('scheme'))})"
        + (f": {md_text(str(recipe['description']).rstrip('.'))}." if recipe.get("description") else ".")
    )
    before, after = manifest.size_before_bytes, manifest.size_after_bytes
    if before > 0:
        body += ["", f"Weights: {before / 1e6:,.2f} MB -> {after / 1e6:,.2f} MB ({after / before:.2f}x)."]

    layers = manifest.layers
    n_q = len(manifest.quantized)
    body += [
        "",
        "## What was quantized and what was kept",
        "",
        f"{n_q} layers quantized, {len(layers) - n_q} kept in high precision. Layer names are vLLM's runtime "
        "names, which are what config.json's `exclude` lists, so vLLM loads every kept layer unquantized.",
        "",
    ]
    body += _table(["role", "action", "scheme", "layers (vLLM names)", "why"], _layer_groups(layers))
    body += ["", f"`quantization_config.exclude`: {', '.join(md_code(e) for e in manifest.exclude) or 'none'}"]
    body += _record_kept_lines(pub)
    body += _draft_vocab_lines(pub)
    if len(layers) > 3:
        body += ["", "<details><summary>Every layer</summary>", ""]
        body += _table(
            ["vLLM layer", "checkpoint modules", "action", "scheme"],
            [[d.runtime_name, ", ".join(d.checkpoint_modules), d.action, d.scheme or "bf16"] for d in layers],
        )
        body += ["", "</details>"]

    body += _serve_section(pub)
    body += _acceptance_section(pub)
    body += _speedup_section(pub)

    body += ["", "## Quality (lm-eval)", ""]
    if rep and rep.eval and rep.eval.tasks:
        body += _table(
            ["task", "metric", "baseline", "quantized", "delta", "recovery"],
            [
                [t.task, t.metric, _fmt(t.baseline, 4), _fmt(t.candidate, 4), _fmt(t.delta, 4), _fmt(t.recovery, 4)]
                for t in rep.eval.tasks
            ],
        )
        if pub.chart and pub.sidecar is None:
            body += ["", f"![lm-eval deltas with their 95% intervals]({CHART})"]
    elif kind == EAGLE3_DRAFT:
        body += [
            "Does not apply to a draft: lm-eval scores the text a model generates, and a draft's tokens are "
            "only kept where the target accepts them, so the target's own output is unchanged; the acceptance "
            "figures above are the draft's quality measure."
        ]
    else:
        body += [
            "Not measured: the gate report has no eval section."
            if rep
            else "Not measured: no gate report was given when this card was made (`quantkit publish --report`)."
        ]
    if rep and rep.gate and rep.gate.passed is not None:
        body += ["", f"## Gate: {'passed' if rep.gate.passed else 'FAILED'}", ""]
        if rep.gate.checks:
            body += _table(
                ["check", "value", "threshold", "passed"],
                [
                    [
                        ch.name,
                        ch.shown(ch.value) if ch.value is not None else f"not measured: {ch.message or 'no value'}",
                        _threshold(ch.op, ch.shown(ch.threshold)),
                        {True: "yes", False: "no", None: "-"}[ch.passed],
                    ]
                    for ch in rep.gate.checks
                ],
            )

    command, exact = _command(manifest, pub.apply_target_ref or manifest.target)  # (manifest: public names)
    body += ["", "## How it was made", "", "```bash", command, "```"]
    if not exact:
        body += ["", "(quantized through quantkit's Python API; the line above is the equivalent command)"]
    versions = manifest.versions
    if versions:
        body += ["", *_table(["package", "version"], [[k, v] for k, v in versions.items()])]
    sources = manifest.source_files
    if sources:
        body += ["", "<details><summary>Source files (sha256)</summary>", ""]
        body += _table(["file", "sha256"], [[f, f"`{h}`"] for f, h in sources.items()])
        body += ["", "</details>"]
    body += ["", f"`{MANIFEST}` in this repo holds the full record: recipe, per-layer decisions, versions, timings."]
    body += _redaction_note(pub)
    body += [""]
    yaml_block = data.to_yaml(original_order=["base_model", "base_model_relation", "library_name", "pipeline_tag"])
    # Every input is already public; this only guards the card against a local path that slipped through.
    return ModelCard(pub.redactor.known(f"---\n{yaml_block}\n---\n\n" + "\n".join(body)))
