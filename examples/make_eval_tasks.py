"""Write the data of quantkit's local lm-eval tasks (quantkit/data/eval_tasks/*.jsonl) for the bundled tiny models.

    python examples/make_eval_tasks.py [OUT_DIR]   # deterministic; about a second, no model needed

The items come from the templates of examples/tiny_corpus.py, drawn with their own seed (EVAL_SEED), not the
training corpus' seed (1234). The templates span a small space (300 French sentences, 200 name/job pairs), so
most items also occur verbatim in the 40,000-document training corpus: each record says whether it does
(`in_training_corpus`). These tasks measure whether quantization keeps what the tiny model learned, not how it
generalises. Tasks the tiny target cannot do were left out on purpose: arithmetic ("What is 23 + 58?": 2%
exact match greedy, 25% as 4-way choice) and RAG extraction (32% on 3-way choice), both at chance.

Tasks (their lm-eval YAML sits beside the data):
- tiny_french_mc: "Translate to French: the red car is in the garden." with 4 French sentences to choose from,
  the right one and three that change only the noun, only the adjective, or only the place.
- tiny_french_gen: the same translations generated greedily; exact match of the answer's first line.
- tiny_json_gen: "Return JSON with the fields name and job for Omar, who works as a chef." generated greedily;
  exact match of the first JSON object in the output with {"name": "Omar", "job": "chef"}.
"""

from __future__ import annotations

import itertools
import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import tiny_corpus as tc  # noqa: E402

OUT = HERE.parent / "quantkit" / "data" / "eval_tasks"
EVAL_SEED = 2026
CORPUS_SEED, CORPUS_DOCS = 1234, 40000  # as examples/make_tiny_models.py trains the target
FEWSHOT = 5  # items kept apart for --num-fewshot (the `train` split)


def french(noun: str, adj: str, place: str) -> str:
    """The corpus' French rendering (tiny_corpus._french) of 'the ADJ NOUN is PLACE'."""
    art, fr_noun = tc.FR_NOUNS[noun]
    fr_adj = tc.FR_ADJ_F[adj] if art == "la" else tc.FR_ADJ[adj]
    before = adj in ("big", "small", "new", "old")
    phrase = f"{art} {fr_adj} {fr_noun}" if before else f"{art} {fr_noun} {fr_adj}"
    return f"{phrase[0].upper()}{phrase[1:]} est {tc.FR_PLACES[place]}."


def french_mc(rng: random.Random, n: int, seen: str) -> list[dict]:
    combos = list(itertools.product(tc.FR_NOUNS, tc.FR_ADJ, tc.FR_PLACES))
    rng.shuffle(combos)
    records = []
    for i, (noun, adj, place) in enumerate(combos[:n]):
        question = f"Translate to French: the {adj} {noun} is {place}."
        right = french(noun, adj, place)
        choices = [
            right,
            french(rng.choice([x for x in tc.FR_NOUNS if x != noun]), adj, place),
            french(noun, rng.choice([x for x in tc.FR_ADJ if x != adj]), place),
            french(noun, adj, rng.choice([x for x in tc.FR_PLACES if x != place])),
        ]
        rng.shuffle(choices)
        records.append(
            {
                "id": f"french-{i}",
                "question": question,
                "choices": choices,
                "answer": choices.index(right),
                "in_training_corpus": question in seen,
            }
        )
    return records


def french_gen(rng: random.Random, n: int, seen: str) -> list[dict]:
    combos = list(itertools.product(tc.FR_NOUNS, tc.FR_ADJ, tc.FR_PLACES))
    rng.shuffle(combos)
    records = []
    for i, (noun, adj, place) in enumerate(combos[:n]):
        question = f"Translate to French: the {adj} {noun} is {place}."
        records.append(
            {
                "id": f"french-gen-{i}",
                "question": question,
                "answer": french(noun, adj, place),
                "in_training_corpus": question in seen,
            }
        )
    return records


def json_gen(rng: random.Random, n: int, seen: str) -> list[dict]:
    combos = list(itertools.product(tc.NAMES, tc.JOBS))
    rng.shuffle(combos)
    records = []
    for i, (name, job) in enumerate(combos[:n]):
        question = f"Return JSON with the fields name and job for {name}, who works as a {job}."
        records.append(
            {
                "id": f"json-{i}",
                "question": question,
                "answer": json.dumps({"name": name, "job": job}),
                "in_training_corpus": question in seen,
            }
        )
    return records


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def main(out: Path = OUT) -> None:
    seen = "\n".join(tc.corpus(CORPUS_DOCS, CORPUS_SEED))
    out.mkdir(parents=True, exist_ok=True)
    for name, make, n in (
        ("tiny_french_mc", french_mc, 200),
        ("tiny_french_gen", french_gen, 150),
        ("tiny_json_gen", json_gen, 150),
    ):
        records = make(random.Random(f"{EVAL_SEED}-{name}"), n + FEWSHOT, seen)
        write_jsonl(out / f"{name}.jsonl", records[FEWSHOT:])
        write_jsonl(out / f"{name}.fewshot.jsonl", records[:FEWSHOT])
        in_corpus = sum(r["in_training_corpus"] for r in records[FEWSHOT:])
        print(f"{name}: {n} items ({in_corpus} also in the training corpus), {FEWSHOT} few-shot items")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
