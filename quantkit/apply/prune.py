"""Draft-vocabulary pruning: keep an EAGLE-3 draft's lm_head rows for the N most frequent target tokens of a corpus.

FR-Spec's idea (Zhao et al., arXiv 2502.14856): the draft proposes only frequent tokens, the target still verifies
every one, so the output is unchanged and the lm_head (often the largest read of a draft step) shrinks. vLLM 0.32
loads such a draft as it is: `vllm/model_executor/models/llama_eagle3.py` builds `ParallelLMHead(draft_vocab_size,
hidden)`, reads the checkpoint's `d2t` into `draft_id_to_target_id` (its `load_weights` renames `d2t` and skips
`t2d`), and `compute_logits` scatters the draft logits to `arange(draft_vocab_size) + draft_id_to_target_id` in a
target-sized row filled with -inf. So the output needs only the kept rows, `d2t` in that offset form
(d2t[i] = target_id(i) - i), `t2d` (a bool mask over the target vocabulary, as the speculators format writes it)
and `draft_vocab_size` in config.json. Every other tensor is copied as it is.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.io import jsonout
from quantkit.io.checkpoint import atomic_output, resolve_source, sha256_file, written_files
from quantkit.io.config import draft_config
from quantkit.io.files import copy_aux_files
from quantkit.io.headers import INDEX_FILE, read_config
from quantkit.naming.archs import model_kind
from quantkit.naming.drafts import draft_info
from quantkit.progress import Progress, or_silent
from quantkit.results import ApplyResult, DraftVocabResult
from quantkit.versions import versions
from quantkit.vocab import EAGLE3_DRAFT

LM_HEAD, D2T, T2D = "lm_head.weight", "d2t", "t2d"


class DraftVocabError(QuantkitError):
    """`--draft-vocab` cannot be done as asked (N, the corpus, the draft or the target)."""


@dataclass(frozen=True)
class KeptVocab:
    """The pruned vocabulary: `target_ids[i]` is the target token of draft row i (ascending), `rows[i]` the row of
    the source lm_head it is copied from."""

    target_ids: list[int]
    rows: list[int]
    always_kept: list[int]
    special_not_in_draft: list[int]

    @property
    def d2t(self) -> list[int]:
        """vLLM's offset form: target id = draft id + d2t[draft id] (llama_eagle3.py compute_logits)."""
        return [t - i for i, t in enumerate(self.target_ids)]


def source_target_ids(d2t: Sequence[int] | None, draft_vocab: int) -> list[int]:
    """The target token of each source lm_head row, as compute_logits maps it: i + d2t[i], or i without d2t."""
    if d2t is None:
        return list(range(draft_vocab))
    return [i + int(off) for i, off in enumerate(d2t)]


def choose_kept(counts: Counter[int], n: int, source_ids: Sequence[int], always: Iterable[int],
                where: str = "--draft-vocab") -> KeptVocab:
    """The N target tokens to keep: every `always` token the source draft has a row for, then the most frequent of
    `counts` among the source's tokens (ties: the lower target id first); returned in ascending target id, the
    order vLLM's d2t offsets assume nothing about but which keeps d2t non-negative and readable.

    Refuses N above the source's rows, more always-kept tokens than N, and a corpus whose distinct tokens (within
    the source vocabulary, always-kept ones counted) are fewer than N."""
    row_of = {t: i for i, t in enumerate(source_ids)}
    if n < 1 or n > len(source_ids):
        raise DraftVocabError(f"{where} {n}: the draft's lm_head has {len(source_ids)} rows; pick N from 1 to "
                              f"{len(source_ids)}")
    specials = sorted(set(always))
    kept_specials = [t for t in specials if t in row_of]
    missing = [t for t in specials if t not in row_of]
    if len(kept_specials) > n:
        raise DraftVocabError(f"{where} {n}: the draft holds {len(kept_specials)} special and EOS tokens, which are "
                              f"always kept; pick N of at least {len(kept_specials)}")
    seen = {t for t in counts if t in row_of and counts[t] > 0}
    covered = seen | set(kept_specials)
    if len(covered) < n:
        raise DraftVocabError(f"{where} {n}: the corpus covers only {len(covered)} distinct tokens of the draft's "
                              f"vocabulary (special tokens included); pick N of at most {len(covered)} or give a "
                              "larger --vocab-corpus")
    chosen = set(kept_specials)
    for t in sorted(seen - chosen, key=lambda t: (-counts[t], t)):
        if len(chosen) == n:
            break
        chosen.add(t)
    ids = sorted(chosen)
    return KeptVocab(ids, [row_of[t] for t in ids], kept_specials, missing)


