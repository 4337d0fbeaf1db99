"""Results of `acceptance`: the BF16 draft's and the candidate's acceptance figures, per domain, prompt and
context length, and their ratio."""

from __future__ import annotations

from typing import Any

from pydantic import field_validator, model_validator

from quantkit.results.base import CommandResult, Result, _nan_to_none
from quantkit.specs import AcceptanceSpec

# Which average each AL figure is: the card, the sidecar and the CLI print these with the figures.
AL_DEFINITIONS: dict[str, str] = {
    "mean_acceptance_length": "pooled (micro): 1 + sum of accepted draft tokens / sum of drafts over every request, "
    "as vLLM's counters give it (vllm/v1/spec_decode/metrics.py)",
    "macro_acceptance_length": "macro: the mean over requests of each request's AL (1 + accepted / drafts), as "
    "ModelOpt specdec_bench reports Category_AL and Average_AL",
    "expected_acceptance_length": "pooled expected AL: 1 + sum over rounds of E[accepted | drafted tokens] under the "
    "target's sampling probabilities / drafts (equals the pooled AL when greedy)",
    "accepted_length_histogram": "drafts (rounds) by number of accepted draft tokens, 0..K",
    "acceptance_rate_per_pos": "share of drafts whose token k was accepted, k = 1..K (vLLM's per-position rate)",
    "conditional_acceptance_per_pos": "P(token k accepted | tokens 1..k-1 accepted) = accepted at k / accepted at k-1",
    "al_by_output_position": "pooled AL of the rounds that started in each range of generated tokens, so runs that "
    "stop at different points compare over the same range",
}


class DomainAcceptance(Result):
    mean_acceptance_length: float | None = None  # pooled
    macro_acceptance_length: float | None = None  # mean of per-request AL
    num_drafts: int | None = None
    num_accepted: int | None = None
    prompts: int | None = None

    _nan = field_validator("mean_acceptance_length", "macro_acceptance_length", mode="before")(_nan_to_none)


class PromptAcceptance(Result):
    id: str
    domain: str
    num_drafts: int
    num_accepted: int
    generated_tokens: int
    output_digest: str | None = None  # fingerprint of the generated token ids (quantkit.acceptance.agreement)
    acceptance_length: float | None = None  # this request's AL, 1 + accepted / drafts
    expected_accepted: float | None = None  # sum over its rounds of E[accepted | drafted tokens]
    seed: int | None = None
    turns: int = 1  # user turns sent one after the other (multi-turn rows), the model's replies in between

    _nan = field_validator("acceptance_length", mode="before")(_nan_to_none)


class AlAgreement(Result):
    """Two measurements of one pair's AL on the same prompts, compared per prompt and with a paired randomization
    bound (quantkit.acceptance.agreement, whose docstring gives the reasons)."""

    delta: float | None = None  # AL(a) - AL(b)
    bound: float = 0.0  # the |delta| the prompts whose counters differ explain, at `level`
    p_value: float = 0.0
    level: float = 0.99
    agree: bool = False  # p_value > 1 - level
    prompts: int = 0
    differing_prompts: int = 0  # prompts whose (drafts, accepted) differ
    same_output_prompts: int | None = None  # prompts with identical generated tokens (None: not known)
    counter_mismatches: list[str] = []  # prompts with identical tokens but other counters


