"""Acceptance length of a candidate (quantized draft, quantized target, or both as a pair) against the BF16 draft.

Both runs use the same prompts and settings; the baseline is always the BF16 target with the BF16 draft. The
candidate run swaps in the quantized draft (same target), the quantized target (same draft), or, in pair mode
(`candidate_target`), the quantized draft on the quantized target: the deployment as it will be served. AL = 1 + accepted draft tokens / drafts, as vLLM
(vllm/v1/spec_decode/metrics.py) and Quark report it; per-position acceptance rates = accepted at position i /
drafts; tokens per target forward = generated tokens / target forward passes. The candidate/baseline AL ratio
gets a paired bootstrap confidence interval over prompts.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any

from quantkit.acceptance import figures
from quantkit.acceptance.agreement import output_digest
from quantkit.engines.platform import vllm_refusal
from quantkit.engines.stats import Sampling, SequenceStats
from quantkit.errors import QuantkitError
from quantkit.io.checkpoint import resolve_source
from quantkit.io.config import MaxModelLen, fit_max_model_len, max_model_len
from quantkit.io.prompts import PromptRecord, load_prompts
from quantkit.naming.archs import NoVllmModelError, model_kind, require_vllm_model
from quantkit.progress import Progress, or_silent
from quantkit.results import AcceptanceResult, AcceptanceSettings, DraftAcceptance, PromptSource
from quantkit.specs import AcceptanceSpec
from quantkit.vocab import EAGLE3_DRAFT


class AcceptanceError(QuantkitError):
    """The acceptance run cannot go ahead as asked."""


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b rounded for reports; None when either figure could not be measured (no drafts)."""
    return round(a / b, 4) if a is not None and b else None


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _summarise(
    label: str,
    target: str,
    draft: str,
    records: list[PromptRecord],
    stats: list[SequenceStats],
    k: int,
    wall: float,
    seeds: list[int] | None = None,
) -> DraftAcceptance:
    """One run's figures (quantkit.acceptance.figures says which average each is); `records[i]` is the request of
    `stats[i]`, seeded `seeds[i]`."""
    drafts = sum(s.num_drafts for s in stats)
    accepted = sum(s.num_accepted for s in stats)
    per_pos = [sum(s.accepted_per_pos[i] for s in stats) for i in range(k)]
    tokens = sum(len(s.output_ids) for s in stats)
    forwards = sum(s.target_forwards for s in stats)
    domains: dict[str, list[tuple[PromptRecord, SequenceStats]]] = {}
    for r, s in zip(records, stats):
        domains.setdefault(r.domain, []).append((r, s))
    per_domain = {}
    for d, rs in sorted(domains.items()):
        ss = [s for _, s in rs]
        nd, na = sum(s.num_drafts for s in ss), sum(s.num_accepted for s in ss)
        per_domain[d] = {
            "mean_acceptance_length": figures.pooled_al(nd, na),
            "num_drafts": nd,
            "num_accepted": na,
            "prompts": len({r.id for r, _ in rs}),
            "macro_acceptance_length": figures.macro_al(ss),
        }
    return DraftAcceptance(
        label=label,
        target=target,
        draft=draft,
        mean_acceptance_length=figures.pooled_al(drafts, accepted),
        macro_acceptance_length=figures.macro_al(stats),
        expected_acceptance_length=figures.expected_al(stats),
        num_drafts=drafts,
        num_draft_tokens=sum(s.num_draft_tokens for s in stats),
        num_accepted=accepted,
        acceptance_rate_per_pos=[p / drafts if drafts else float("nan") for p in per_pos],
        accepted_length_histogram=figures.histogram(drafts, per_pos),
        conditional_acceptance_per_pos=figures.conditional_rates(drafts, per_pos),
        al_by_output_position=figures.al_by_output_position(stats),
        tokens_per_target_forward=tokens / forwards if forwards else float("nan"),
        generated_tokens=tokens,
        per_domain=per_domain,
        per_prompt=[
            {
                "id": r.id,
                "domain": r.domain,
                "num_drafts": s.num_drafts,
                "num_accepted": s.num_accepted,
                "generated_tokens": len(s.output_ids),
                "output_digest": output_digest(s.output_ids),
                "acceptance_length": figures.request_al(s),
                "expected_accepted": s.expected_accepted,
                "seed": seeds[i] if seeds else None,
                "turns": 1 + len(r.followups),
            }
            for i, (r, s) in enumerate(zip(records, stats))
        ],
        wall_s=round(wall, 3),
    )