def special_ids(tokenizer: Any, config: dict[str, Any]) -> list[int]:
    """Special tokens of the target's tokenizer and its config's eos/bos/pad ids: always kept."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
        v = config.get(key)
        for x in (v if isinstance(v, list) else [v]):
            if isinstance(x, int) and not isinstance(x, bool):
                ids.add(x)
    return sorted(ids)


def corpus_texts(corpus: str, tokenizer: Any, speed_bench: str | Path | None = None) -> tuple[list[str], str]:
    """The texts of `--vocab-corpus` as the target reads them (chat template applied, follow-up turns appended),
    and a hash of the corpus: a prompts JSONL / `builtin` (quantkit.io.prompts) or `speed-bench:CONFIG[/CATEGORY]`
    (quantkit.io.speed_bench)."""
    from quantkit.io.prompts import BUILTIN_PROMPTS, load_prompts
    from quantkit.io.speed_bench import is_speed_bench, load_speed_bench

    if is_speed_bench(corpus):
        sb = load_speed_bench(corpus, speed_bench)
        records, digest = sb.records, sb.content_sha256
    else:
        records = load_prompts(corpus)
        digest = sha256_file(BUILTIN_PROMPTS if corpus == "builtin" else Path(corpus))
    return [r.render(tokenizer) + "".join(r.followups) for r in records], digest


def token_counts(texts: Iterable[str], tokenizer: Any) -> Counter[int]:
    """How often each target token id occurs in `texts`, tokenized as the target tokenizes (no BOS added)."""
    counts: Counter[int] = Counter()
    for text in texts:
        counts.update(tokenizer(text, add_special_tokens=False)["input_ids"])
    return counts


def _int_ids(values: Any) -> list[int]:
    return [int(x) for x in values.tolist()]


def prune_draft(model: str | Path, output: str | Path, n: int, corpus: str, target: str | Path, *,
                speed_bench: str | Path | None = None, overwrite: bool = False, write_manifest: bool = True,
                progress: Progress | None = None) -> DraftVocabResult:
    """Write `model` (an EAGLE-3 draft) to `output` with its lm_head cut to `n` rows (see the module docstring).
    Nothing is written when anything is refused. `write_manifest`: write quantkit.json (an ApplyResult without
    quantized layers) for a prune-only run; a recipe run after it writes its own."""
    import torch
    from safetensors import safe_open

    from quantkit.io.hf import load_tokenizer
    from quantkit.io.safetensors import serialize_safetensors

    progress = or_silent(progress)
    src = resolve_source(model, copying=True)
    if model_kind(src.config) != EAGLE3_DRAFT:
        raise DraftVocabError(f"--draft-vocab: {model} is not an EAGLE-3 draft ({src.architecture}); draft-vocabulary "
                              "pruning applies to drafts only")
    info = draft_info(src.config, dict(src.tensors), str(model))
    target_config = read_config(target)
    target_vocab = draft_config(target_config).vocab_size or info.vocab_size
    if info.vocab_size != target_vocab:
        raise DraftVocabError(f"--target {target}: its vocabulary ({target_vocab}) is not the draft's "
                              f"vocab_size ({info.vocab_size}); is --target the draft's target?")
    if n > info.draft_vocab_size:  # before the corpus is read: no work for a refusal
        raise DraftVocabError(f"--draft-vocab {n}: the draft's lm_head has {info.draft_vocab_size} rows; pick N from 1 "
                              f"to {info.draft_vocab_size}")
    lm_file = src.tensors[LM_HEAD].file
    with safe_open(str(src.path / lm_file), framework="pt") as f:
        had_d2t = D2T in f.keys()
        d2t = _int_ids(f.get_tensor(D2T)) if had_d2t else None
    source_ids = source_target_ids(d2t, info.draft_vocab_size)
    progress(f"counting the tokens of {corpus} with {target}'s tokenizer")
    tokenizer = load_tokenizer(target)
    texts, digest = corpus_texts(corpus, tokenizer, speed_bench)
    counts = token_counts(texts, tokenizer)
    kept = choose_kept(counts, n, source_ids, special_ids(tokenizer, target_config))
    total = sum(counts.values())
    in_source = set(source_ids)
    kept_set = set(kept.target_ids)
    cov_before = sum(c for t, c in counts.items() if t in in_source) / max(total, 1)
    cov_after = sum(c for t, c in counts.items() if t in kept_set) / max(total, 1)
    ids_bytes = b"".join(t.to_bytes(8, "little", signed=True) for t in kept.target_ids)
    reason = (f"lm_head cut from {info.draft_vocab_size} to {n} rows: the {n} most frequent target tokens of {corpus} "
              f"({cov_after:.1%} of its {total} tokens; {cov_before:.1%} before), special and EOS tokens kept; the "
              "target verifies every drafted token, so the output is unchanged; vLLM maps draft ids to target ids "
              "with d2t (llama_eagle3.py compute_logits)")
    result = DraftVocabResult(
        source=src.hub_id or str(src.path.resolve()), corpus=corpus, corpus_sha256=digest, tokenizer=str(target),
        corpus_tokens=total, distinct_tokens=len({t for t in counts if t in in_source}), target_vocab_size=target_vocab,
        draft_vocab_before=info.draft_vocab_size, draft_vocab_after=n, had_d2t=had_d2t, always_kept=kept.always_kept,
        special_not_in_draft=kept.special_not_in_draft, coverage_before=round(cov_before, 6),
        coverage_after=round(cov_after, 6), kept_target_ids_sha256=hashlib.sha256(ids_bytes).hexdigest(),
        reason=reason)
    progress(f"keeping {n} of {info.draft_vocab_size} lm_head rows ({cov_after:.1%} of the corpus's tokens)")
    output = Path(output)
    with atomic_output(output, overwrite, [src.path, target], command=f"quantkit apply --draft-vocab {n}",
                       progress=progress) as tmp:
        rows = torch.tensor(kept.rows, dtype=torch.long)
        for file in src.files:
            tensors: dict[str, Any] = {}
            with safe_open(str(src.path / file), framework="pt") as f:
                for name in f.keys():
                    if name in (D2T, T2D):
                        continue
                    t = f.get_tensor(name)
                    # index_select copies whole rows: the kept rows' bytes are the source's bytes
                    tensors[name] = t.index_select(0, rows) if name == LM_HEAD else t
            if file == lm_file:
                tensors[D2T] = torch.tensor(kept.d2t, dtype=torch.int64)
                mask = torch.zeros(target_vocab, dtype=torch.bool)
                mask[torch.tensor(kept.target_ids, dtype=torch.long)] = True
                tensors[T2D] = mask
            serialize_safetensors(tensors, tmp / file, error=DraftVocabError)
        config = dict(src.config)
        config["draft_vocab_size"] = n
        (tmp / "config.json").write_text(jsonout.dumps(config) + "\n")
        copy_aux_files(src.path, tmp)
        index = src.path / INDEX_FILE
        if index.is_file():
            data = json.loads(index.read_text(encoding="utf-8"))
            wm = data.get("weight_map", {})
            wm.pop(D2T, None)
            wm.pop(T2D, None)
            wm[D2T] = wm[T2D] = lm_file
            data["weight_map"] = dict(sorted(wm.items()))
            data.setdefault("metadata", {}).pop("total_size", None)
            (tmp / INDEX_FILE).write_text(json.dumps(data, indent=2) + "\n")
        if write_manifest:
            manifest = ApplyResult(
                command=f"quantkit apply --draft-vocab {n} --vocab-corpus {corpus}", output=str(output.resolve()),
                source=result.source, target=str(target), model_kind=EAGLE3_DRAFT, architecture=src.architecture,
                engine="none", size_before_bytes=src.size_bytes,
                size_after_bytes=sum(p.stat().st_size for p in tmp.glob("*.safetensors")), versions=versions(),
                source_files={f: sha256_file(src.path / f) for f in src.files}, draft_vocab=result,
                output_files=sorted({*written_files(tmp), "quantkit.json"}))
            (tmp / "quantkit.json").write_text(jsonout.dumps(manifest.to_dict()) + "\n")
    return result


def prune_to_temporary(model: str | Path, output: Path, n: int, corpus: str, target: str | Path, *,
                       speed_bench: str | Path | None, progress: Progress | None) -> tuple[Path, DraftVocabResult]:
    """Prune into a hidden folder beside `output` (for a recipe to quantize next); the caller removes it."""
    work = output.expanduser().resolve().parent / f".{output.name}.draft-vocab"
    if work.exists():
        shutil.rmtree(work)
    return work, prune_draft(model, work, n, corpus, target, speed_bench=speed_bench, write_manifest=False,
                             progress=progress)


__all__ = ["DraftVocabError", "KeptVocab", "choose_kept", "corpus_texts", "prune_draft", "prune_to_temporary",
           "source_target_ids", "special_ids", "token_counts"]
