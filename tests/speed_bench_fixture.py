"""A tiny SPEED-Bench-format dataset written by the project (no SPEED-Bench text): the Hub repo's layout
(`CONFIG/test-00000-of-00001.parquet`) and columns (question_id, category, sub_category, turns, source, src_id,
difficulty, multiturn; see quantkit/io/speed_bench.py for where those come from), for tests and local trials.

    python tests/speed_bench_fixture.py OUT_DIR [--placeholders]
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from quantkit.io.speed_bench import CONFIGS, PLACEHOLDER, QUALITATIVE_CATEGORIES, THROUGHPUT_CATEGORIES

QUESTIONS = {
    "coding": ["Write a Python function that returns the largest of three numbers.",
               "Explain what a hash map is in two sentences."],
    "humanities": ["Why do historians compare several sources?", "Name two themes of classical tragedy."],
    "math": ["What is 17 times 3?", "Is 91 a prime number? Explain."],
    "multilingual": ["Translate 'good morning' into French.", "How do you say 'thank you' in Spanish?"],
    "qa": ["What is the boiling point of water at sea level?", "How many legs does a spider have?"],
    "rag": ["Context: The shop opens at nine and closes at five. Question: When does the shop close?",
            "Context: Mia has two cats and a dog. Question: How many pets does Mia have?"],
    "reasoning": ["If all squares are rectangles, is every rectangle a square?", "Sort the words pear, apple, fig."],
    "roleplay": ["You are a ship captain. Greet your new crew.", "Act as a librarian and suggest a book."],
    "stem": ["Why does ice float on water?", "What does a capacitor store?"],
    "summarization": ["Summarize: The town built a new bridge. Traffic fell by half. People walk more.",
                      "Summarize: Rain fell all week. The river rose. Farmers moved their sheep uphill."],
    "writing": ["Write a two-line poem about autumn.", "Write a short thank-you note to a neighbour."],
}
FOLLOWUP = "Now say the same thing more briefly."
WORDS = ["river", "stone", "garden", "window", "letter", "market", "forest", "signal", "bridge", "lantern", "harbor",
         "meadow", "engine", "candle", "orchard", "valley"]


def _qid(*parts: str) -> str:
    return hashlib.md5("/".join(parts).encode()).hexdigest()  # 32 characters, as SPEED-Bench question ids


def long_text(seed: int, sentences: int) -> str:
    """Deterministic project-made prose: sentences from a small word list (not SPEED-Bench's sources)."""
    out = []
    for i in range(sentences):
        a, b, c = (WORDS[(seed * 7 + i * k) % len(WORDS)] for k in (1, 3, 5))
        out.append(f"Line {i}: the {a} near the {b} kept its {c} until evening.")
    return " ".join(out)


def _write(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("question_id", pa.string()), ("category", pa.string()), ("sub_category", pa.string()),
                        ("turns", pa.list_(pa.string())), ("source", pa.string()), ("src_id", pa.string()),
                        ("difficulty", pa.string()), ("multiturn", pa.bool_())])
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)


def write_fixture(root: Path, placeholders: bool = False, throughput_sentences: int = 12) -> Path:
    """Every config: qualitative with 2 rows per category (the first `writing` row has two turns), each throughput
    config with one row per entropy tier; `placeholders` makes one qualitative row a placeholder."""
    root = Path(root)
    rows = []
    for cat in QUALITATIVE_CATEGORIES:
        for i, q in enumerate(QUESTIONS[cat]):
            multi = cat == "writing" and i == 0
            turns = [q, FOLLOWUP] if multi else [q]
            if placeholders and cat == "rag" and i == 1:
                turns = [PLACEHOLDER]
            rows.append({"question_id": _qid("qualitative", cat, str(i)), "category": cat, "sub_category": cat,
                         "turns": turns, "source": "quantkit-fixture", "src_id": f"{cat}-{i}",
                         "difficulty": "easy", "multiturn": multi})
    _write(root / "qualitative" / "test-00000-of-00001.parquet", rows)
    for n, config in enumerate(c for c in CONFIGS if c != "qualitative"):
        rows = [{"question_id": _qid(config, cat), "category": cat, "sub_category": cat,
                 "turns": [long_text(n * 3 + j, throughput_sentences * (n + 1))
                           + "\nWhich word appears most often above?"],
                 "source": "quantkit-fixture", "src_id": f"{config}-{cat}", "difficulty": None, "multiturn": False}
                for j, cat in enumerate(THROUGHPUT_CATEGORIES)]
        _write(root / config / "test-00000-of-00001.parquet", rows)
    return root


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python tests/speed_bench_fixture.py OUT_DIR [--placeholders]")
    print(write_fixture(Path(sys.argv[1]), placeholders="--placeholders" in sys.argv[2:]))
