"""Reference speculative-decoding engine in PyTorch: a transformers target verifies an EAGLE-3 draft's chains.

Each round: the draft proposes K tokens from the target's aux hidden states (quantkit.engines.eagle3), the
target scores [last token, d1..dK] in one forward pass with its KV cache, the longest acceptable prefix is kept
plus one token from the target, and the cache is cropped back to what was accepted. Greedy mode accepts a draft
token iff it equals the target's argmax (so the output is exactly the target's greedy output); sampled mode is
vLLM's rejection sampling (quantkit.engines.rejection): the draft proposes greedily by default and d is accepted with
the target's probability p(d), or, with draft_sample_method "probabilistic", the draft samples and d is accepted with
min(1, p(d)/q(d)). Counters follow vLLM's (vllm/v1/spec_decode/metrics.py): one draft per round, accepted tokens per
position; each round also records where it started in the output and E[accepted] under the target's probabilities.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from quantkit.engines.eagle3 import Eagle3Draft
from quantkit.engines.rejection import draft_probs, target_probs, verify_round
from quantkit.engines.stats import Sampling, SequenceStats


class ReferenceEngine:
    """A transformers target plus an EAGLE-3 draft, run round by round on one prompt at a time."""

    def __init__(self, target, draft_folder: str | Path, device: str = "cpu"):
        self.target = target.to(device).eval()
        self.device = device
        embed = target.get_input_embeddings().weight.detach().float().cpu()
        self.draft = Eagle3Draft(draft_folder, embed)
        layers = target.model.layers
        n_layers = len(layers)
        ids = self.draft.aux_layer_ids or [2, n_layers // 2, n_layers - 3]
        if any(i < 0 or i > n_layers for i in ids):
            raise ValueError(f"aux layer ids {ids} outside the target's {n_layers} layers")
        self.aux_ids = list(ids)
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks = []
        for i in set(self.aux_ids):
            # id i = residual stream entering layer i (vLLM interfaces.py _maybe_add_hidden_state); i == L: before norm
            module = layers[i] if i < n_layers else target.model.norm
            self._hooks.append(module.register_forward_pre_hook(self._capture(i), with_kwargs=True))

    def _capture(self, i: int):
        def hook(_module, args, kwargs):
            self._captured[i] = (args[0] if args else kwargs["hidden_states"]).detach()

        return hook

    def close(self) -> None:
        for h in self._hooks:
            h.remove()

    @torch.no_grad()
    def aux_hidden_states(self, ids: list[int]) -> torch.Tensor:
        """The target's aux hidden states at every position of `ids` ([len(ids), n_aux * hidden], float32 on CPU):
        the residual streams entering the draft's aux layers, concatenated in `aux_ids` order, as vLLM hands them to
        an EAGLE-3 draft (vllm/model_executor/models/interfaces.py _maybe_add_hidden_state)."""
        from transformers import DynamicCache

        return self._forward(ids, DynamicCache())[1]

    def _forward(self, ids: list[int], cache):
        out = self.target(input_ids=torch.tensor([ids], device=self.device), past_key_values=cache, use_cache=True)
        aux = torch.cat([self._captured[i][0] for i in self.aux_ids], -1).float().cpu()
        return out.logits[0].float().cpu(), aux, out.past_key_values

    @torch.no_grad()
    def generate(
        self,
        prompt_ids: list[int],
        k: int,
        max_new_tokens: int,
        temperature: float | Sampling = 0.0,
        eos_token_ids: set[int] | None = None,
        seed: int = 0,
        argmax_path: bool = True,
    ) -> SequenceStats:
        """One prompt. `temperature` is a float (greedy drafts, no top-k/top-p) or a full `Sampling`. At temperature 0
        the round is argmax equality; `argmax_path=False` runs it through the rejection sampler with one-hot
        distributions instead (the same tokens and counters: what tests check)."""
        from transformers import DynamicCache

        s = temperature if isinstance(temperature, Sampling) else Sampling(temperature=float(temperature))
        gen = torch.Generator().manual_seed(seed)
        eos = eos_token_ids or set()
        stats = SequenceStats(accepted_per_pos=[0] * k, expected_accepted=0.0)
        cache = DynamicCache()
        logits, aux, cache = self._forward(prompt_ids, cache)
        stats.target_forwards += 1
        tokens = list(prompt_ids)
        first = self._choose(logits[-1:], s, gen)
        tokens.append(first)
        out = [first]
        aux_all = aux  # aux at positions 0..len(tokens)-2 (every position the target has processed)
        probabilistic = not s.greedy and s.draft_sample_method == "probabilistic"
        while len(out) < max_new_tokens and out[-1] not in eos:
            next_tokens = torch.tensor(tokens[1:])
            if probabilistic:
                drafts, draft_logits = self.draft.propose(
                    aux_all,
                    next_tokens,
                    k,
                    pick=lambda lg: int(torch.multinomial(draft_probs(lg[None], s)[0], 1, generator=gen)),
                )
                q = draft_probs(torch.stack(draft_logits), s)
            else:  # vLLM's default: the draft's argmax, one-hot in the rejection test
                drafts, _ = self.draft.propose(aux_all, next_tokens, k, pick=lambda lg: int(lg.argmax()))
                q = None
            logits, aux, cache = self._forward([tokens[-1], *drafts], cache)
            stats.target_forwards += 1
            if s.greedy and argmax_path:
                target_choice = logits.argmax(-1).tolist()
                n_acc = 0
                while n_acc < k and drafts[n_acc] == target_choice[n_acc]:
                    n_acc += 1
                extra, expected = target_choice[n_acc], float(n_acc)
            else:
                r = verify_round(target_probs(logits, s), drafts, q, gen)
                n_acc, extra, expected = r.accepted, r.token, r.expected_accepted
            stats.rounds.append((len(out), n_acc))
            stats.num_drafts += 1
            stats.num_draft_tokens += k
            stats.num_accepted += n_acc
            assert stats.expected_accepted is not None
            stats.expected_accepted += expected
            for j in range(n_acc):
                stats.accepted_per_pos[j] += 1
            new = [*drafts[:n_acc], extra]
            # keep the cache and aux states of the positions that stay: last token + accepted drafts
            cache.crop(len(tokens) + n_acc)
            aux_all = torch.cat([aux_all, aux[: n_acc + 1]], 0)
            for t in new:
                tokens.append(t)
                out.append(t)
                if t in eos or len(out) >= max_new_tokens:
                    break
            if len(tokens) - 1 != aux_all.shape[0]:  # stopped mid-round (eos or length): positions past it are unused
                aux_all = aux_all[: len(tokens) - 1]
        stats.output_ids = out[:max_new_tokens]
        return stats

    @staticmethod
    def _choose(logits: torch.Tensor, s: Sampling, gen: torch.Generator) -> int:
        if s.greedy:
            return int(logits[-1].argmax())
        return int(torch.multinomial(target_probs(logits, s)[-1], 1, generator=gen))


def load_reference_target(folder: str, config: dict[str, Any], device: str):
    """The target as the reference engine runs it: a Quark checkpoint through quantkit.io.loading, else FP32."""
    from quantkit.io.hf import load_causal_lm
    from quantkit.io.loading import load_for_torch

    if config.get("quantization_config"):
        return load_for_torch(folder, device)
    return load_causal_lm(folder, dtype=torch.float32).to(device).eval()


def run_reference(
    target: str,
    draft: str,
    texts: list[str],
    tokenizer,
    k: int,
    max_new: int,
    sampling: float | Sampling,
    seeds: list[int],
    device: str,
    cache: dict[str, Any],
    config: dict[str, Any],
) -> list[SequenceStats]:
    """Every text through a ReferenceEngine of `draft` on `target` (loaded once into `cache`), text i seeded
    `seeds[i]`."""
    if target not in cache:
        cache[target] = load_reference_target(target, config, device)
    engine = ReferenceEngine(cache[target], draft, device=device)
    eos = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    try:
        return [
            engine.generate(tokenizer(t, add_special_tokens=False)["input_ids"], k, max_new, sampling, eos, seed=sd)
            for t, sd in zip(texts, seeds)
        ]
    finally:
        engine.close()