class DraftAcceptance(Result):
    """Counters and derived figures of one draft (or one target) over the prompt set."""

    label: str = ""
    target: str | None = None
    draft: str | None = None
    model: str | None = None  # the checkpoint whose figures these are (the draft, or the target when it is judged)
    mean_acceptance_length: float | None = None
    num_drafts: int | None = None
    num_draft_tokens: int | None = None
    num_accepted: int | None = None
    acceptance_rate_per_pos: list[float | None] | None = None
    tokens_per_target_forward: float | None = None
    generated_tokens: int | None = None
    per_domain: dict[str, DomainAcceptance] = {}
    per_prompt: list[PromptAcceptance] = []
    by_context_length: dict[str, float | None] = {}
    macro_acceptance_length: float | None = None
    expected_acceptance_length: float | None = None
    accepted_length_histogram: list[int] = []
    conditional_acceptance_per_pos: list[float | None] = []
    al_by_output_position: dict[str, float | None] = {}
    wall_s: float = 0.0

    @model_validator(mode="before")
    @classmethod
    def _older_names(cls, data: Any) -> Any:
        # Gate reports before the result model named the per-position rates `per_position`.
        if isinstance(data, dict) and "per_position" in data and "acceptance_rate_per_pos" not in data:
            data = {**data, "acceptance_rate_per_pos": data["per_position"]}
        return data

    @field_validator("per_domain", mode="before")
    @classmethod
    def _domain_figures(cls, v: Any) -> Any:
        # Reports written by hand (or by other tools) may give a domain's AL as a bare number.
        if isinstance(v, dict):
            return {k: {"mean_acceptance_length": x} if isinstance(x, (int, float)) else x for k, x in v.items()}
        return v

    _nan = field_validator(
        "mean_acceptance_length",
        "tokens_per_target_forward",
        "macro_acceptance_length",
        "expected_acceptance_length",
        mode="before",
    )(_nan_to_none)

    def domain_al(self, domain: str) -> float | None:
        d = self.per_domain.get(domain)
        return d.mean_acceptance_length if d is not None else None


class PromptSource(Result):
    """Where the prompts came from, without the prompts: a dataset's id, revision and content hash (SPEED-Bench's
    licence does not allow republishing its text)."""

    kind: str = "builtin"  # builtin, jsonl, speed-bench, text
    name: str | None = None  # e.g. speed-bench:qualitative/coding
    repo: str | None = None  # Hub dataset id, when fetched from a Hub
    revision: str | None = None  # the commit the files came from (None: a local folder)
    content_sha256: str | None = None  # of the files read, in path order
    files: list[str] = []  # paths inside the dataset


class AcceptanceSettings(Result):
    num_speculative_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    draft_sample_method: str | None = None
    chat_template_kwargs: dict[str, Any] = {}
    max_new_tokens: int | None = None
    prompts: str | None = None
    num_prompts: int | None = None
    seed: int | None = None
    num_seeds: int = 1
    context_lengths: list[int] = []
    context_source: str | None = None  # the long text context prompts are cut from (None: synthetic notes)
    prompt_source: PromptSource | None = None
    context_text_source: PromptSource | None = None


class AcceptanceResult(CommandResult):
    """Baseline (BF16 draft) vs candidate, as the CLI prints it, `--json` emits it and the gate report holds it."""

    backend: str | None = None
    spec: AcceptanceSpec | None = None  # the settings it was asked to run with (quantkit.specs), echoed
    settings: AcceptanceSettings = AcceptanceSettings()  # what the run resolved them to (prompt count, sources)
    baseline: DraftAcceptance | None = None
    candidate: DraftAcceptance | None = None
    ratio: float | None = None
    ratio_ci: list[float | None] | None = None
    per_domain_ratio: dict[str, float | None] = {}
    context_length_ratio: dict[str, float | None] = {}
    candidate_kind: str | None = None  # "draft", "target", or "pair" (candidate draft on candidate target)
    candidate_target: str | None = None  # pair mode: the quantized target the candidate draft runs on
    greedy_outputs_identical: bool | None = None
    macro_ratio: float | None = None  # macro AL(candidate) / macro AL(baseline)
    expected_ratio: float | None = None  # expected AL(candidate) / expected AL(baseline)
    expected_ratio_ci: list[float | None] | None = None  # paired bootstrap over (prompt, seed)
    definitions: dict[str, str] = dict(AL_DEFINITIONS)

    @model_validator(mode="before")
    @classmethod
    def _older_layout(cls, data: Any) -> Any:
        # Gate reports before the result model kept the run settings at the top of the acceptance section.
        if isinstance(data, dict) and "settings" not in data:
            moved = {k: data[k] for k in ("num_speculative_tokens", "prompts", "num_prompts") if k in data}
            if moved:
                data = {**data, "settings": moved}
        return data

    def domains(self) -> list[str]:
        """Domains that either run reports, in first-seen order."""
        seen: dict[str, None] = {}
        for run in (self.baseline, self.candidate):
            if run is not None:
                seen.update(dict.fromkeys(run.per_domain))
        return list(seen)


__all__ = [
    "AL_DEFINITIONS",
    "AcceptanceResult",
    "PromptSource",
    "AlAgreement",
    "AcceptanceSettings",
    "DomainAcceptance",
    "DraftAcceptance",
    "PromptAcceptance",
]
