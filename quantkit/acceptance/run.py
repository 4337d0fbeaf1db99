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

from quantkit.acceptance.agreement import output_digest
from quantkit.engines.platform import vllm_refusal
from quantkit.engines.stats import SequenceStats
from quantkit.errors import QuantkitError
from quantkit.io.checkpoint import resolve_source
from quantkit.io.config import MaxModelLen, fit_max_model_len, max_model_len
from quantkit.io.prompts import PromptRecord, load_prompts
from quantkit.naming.archs import model_kind
from quantkit.progress import Progress, or_silent
from quantkit.results import AcceptanceResult, AcceptanceSettings, DraftAcceptance
from quantkit.vocab import EAGLE3_DRAFT


class AcceptanceError(QuantkitError):
    """The acceptance run cannot go ahead as asked."""


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b rounded for reports; None when either figure could not be measured (no drafts)."""
    return round(a / b, 4) if a is not None and b else None


def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def _summarise(label: str, target: str, draft: str, records: list[PromptRecord], stats: list[SequenceStats],
               k: int, wall: float) -> DraftAcceptance:
    drafts = sum(s.num_drafts for s in stats)
    accepted = sum(s.num_accepted for s in stats)
    per_pos = [sum(s.accepted_per_pos[i] for s in stats) for i in range(k)]
    tokens = sum(len(s.output_ids) for s in stats)
    forwards = sum(s.target_forwards for s in stats)
    domains: dict[str, list[SequenceStats]] = {}
    for r, s in zip(records, stats):
        domains.setdefault(r.domain, []).append(s)
    per_domain = {}
    for d, ss in sorted(domains.items()):
        nd, na = sum(s.num_drafts for s in ss), sum(s.num_accepted for s in ss)
        per_domain[d] = {"mean_acceptance_length": 1 + na / nd if nd else float("nan"), "num_drafts": nd,
                         "num_accepted": na, "prompts": len(ss)}
    return DraftAcceptance(
        label=label, target=target, draft=draft,
        mean_acceptance_length=1 + accepted / drafts if drafts else float("nan"),
        num_drafts=drafts, num_draft_tokens=sum(s.num_draft_tokens for s in stats), num_accepted=accepted,
        acceptance_rate_per_pos=[p / drafts if drafts else float("nan") for p in per_pos],
        tokens_per_target_forward=tokens / forwards if forwards else float("nan"), generated_tokens=tokens,
        per_domain=per_domain,
        per_prompt=[{"id": r.id, "domain": r.domain, "num_drafts": s.num_drafts, "num_accepted": s.num_accepted,
                     "generated_tokens": len(s.output_ids), "output_digest": output_digest(s.output_ids)}
                    for r, s in zip(records, stats)],
        wall_s=round(wall, 3),
    )


def bootstrap_ratio_ci(base: list[tuple[int, int]], cand: list[tuple[int, int]], samples: int = 2000,
                       seed: int = 0, level: float = 0.95) -> list[float]:
    """Paired percentile bootstrap over prompts of AL(candidate)/AL(baseline); items are (drafts, accepted)."""
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


def with_context(record: PromptRecord, tokenizer, length: int) -> PromptRecord:
    """The record with a deterministic reference-notes preamble so that its prompt is about `length` tokens: the most
    notes whose preamble keeps the prompt within `length`.

    The token count grows with the number of notes, so the number is found by bisection: O(log length) tokenizer calls
    of at most `length` tokens each, where adding one note at a time took O(length) calls (hours at 100k tokens)."""
    base = len(tokenizer(record.render(tokenizer), add_special_tokens=False)["input_ids"])

    def fits(n: int) -> bool:
        preamble = " ".join(_note(i) for i in range(n)) + "\n\n"
        return base + len(tokenizer(preamble, add_special_tokens=False)["input_ids"]) <= length

    lo, hi = 0, 1  # fits(lo); find hi with not fits(hi), then bisect: the largest n that fits
    while fits(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    notes = [_note(i) for i in range(lo)]
    preamble = " ".join(notes) + "\n\n" if notes else ""
    if record.messages is not None:
        first, *rest = record.messages
        messages = ({**first, "content": preamble + first["content"]}, *rest)
        return PromptRecord(f"{record.id}@{length}", record.domain, messages, None)
    return PromptRecord(f"{record.id}@{length}", record.domain, None, preamble + (record.prompt or ""))


# Static draft/target findings (quantkit check, headers only) that make a run meaningless or crash vLLM mid-load.
DRAFT_FIT_CODES = ("aux-layer-out-of-range", "aux-layer-ids", "hidden-size-mismatch", "vocab-size-mismatch")


def _refuse_misfit(draft: str, target: str) -> None:
    """Fail before any weight loads when the draft cannot run on the target (as `quantkit check --target` finds)."""
    from quantkit.rules.table import draft_fit_findings  # the rule table's rows, the same ones check runs

    findings = draft_fit_findings(draft, target)
    bad = next((f for f in findings if f.severity == "error" and f.code in DRAFT_FIT_CODES), None)
    if bad is not None:
        raise AcceptanceError(f"draft {draft} does not fit target {target}: {bad.code}: {bad.message}"
                              + (f"; {bad.fix}" if bad.fix else ""))


def _refuse_too_long(limits: list[tuple[str, MaxModelLen]], lengths: list[int], max_new: int, k: int) -> None:
    """Before any model loads: the token budget the options imply fits every target (prompt + new + speculative
    tokens within the positions vLLM derives from its config; the reference engine is held to the same)."""
    for t, limit in limits:
        room = limit.tokens - max_new - k  # the longest prompt that still fits
        if room < 1:
            raise AcceptanceError(f"--max-new-tokens {max_new}: with --num-speculative-tokens {k} and a prompt of at "
                                  f"least one token, a sequence needs {max_new + k + 1} positions, but target {t} holds "
                                  f"{limit}; use --max-new-tokens {max(limit.tokens - k - 1, 1)} or less")
        if lengths and lengths[-1] > room:
            raise AcceptanceError(f"--context-lengths {lengths[-1]}: with --max-new-tokens {max_new} and "
                                  f"--num-speculative-tokens {k}, a sequence needs {lengths[-1] + max_new + k} "
                                  f"positions, but target {t} holds {limit}; use lengths up to {room}")


def _refuse_long_prompts(limits: list[tuple[str, MaxModelLen]], n_tokens: list[tuple[str, int]], prompts: str | Path,
                         max_new: int, k: int) -> None:
    """Once tokenized: every prompt (with its context preamble) fits every target with the new and speculative tokens;
    `n_tokens` holds (prompt id, tokens)."""
    if not n_tokens:
        return
    name, n = max(n_tokens, key=lambda item: item[1])
    for t, limit in limits:
        if n + max_new + k > limit.tokens:
            raise AcceptanceError(f"--prompts {prompts}: prompt {name!r} is {n} tokens, so with --max-new-tokens "
                                  f"{max_new} and --num-speculative-tokens {k} it needs {n + max_new + k} positions, "
                                  f"but target {t} holds {limit}; shorten it or lower --max-new-tokens")


def run_acceptance(target: str | Path, draft: str | Path, candidate: str | Path, prompts: str | Path = "builtin",
                   num_speculative_tokens: int = 3, temperature: float = 0.0, max_new_tokens: int = 64,
                   backend: str = "auto", context_lengths: list[int] | None = None, seed: int = 0,
                   device: str = "cpu", candidate_target: str | Path | None = None,
                   progress: Progress | None = None) -> AcceptanceResult:
    """Measure target + BF16 draft and the candidate on the same prompts and settings.

    The candidate is a quantized draft (run on `target`), a quantized target (run with `draft`), or, with
    `candidate_target`, a quantized draft run on that quantized target (pair mode, candidate_kind "pair").
    """
    progress = or_silent(progress)
    k = num_speculative_tokens
    if k < 1:
        raise AcceptanceError(f"--num-speculative-tokens {k}: must be at least 1")
    if temperature < 0:
        raise AcceptanceError(f"--temperature {temperature}: must be >= 0")
    if backend not in ("auto", "reference", "vllm"):
        raise AcceptanceError(f"--backend {backend!r}: use auto, reference or vllm")
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
    if cand_target is not None:
        candidate_kind = "pair"
        runs = [("baseline", target, draft), ("candidate", cand_target, candidate)]
    else:
        candidate_kind = "draft" if model_kind(configs[candidate]) == EAGLE3_DRAFT else "target"
        runs = [("baseline", target, draft), ("candidate", candidate if candidate_kind == "target" else target,
                                              candidate if candidate_kind == "draft" else draft)]
    limits = [(t, lim) for t in dict.fromkeys(t for _, t, _ in runs) if (lim := max_model_len(configs[t])) is not None]
    lengths = sorted(set(context_lengths or []))
    _refuse_too_long(limits, lengths, max_new_tokens, k)
    for tgt, drf in dict.fromkeys((t, d) for _, t, d in runs):  # the pair too: its draft on its own target
        _refuse_misfit(drf, tgt)
    records = load_prompts(prompts)

    # one refusal for every checkpoint the runs load; auto falls back to the reference engine on any reason
    why_not_vllm = vllm_refusal({f: f for _, t, d in runs for f in (t, d)}, temperature=temperature)
    chosen = ("vllm" if why_not_vllm is None else "reference") if backend == "auto" else backend
    if chosen == "vllm" and why_not_vllm is not None:  # fail before any engine starts
        raise AcceptanceError(f"--backend vllm: {why_not_vllm}; use --backend reference")

    from quantkit.io.hf import load_tokenizer

    tokenizer = load_tokenizer(target)
    prompt_sets: list[tuple[str, list[PromptRecord]]] = [("", records)]
    prompt_sets += [(str(n), [with_context(r, tokenizer, n) for r in records]) for n in lengths]
    n_tokens = {key: [len(tokenizer(r.render(tokenizer), add_special_tokens=False)["input_ids"]) for r in recs]
                for key, recs in prompt_sets}
    _refuse_long_prompts(limits, [(r.id, n) for key, recs in prompt_sets for r, n in zip(recs, n_tokens[key])],
                         prompts, max_new_tokens, k)

    results: dict[str, DraftAcceptance] = {}
    model_cache: dict[str, Any] = {}
    outputs: dict[str, list[list[int]]] = {}
    for label, tgt, drf in runs:
        by_len: dict[str, float | None] = {}
        summary = None
        for key, recs in prompt_sets:
            texts = [r.render(tokenizer) for r in recs]
            progress(f"{label}: {len(texts)} prompts{f' at ~{key} tokens' if key else ''}, backend {chosen}")
            t0 = time.perf_counter()
            if chosen == "vllm":
                from quantkit.engines.vllm_engine import run_spec_decode

                longest = max(n_tokens[key])
                # slack for the speculative lookahead, never past what the target holds (vLLM refuses a longer one)
                stats = run_spec_decode(tgt, drf, texts, k, max_new_tokens, temperature, seed,
                                        max_model_len=fit_max_model_len(configs[tgt], max(1024, longest
                                                                                          + max_new_tokens + k + 8)))
            else:
                from quantkit.engines.reference import run_reference

                stats = run_reference(tgt, drf, texts, tokenizer, k, max_new_tokens, temperature, seed, device,
                                      model_cache, configs[tgt])
            s = _summarise(label, tgt, drf, recs, stats, k, time.perf_counter() - t0)
            if key:
                by_len[key] = s.mean_acceptance_length
            else:
                summary = s
                outputs[label] = [st.output_ids for st in stats]
        assert summary is not None
        summary.by_context_length = by_len
        results[label] = summary
        progress(f"{label}: AL {_fmt(summary.mean_acceptance_length)} over {summary.num_drafts} drafts")

    base, cand = results["baseline"], results["candidate"]
    base.model = draft  # whose figures each run is: the BF16 draft, and the candidate (a draft or a target)
    cand.model = candidate
    pairs = lambda d: [(p.num_drafts, p.num_accepted) for p in d.per_prompt]
    return AcceptanceResult(
        backend=chosen,
        settings=AcceptanceSettings(num_speculative_tokens=k, temperature=temperature, max_new_tokens=max_new_tokens,
                                    prompts=str(prompts), num_prompts=len(records), seed=seed, context_lengths=lengths),
        baseline=base, candidate=cand, ratio=_ratio(cand.mean_acceptance_length, base.mean_acceptance_length),
        ratio_ci=bootstrap_ratio_ci(pairs(base), pairs(cand), seed=seed),
        per_domain_ratio={d: _ratio(cand.domain_al(d), v.mean_acceptance_length)
                          for d, v in base.per_domain.items()},
        context_length_ratio={n: _ratio(cand.by_context_length.get(n), v) for n, v in base.by_context_length.items()},
        candidate_kind=candidate_kind,
        candidate_target=cand_target,
        greedy_outputs_identical=(outputs["baseline"] == outputs["candidate"]) if temperature == 0 else None,
    )
