"""Draft-vocabulary pruning (FR-Spec: Zhao et al., arXiv 2502.14856): an EAGLE-3 draft's lm_head cut to the N
target tokens a corpus uses most, so that every draft token reads N rows instead of the whole vocabulary.

What vLLM needs, read from vllm/model_executor/models/llama_eagle3.py: the lm_head is a ParallelLMHead of
`draft_vocab_size` rows (config.json); when that differs from the target's vocabulary, `draft_id_to_target_id` is
loaded from the checkpoint's `d2t` and `compute_logits` scatters draft logit i to target id `i + d2t[i]` in a
target-sized row filled with -inf (offsets, not ids). `t2d` (a bool per target id) is carried as SpecForge writes it.
The output is still exactly the target's: the target verifies every token.

The kept rows are copied byte for byte from the source's lm_head, in ascending target id; special tokens and EOS are
always kept; a draft that already has `d2t` keeps a subset of its own vocabulary (pruning composes).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from quantkit.errors import QuantkitError
from quantkit.progress import Progress, or_silent
from quantkit.results.apply import DraftVocabReport


class DraftVocabError(QuantkitError):
    """Draft-vocabulary pruning cannot do what was asked: N too large, a corpus too small, not an EAGLE-3 draft."""


def token_counts(texts: Iterable[str], tokenizer: Any) -> Counter[int]:
    """How often each target token id occurs in `texts`, tokenized with the target's tokenizer."""
    counts: Counter[int] = Counter()
    for text in texts:
        counts.update(tokenizer(text, add_special_tokens=False)["input_ids"])
    return counts


def choose_rows(counts: Counter[int], n: int, available: Sequence[int], always: Iterable[int]) -> list[int]:
    """The `n` target ids to keep, ascending: every id of `always` the draft has a row for, then the most frequent
    of `available` (ties: the lower id first). DraftVocabError when the corpus cannot fill `n`."""
    have = set(available)
    if n > len(have):
        raise DraftVocabError(
            input=f"--draft-vocab {n}",
            reason=f"larger than the draft's vocabulary ({len(have)} rows)",
            fix=f"give at most {len(have)}",
        )
    kept = sorted(set(always) & have)
    if len(kept) > n:
        raise DraftVocabError(
            input=f"--draft-vocab {n}",
            reason=f"the {len(kept)} special and EOS tokens alone do not fit",
            fix=f"give at least {len(kept)}",
        )
    frequent = sorted((t for t in have if counts.get(t, 0) > 0 and t not in kept), key=lambda t: (-counts[t], t))
    if len(kept) + len(frequent) < n:
        raise DraftVocabError(
            input=f"--draft-vocab {n}",
            reason=f"the corpus covers only {len(kept) + len(frequent)} "
            "distinct tokens of the draft's vocabulary (special tokens included)",
            fix="give a larger --vocab-corpus or a smaller --draft-vocab",
        )
    return sorted(kept + frequent[: n - len(kept)])


def _special_ids(tokenizer: Any, config: dict[str, Any]) -> set[int]:
    ids = {int(i) for i in getattr(tokenizer, "all_special_ids", []) if i is not None}
    for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
        value = config.get(key)
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, int) and not isinstance(v, bool):
                ids.add(v)
    return ids