def bootstrap_ratio_ci(
    base: list[tuple[int, float]],
    cand: list[tuple[int, float]],
    samples: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> list[float]:
    """Paired percentile bootstrap over prompts (or (prompt, seed) requests) of AL(candidate)/AL(baseline); items are
    (drafts, accepted), accepted being a count or an expected count."""
    rng = random.Random(seed)
    n = len(base)
    ratios = []
    for _ in range(samples):
        idx = [rng.randrange(n) for _ in range(n)]
        bd, ba = sum(base[i][0] for i in idx), sum(base[i][1] for i in idx)
        cd, ca = sum(cand[i][0] for i in idx), sum(cand[i][1] for i in idx)
        if bd == 0 or cd == 0:
            continue
        ratios.append((1 + ca / cd) / (1 + ba / bd))
    if not ratios:
        return [float("nan"), float("nan")]
    ratios.sort()
    lo = ratios[int((1 - level) / 2 * (len(ratios) - 1))]
    hi = ratios[int((1 + level) / 2 * (len(ratios) - 1))]
    return [round(lo, 4), round(hi, 4)]


FILLER_NAMES = ["Alice", "Bob", "Carol", "David", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jonas"]
FILLER_CITIES = ["Paris", "Rome", "Berlin", "Madrid", "Lisbon", "Vienna", "Prague", "Oslo", "Dublin", "Athens"]


def _note(i: int) -> str:
    return f"Note {i}: {FILLER_NAMES[i % 10]} lives in {FILLER_CITIES[(i * 3) % 10]}."


def with_context(
    record: PromptRecord,
    tokenizer,
    length: int,
    text: str | None = None,
    chat_template_kwargs: dict[str, Any] | None = None,
) -> PromptRecord:
    """The record with a preamble so that its prompt is about `length` tokens: the most of `text` (a real long text,
    cut at a token boundary of the target's tokenizer) or, without one, of deterministic synthetic reference notes,
    that keeps the prompt within `length`.

    The token count grows with the preamble, so its size is found by bisection: O(log length) tokenizer calls of at
    most `length` tokens each, where adding one piece at a time took O(length) calls (hours at 100k tokens)."""
    base = len(tokenizer(record.render(tokenizer, chat_template_kwargs), add_special_tokens=False)["input_ids"])
    if text is not None:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]

        def preamble_of(n: int) -> str:
            return tokenizer.decode(ids[:n]) + "\n\n" if n else ""

        cap: int | None = len(ids)
    else:

        def preamble_of(n: int) -> str:
            return " ".join(_note(i) for i in range(n)) + "\n\n" if n else ""

        cap = None

    def fits(n: int) -> bool:
        return base + len(tokenizer(preamble_of(n), add_special_tokens=False)["input_ids"]) <= length

    lo, hi = 0, 1  # fits(lo); find hi with not fits(hi), then bisect: the largest n that fits
    while fits(hi) and (cap is None or hi < cap):
        lo, hi = hi, hi * 2 if cap is None else min(hi * 2, cap)
    if cap is not None and hi == cap and fits(hi):
        lo = hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    preamble = preamble_of(lo)
    if record.messages is not None:
        first, *rest = record.messages
        messages = ({**first, "content": preamble + first["content"]}, *rest)
        return PromptRecord(f"{record.id}@{length}", record.domain, messages, None, record.followups)
    return PromptRecord(f"{record.id}@{length}", record.domain, None, preamble + (record.prompt or ""))


def cut_to_tokens(record: PromptRecord, tokenizer, tokens: int) -> PromptRecord:
    """A single-message record whose user text is cut to at most `tokens` tokens of the target's tokenizer (SPEED-Bench
    throughput prompts are built to N x 1000 o200k_base tokens; cutting again makes them N x 1000 target tokens at
    most, the head kept as speed.py `_pad_or_truncate_prompt` keeps it)."""
    assert record.messages is not None
    first, *rest = record.messages
    ids = tokenizer(first["content"], add_special_tokens=False)["input_ids"]
    if len(ids) <= tokens:
        return record
    return PromptRecord(
        record.id, record.domain, ({**first, "content": tokenizer.decode(ids[:tokens])}, *rest), None, record.followups
    )


# Static draft/target findings (quantkit check, headers only) that make a run meaningless or crash vLLM mid-load.
DRAFT_FIT_CODES = ("aux-layer-out-of-range", "aux-layer-ids", "hidden-size-mismatch", "vocab-size-mismatch")


def _refuse_misfit(draft: str, target: str) -> None:
    """Fail before any weight loads when the draft cannot run on the target (as `quantkit check --target` finds)."""
    from quantkit.rules.table import draft_fit_findings  # the rule table's rows, the same ones check runs

    findings = draft_fit_findings(draft, target)
    bad = next((f for f in findings if f.severity == "error" and f.code in DRAFT_FIT_CODES), None)
    if bad is not None:
        raise AcceptanceError(
            f"draft {draft} does not fit target {target}: {bad.code}: {bad.message}"
            + (f"; {bad.fix}" if bad.fix else "")
        )


def _refuse_too_long(limits: list[tuple[str, MaxModelLen]], lengths: list[int], max_new: int, k: int) -> None:
    """Before any model loads: the token budget the options imply fits every target (prompt + new + speculative
    tokens within the positions vLLM derives from its config; the reference engine is held to the same)."""
    for t, limit in limits:
        room = limit.tokens - max_new - k  # the longest prompt that still fits
        if room < 1:
            raise AcceptanceError(
                f"--max-new-tokens {max_new}: with --num-speculative-tokens {k} and a prompt of at "
                f"least one token, a sequence needs {max_new + k + 1} positions, but target {t} holds "
                f"{limit}; use --max-new-tokens {max(limit.tokens - k - 1, 1)} or less"
            )
        if lengths and lengths[-1] > room:
            raise AcceptanceError(
                f"--context-lengths {lengths[-1]}: with --max-new-tokens {max_new} and "
                f"--num-speculative-tokens {k}, a sequence needs {lengths[-1] + max_new + k} "
                f"positions, but target {t} holds {limit}; use lengths up to {room}"
            )


def _refuse_long_prompts(
    limits: list[tuple[str, MaxModelLen]], n_tokens: list[tuple[str, int]], prompts: str | Path, max_new: int, k: int
) -> None:
    """Once tokenized: every prompt (with its context preamble) fits every target with the new and speculative tokens;
    `n_tokens` holds (prompt id, tokens)."""
    if not n_tokens:
        return
    name, n = max(n_tokens, key=lambda item: item[1])
    for t, limit in limits:
        if n + max_new + k > limit.tokens:
            raise AcceptanceError(
                f"--prompts {prompts}: prompt {name!r} is {n} tokens, so with --max-new-tokens "
                f"{max_new} and --num-speculative-tokens {k} it needs {n + max_new + k} positions, "
                f"but target {t} holds {limit}; shorten it or lower --max-new-tokens"
            )


def _load_prompt_source(
    prompts: str | Path, speed_bench: str | Path | None
) -> tuple[list[PromptRecord], PromptSource, int | None]:
    """The records, where they came from (hash and revision, never the text), and the length a throughput config
    is cut to."""
    from quantkit.io.speed_bench import is_speed_bench, load_speed_bench, throughput_tokens

    if is_speed_bench(prompts):
        sb = load_speed_bench(str(prompts), speed_bench)
        return (
            sb.records,
            PromptSource(
                kind="speed-bench",
                name=sb.name,
                repo=sb.repo,
                revision=sb.revision,
                content_sha256=sb.content_sha256,
                files=sb.files,
            ),
            throughput_tokens(sb.config),
        )
    if speed_bench is not None:
        raise AcceptanceError(f"--speed-bench {speed_bench}: only with --prompts speed-bench:CONFIG[/CATEGORY]")
    records = load_prompts(prompts)
    if str(prompts) == "builtin":
        return records, PromptSource(kind="builtin", name="builtin"), None
    from quantkit.io.checkpoint import sha256_file

    return records, PromptSource(kind="jsonl", name=Path(prompts).name, content_sha256=sha256_file(Path(prompts))), None


def _load_context_text(context_source: str, speed_bench: str | Path | None) -> tuple[list[str], PromptSource]:
    """Long texts to cut context preambles from: a SPEED-Bench config's first turns, or a UTF-8 text file."""
    from quantkit.io.speed_bench import is_speed_bench, load_speed_bench

    if is_speed_bench(context_source):
        sb = load_speed_bench(context_source, speed_bench)
        texts = [r.messages[0]["content"] for r in sb.records if r.messages]
        return texts, PromptSource(
            kind="speed-bench",
            name=sb.name,
            repo=sb.repo,
            revision=sb.revision,
            content_sha256=sb.content_sha256,
            files=sb.files,
        )
    path = Path(context_source)
    if not path.is_file():
        raise AcceptanceError(
            f"--context-source {context_source}: not a file; pass a UTF-8 text file or "
            "speed-bench:throughput_32k (or another SPEED-Bench config)"
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (UnicodeDecodeError, OSError):
        raise AcceptanceError(f"--context-source {context_source}: cannot read it as UTF-8 text") from None
    if not text.strip():
        raise AcceptanceError(f"--context-source {context_source}: the file is empty")
    from quantkit.io.checkpoint import sha256_file

    return [text], PromptSource(kind="text", name=path.name, content_sha256=sha256_file(path))


def _requests(records: list[PromptRecord], seeds: list[int]) -> tuple[list[PromptRecord], list[int]]:
    """Every (prompt, seed) request: prompt i with seed s is seeded s + i, as one seed always was."""
    reqs = [(r, sd + i) for sd in seeds for i, r in enumerate(records)]
    return [r for r, _ in reqs], [sd for _, sd in reqs]


def _conversations(
    recs: list[PromptRecord],
    seeds: list[int],
    generate,
    tokenizer,
    chat_template_kwargs: dict[str, Any],
    room: int | None,
) -> list[SequenceStats]:
    """Generate every request, turn by turn: a multi-turn record's next user turn goes after the model's own reply to
    the previous one (ModelOpt specdec_bench run_loop); a request's counters are the sum over its turns.
    `generate(texts, seeds)` runs one batch; `room` is the longest prompt every target still holds."""
    stats = generate([r.render(tokenizer, chat_template_kwargs) for r in recs], seeds)
    convs = [list(r.messages or ()) for r in recs]
    last = [s.output_ids for s in stats]
    turn = 1
    while idx := [i for i, r in enumerate(recs) if len(r.followups) >= turn]:
        texts = []
        for i in idx:
            convs[i] += [
                {"role": "assistant", "content": tokenizer.decode(last[i], skip_special_tokens=True)},
                {"role": "user", "content": recs[i].followups[turn - 1]},
            ]
            text = tokenizer.apply_chat_template(
                convs[i], tokenize=False, add_generation_prompt=True, **chat_template_kwargs
            )
            n = len(tokenizer(text, add_special_tokens=False)["input_ids"])
            if room is not None and n > room:
                raise AcceptanceError(
                    f"prompt {recs[i].id!r}: turn {turn + 1} with the replies before it is {n} "
                    f"tokens, more than the {room} the target holds with --max-new-tokens; lower "
                    "--max-new-tokens or pick a category without long conversations"
                )
            texts.append(text)
        for i, more in zip(idx, generate(texts, [seeds[i] + 7919 * turn for i in idx])):
            last[i] = more.output_ids
            stats[i].merge(more)
        turn += 1
    return stats


def run_acceptance(
    target: str | Path,
    draft: str | Path,
    candidate: str | Path,
    spec: AcceptanceSpec | None = None,
    *,
    candidate_target: str | Path | None = None,
    progress: Progress | None = None,
    **settings: Any,
) -> AcceptanceResult:
    """Measure target + BF16 draft and the candidate on the same prompts and settings (an AcceptanceSpec, or its
    fields as keywords: SpecError naming the field when one is out of range).

    The candidate is a quantized draft (run on `target`), a quantized target (run with `draft`), or, with
    `candidate_target`, a quantized draft run on that quantized target (pair mode, candidate_kind "pair").
    Sampling follows vLLM (quantkit.engines.rejection); with temperature > 0 every prompt runs with `num_seeds`
    seeds and the expected AL (the acceptance coin flips averaged out) gets its own paired bootstrap CI.
    """
    spec = AcceptanceSpec.build(spec, **{k: str(v) if isinstance(v, Path) else v for k, v in settings.items()})
    progress = or_silent(progress)
    k = spec.num_speculative_tokens
    prompts, temperature, max_new_tokens, backend = spec.prompts, spec.temperature, spec.max_new_tokens, spec.backend
    context_lengths, seed, device, top_p, top_k = spec.context_lengths, spec.seed, spec.device, spec.top_p, spec.top_k
    draft_sample_method, num_seeds, speed_bench = spec.draft_sample_method, spec.num_seeds, spec.speed_bench
    chat_template_kwargs, context_source = spec.chat_template_kwargs, spec.context_source
    sampling = Sampling(
        temperature=temperature, top_p=top_p, top_k=max(top_k, 0), draft_sample_method=draft_sample_method
    )
    chat_kwargs = dict(chat_template_kwargs or {})
    target, draft, candidate = str(target), str(draft), str(candidate)
    cand_target = str(candidate_target) if candidate_target is not None else None
    configs: dict[str, dict[str, Any]] = {}
    for folder in (target, draft, candidate, cand_target):  # each checkpoint is read once, whatever role it plays
        if folder is not None and folder not in configs:
            configs[folder] = resolve_source(folder).config
    roles = [("--target", target, None), ("--draft", draft, EAGLE3_DRAFT)]
    if cand_target is not None:
        roles += [("--candidate-target", cand_target, None), ("--candidate", candidate, EAGLE3_DRAFT)]
    for role, folder, want in roles:
        kind = model_kind(configs[folder])
        if want and kind != want:
            pair = " (with --candidate-target, the candidate is the quantized draft)" if role == "--candidate" else ""
            raise AcceptanceError(f"{role} {folder}: is a {kind}, expected an EAGLE-3 draft{pair}")
        if role in ("--target", "--candidate-target") and kind == EAGLE3_DRAFT:
            raise AcceptanceError(f"{role} {folder}: is an EAGLE-3 draft; pass the model it drafts for")
    for (
        folder,
        config,
    ) in configs.items():  # an MoE-layer EAGLE-3 draft (naming/archs/eagle3_moe.py): no backend runs it
        try:
            require_vllm_model(config, folder)
        except NoVllmModelError as e:
            raise AcceptanceError(
                f"{folder}: quantkit's reference engine runs dense EAGLE-3 drafts only, and {e}"
            ) from None
    if cand_target is not None:
        candidate_kind = "pair"
        runs = [("baseline", target, draft), ("candidate", cand_target, candidate)]
    else:
        candidate_kind = "draft" if model_kind(configs[candidate]) == EAGLE3_DRAFT else "target"
        runs = [
            ("baseline", target, draft),
            (
                "candidate",
                candidate if candidate_kind == "target" else target,
                candidate if candidate_kind == "draft" else draft,
            ),
        ]
    limits = [(t, lim) for t in dict.fromkeys(t for _, t, _ in runs) if (lim := max_model_len(configs[t])) is not None]
    lengths = sorted(set(context_lengths or []))
    _refuse_too_long(limits, lengths, max_new_tokens, k)
    for tgt, drf in dict.fromkeys((t, d) for _, t, d in runs):  # the pair too: its draft on its own target
        _refuse_misfit(drf, tgt)
    records, source, cut = _load_prompt_source(prompts, speed_bench)
    context_texts, context_info = (
        _load_context_text(context_source, speed_bench) if context_source is not None else (None, None)
    )

    # one refusal for every checkpoint the runs load; auto falls back to the reference engine on any reason
    why_not_vllm = vllm_refusal({f: f for _, t, d in runs for f in (t, d)}, temperature=temperature)
    chosen = ("vllm" if why_not_vllm is None else "reference") if backend == "auto" else backend
    if chosen == "vllm" and why_not_vllm is not None:  # fail before any engine starts
        raise AcceptanceError(f"--backend vllm: {why_not_vllm}; use --backend reference")
    if chosen == "vllm" and draft_sample_method != "greedy":
        raise AcceptanceError(
            "--draft-sample-method probabilistic: quantkit starts vLLM with its default (greedy) "
            "draft sampling; use --backend reference"
        )

    from quantkit.io.hf import load_tokenizer

    tokenizer = load_tokenizer(target)
    if cut is not None:  # a throughput config: N x 1000 target tokens at most, within what every target holds
        fit = min([lim.tokens - max_new_tokens - k for _, lim in limits] or [cut])
        records = [cut_to_tokens(r, tokenizer, min(cut, max(fit - 64, 16))) for r in records]
    seeds = [seed + j for j in range(num_seeds)]
    reqs, req_seeds = _requests(records, seeds)
    prompt_sets: list[tuple[str, list[PromptRecord]]] = [("", reqs)]
    for n in lengths:
        if context_texts is None:
            prompt_sets.append((str(n), [with_context(r, tokenizer, n, None, chat_kwargs) for r in reqs]))
        else:
            texts = context_texts
            prompt_sets.append(
                (
                    str(n),
                    [
                        with_context(
                            r, tokenizer, n, "\n\n".join(texts[i % len(texts) :] + texts[: i % len(texts)]), chat_kwargs
                        )
                        for i, r in enumerate(reqs)
                    ],
                )
            )
    n_tokens = {
        key: [len(tokenizer(r.render(tokenizer, chat_kwargs), add_special_tokens=False)["input_ids"]) for r in recs]
        for key, recs in prompt_sets
    }
    _refuse_long_prompts(
        limits,
        [(r.id, n) for key, recs in prompt_sets for r, n in zip(recs, n_tokens[key])],
        prompts,
        max_new_tokens,
        k,
    )
    room = min((lim.tokens - max_new_tokens - k for _, lim in limits), default=None)

    results: dict[str, DraftAcceptance] = {}
    model_cache: dict[str, Any] = {}
    outputs: dict[str, list[list[int]]] = {}
    for label, tgt, drf in runs:
        by_len: dict[str, float | None] = {}
        summary = None
        for key, recs in prompt_sets:
            progress(f"{label}: {len(recs)} requests{f' at ~{key} tokens' if key else ''}, backend {chosen}")
            t0 = time.perf_counter()
            # slack for the speculative lookahead, never past what the target holds (vLLM refuses a longer one)
            mml = fit_max_model_len(configs[tgt], max(1024, max(n_tokens[key]) + max_new_tokens + k + 8))

            def generate(
                texts: list[str], sds: list[int], tgt: str = tgt, drf: str = drf, mml: int = mml
            ) -> list[SequenceStats]:
                if chosen == "vllm":
                    from quantkit.engines.vllm_engine import run_spec_decode

                    return run_spec_decode(
                        tgt,
                        drf,
                        texts,
                        k,
                        max_new_tokens,
                        temperature,
                        seed,
                        max_model_len=mml,
                        top_p=top_p,
                        top_k=top_k,
                        seeds=sds,
                    )
                from quantkit.engines.reference import run_reference

                return run_reference(
                    tgt, drf, texts, tokenizer, k, max_new_tokens, sampling, sds, device, model_cache, configs[tgt]
                )

            stats = _conversations(recs, req_seeds, generate, tokenizer, chat_kwargs, room)
            s = _summarise(label, tgt, drf, recs, stats, k, time.perf_counter() - t0, req_seeds)
            if key:
                by_len[key] = s.mean_acceptance_length
            else:
                summary = s
                outputs[label] = [st.output_ids for st in stats]
        assert summary is not None
        summary.by_context_length = by_len
        results[label] = summary
        progress(
            f"{label}: AL {_fmt(summary.mean_acceptance_length)} pooled, "
            f"{_fmt(summary.macro_acceptance_length)} macro, over {summary.num_drafts} drafts"
        )

    base, cand = results["baseline"], results["candidate"]
    base.model = draft  # whose figures each run is: the BF16 draft, and the candidate (a draft or a target)
    cand.model = candidate
    pairs = lambda d: [(p.num_drafts, p.num_accepted) for p in d.per_prompt]  # noqa: E731
    expected = lambda d: [(p.num_drafts, p.expected_accepted) for p in d.per_prompt]  # noqa: E731
    have_expected = base.expected_acceptance_length is not None and cand.expected_acceptance_length is not None
    return AcceptanceResult(
        backend=chosen,
        spec=spec,
        settings=AcceptanceSettings(
            num_speculative_tokens=k,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            draft_sample_method=draft_sample_method,
            chat_template_kwargs=chat_kwargs,
            max_new_tokens=max_new_tokens,
            prompts=str(prompts),
            num_prompts=len(records),
            seed=seed,
            num_seeds=num_seeds,
            context_lengths=lengths,
            context_source=context_info.name if context_info else None,
            prompt_source=source,
            context_text_source=context_info,
        ),
        baseline=base,
        candidate=cand,
        ratio=_ratio(cand.mean_acceptance_length, base.mean_acceptance_length),
        ratio_ci=bootstrap_ratio_ci(pairs(base), pairs(cand), seed=seed),
        per_domain_ratio={d: _ratio(cand.domain_al(d), v.mean_acceptance_length) for d, v in base.per_domain.items()},
        context_length_ratio={n: _ratio(cand.by_context_length.get(n), v) for n, v in base.by_context_length.items()},
        candidate_kind=candidate_kind,
        candidate_target=cand_target,
        greedy_outputs_identical=(outputs["baseline"] == outputs["candidate"]) if temperature == 0 else None,
        macro_ratio=_ratio(cand.macro_acceptance_length, base.macro_acceptance_length),
        expected_ratio=_ratio(cand.expected_acceptance_length, base.expected_acceptance_length)
        if have_expected
        else None,
        expected_ratio_ci=bootstrap_ratio_ci(expected(base), expected(cand), seed=seed) if have_expected else None,
    )
