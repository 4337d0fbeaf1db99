"""vLLM's rejection sampling in PyTorch, one request at a time: the target's sampling distribution and one verify round.

Follows vllm/v1/sample/rejection_sampler.py (vLLM 0.32) for a random (temperature > 0) request:
- `apply_sampling_constraints`: target logits / temperature, then top-k and top-p (`apply_top_k_top_p`,
  vllm/v1/sample/ops/topk_topp_sampler.py `apply_top_k_top_p_pytorch`: keep the k largest; then drop the smallest
  tokens whose cumulative probability is <= 1 - top_p, always keeping the largest), then softmax;
- draft_sample_method "greedy" (vllm/config/speculative.py, the default): the draft proposes its argmax and there are
  no draft probabilities (`NO_DRAFT_PROBS`), so draft token d is accepted iff u < p(d); on rejection the recovered
  token is sampled from p with d removed (`sample_recovered_tokens`: the residual max(p - onehot(d), 0));
- "probabilistic" (llm_base_proposer.py `_enable_probabilistic_draft_probs`, with rejection_sample_method "standard"):
  the draft samples from softmax(draft logits / temperature) (`compute_probs_and_sample_next_token`: temperature
  only, no top-k/top-p) and d is accepted iff u < min(1, p(d)/q(d)); the recovered token comes from max(p - q, 0);
- all K accepted: the bonus token is sampled from p at position K+1.
A greedy request (temperature 0) is argmax equality (`rejection_greedy_sample_kernel`); as distributions that is p =
onehot(argmax), which this module produces for temperature 0, so the same round gives greedy decoding exactly.

Each round also gives E[accepted | the drafted tokens] = sum_i prod_{j<=i} a_j, with a_j = p_j(d_j) (greedy drafts)
or min(1, p_j(d_j)/q_j(d_j)) (probabilistic): the acceptance coin flips averaged out exactly along the realised path.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from quantkit.engines.stats import Sampling


def target_probs(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """The target's sampling distribution per row of `logits` [n, V] (float32): onehot(argmax) at temperature 0."""
    logits = logits.float()
    if s.greedy:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    x = logits / s.temperature
    if s.top_k > 0 or s.top_p < 1.0:
        srt, idx = x.sort(-1, descending=False)
        if 0 < s.top_k < x.shape[-1]:
            kth = srt[..., x.shape[-1] - s.top_k : x.shape[-1] - s.top_k + 1]
            srt = srt.masked_fill(srt < kth, float("-inf"))
        if s.top_p < 1.0:
            cum = srt.softmax(-1).cumsum(-1)
            drop = cum <= 1 - s.top_p
            drop[..., -1] = False
            srt = srt.masked_fill(drop, float("-inf"))
        x = torch.empty_like(srt).scatter_(-1, idx, srt)
    return x.softmax(-1)


def draft_probs(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """The draft's distribution under probabilistic draft sampling: softmax(logits / temperature), no top-k/top-p."""
    return (logits.float() / s.temperature).softmax(-1)


@dataclass(frozen=True)
class Round:
    accepted: int  # accepted draft tokens
    token: int  # the target's token: the recovered token at the first rejection, or the bonus token
    expected_accepted: float  # E[accepted | drafted tokens]


def verify_round(p: torch.Tensor, draft_tokens: list[int], q: torch.Tensor | None, generator: torch.Generator) -> Round:
    """One verify pass. p [K+1, V]: the target's sampling distributions at the K draft positions and the bonus
    position; q [K, V]: the draft's distributions (probabilistic drafts) or None (greedy drafts: one-hot)."""
    expected, survive, accepted, token = 0.0, 1.0, None, None
    for j, d in enumerate(draft_tokens):
        pd = float(p[j, d])
        a = pd if q is None else (min(1.0, pd / float(q[j, d])) if q[j, d] > 0 else 1.0)
        survive *= a
        expected += survive
        if accepted is None:
            u = float(torch.rand((), generator=generator, dtype=torch.float64))
            if u < a:
                continue
            residual = (
                p[j] - (q[j] if q is not None else torch.nn.functional.one_hot(torch.tensor(d), p.shape[-1]).float())
            ).clamp(min=0)
            total = float(residual.sum())
            dist = residual / total if total > 0 else p[j]
            accepted, token = j, int(torch.multinomial(dist, 1, generator=generator))
    if accepted is None:
        accepted = len(draft_tokens)
        token = int(torch.multinomial(p[accepted], 1, generator=generator))
    assert token is not None
    return Round(accepted, token, expected)