def prune_draft(
    model: str | Path,
    output: str | Path,
    *,
    target: str | Path,
    corpus: str | Path,
    n: int,
    overwrite: bool = False,
    progress: Progress | None = None,
) -> DraftVocabReport:
    """Write `model` (an EAGLE-3 draft) to `output` with its lm_head pruned to `n` rows chosen from `corpus` (a
    prompts file as `quantkit acceptance --prompts` reads it, tokenized with `target`'s tokenizer)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from quantkit.io.checkpoint import atomic_output, resolve_source, sha256_file
    from quantkit.io.files import copy_aux_files
    from quantkit.io.hf import load_tokenizer
    from quantkit.io.prompts import load_prompts
    from quantkit.naming.archs import is_draft

    progress = or_silent(progress)
    src = resolve_source(model)
    if not is_draft(src.config):
        raise DraftVocabError(
            input=f"--model {model}",
            reason="not an EAGLE-3 draft",
            fix="--draft-vocab prunes a draft's lm_head; give the draft",
        )
    if "lm_head.weight" not in src.tensors:
        raise DraftVocabError(
            input=f"--model {model}", reason="the draft has no lm_head.weight", fix="give a draft with its own lm_head"
        )
    tokenizer = load_tokenizer(target)
    vocab = int(src.config.get("vocab_size") or len(tokenizer))
    records = load_prompts(corpus)
    counts = token_counts((r.render(tokenizer) for r in records), tokenizer)
    shard = src.path / src.tensors["lm_head.weight"].file
    with safe_open(str(shard), "pt") as f:
        head = f.get_tensor("lm_head.weight")
    d2t_old = None
    if "d2t" in src.tensors:
        with safe_open(str(src.path / src.tensors["d2t"].file), "pt") as f:
            d2t_old = f.get_tensor("d2t").to(torch.int64)
    rows_now = head.shape[0]
    current = [i + int(d2t_old[i]) for i in range(rows_now)] if d2t_old is not None else list(range(rows_now))
    keep = choose_rows(counts, n, current, _special_ids(tokenizer, src.config))
    row_of = {t: i for i, t in enumerate(current)}
    index = torch.tensor([row_of[t] for t in keep], dtype=torch.int64)
    new_head = head.index_select(0, index).contiguous()
    d2t = torch.tensor([t - i for i, t in enumerate(keep)], dtype=torch.int64)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[torch.tensor(keep, dtype=torch.int64)] = True
    total = sum(counts.values())
    covered = sum(counts[t] for t in keep)
    progress(
        f"draft vocabulary: {rows_now} -> {n} rows, covering {covered / max(total, 1):.1%} of the corpus's "
        f"{total} tokens"
    )
    with atomic_output(Path(output), overwrite, [src.path], command="quantkit apply --draft-vocab") as tmp:
        for file in src.files:
            with safe_open(str(src.path / file), "pt") as f:
                tensors = {k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118 - safe_open handles
                metadata = f.metadata()
            if "lm_head.weight" in tensors:
                tensors["lm_head.weight"] = new_head
            tensors.pop("d2t", None)
            tensors.pop("t2d", None)
            if file == src.tensors["lm_head.weight"].file:
                tensors["d2t"], tensors["t2d"] = d2t, t2d
            (tmp / file).parent.mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(tmp / file), metadata=metadata or {"format": "pt"})
        index_file = src.path / "model.safetensors.index.json"
        if index_file.is_file():
            doc = json.loads(index_file.read_text())
            doc.setdefault("weight_map", {}).update(
                {"d2t": src.tensors["lm_head.weight"].file, "t2d": src.tensors["lm_head.weight"].file}
            )
            (tmp / index_file.name).write_text(json.dumps(doc, indent=2))
        copy_aux_files(src.path, tmp)
        config = dict(src.config)
        config["draft_vocab_size"] = n
        (tmp / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        report = DraftVocabReport(
            source=str(src.path),
            rows_before=rows_now,
            rows_after=n,
            target_vocab_size=vocab,
            corpus=str(corpus),
            corpus_sha256=sha256_file(Path(corpus)) if Path(corpus).is_file() else None,
            corpus_tokens=total,
            corpus_distinct_tokens=len(counts),
            coverage=covered / total if total else None,
            always_kept=len(set(keep) & _special_ids(tokenizer, src.config)),
            lm_head_sha256=hashlib.sha256(new_head.view(torch.uint8).numpy().tobytes()).hexdigest(),
            reason=f"lm_head pruned to the {n} target tokens {corpus} uses most (special and EOS tokens always "
            "kept): each draft token reads those rows only; the target still verifies every token, so the "
            "output is unchanged",
        )
        (tmp / "draft_vocab.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    return report


def apply_with_draft_vocab(
    recipe: str | None,
    model: str | Path,
    output: str | Path,
    *,
    n: int,
    corpus: str | Path,
    target: str | Path,
    overwrite: bool = False,
    progress: Progress | None = None,
    **apply_kwargs: Any,
) -> Any:
    """Prune the draft's vocabulary, then (with `recipe`) quantize the pruned draft: the recipe's result with the
    pruning recorded in it (quantkit.json) and `draft_vocab.json` beside it. Without a recipe, the pruned draft
    alone and its DraftVocabReport."""
    import shutil

    from quantkit.apply.run import apply
    from quantkit.io import jsonout

    out = Path(output)
    if recipe is None:
        return prune_draft(model, out, target=target, corpus=corpus, n=n, overwrite=overwrite, progress=progress)
    staged = out.expanduser().resolve().with_name(f".{out.name}.quantkit-vocab")
    if staged.exists():
        shutil.rmtree(staged)
    try:
        report = prune_draft(model, staged, target=target, corpus=corpus, n=n, progress=progress)
        result = apply(recipe, staged, out, target=target, overwrite=overwrite, progress=progress, **apply_kwargs)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    result.draft_vocab = report
    result.source = report.source
    if result.dry_run:
        return result
    final = Path(result.output)
    (final / "draft_vocab.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")
    result.output_files = sorted({*result.output_files, "draft_vocab.json"})
    manifest = final / "quantkit.json"
    partial = manifest.with_name(".quantkit.json.partial")
    partial.write_text(jsonout.dumps(result.to_dict()) + "\n")
    partial.replace(manifest)
    return result


__all__ = ["DraftVocabError", "apply_with_draft_vocab", "choose_rows", "prune_draft", "token_counts"]
