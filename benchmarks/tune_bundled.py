"""`quantkit tune` on the bundled pair (examples/tiny: target + eagle3-draft), its table of options on record.

Every option (body BF16 or FP8, lm_head 1,024 or 512 rows chosen from quantkit/data/vocab-corpus.jsonl; K 3, the
only K here: each option's acceptance is ~1.5 CPU-minutes on the reference engine, and the shared 2-core host had
no time for more) is measured for acceptance in the reference engine on the built-in prompts (24 new tokens)
against the unpruned BF16 draft, and costed per accepted token from bytes on MI355X, TP 1 (an estimate, not a
measurement). The rows go to benchmarks/results/tune_bundled.json with the machine, the commit and the date;
docs/draft-cost.md renders the latest run's table from them (docs/hooks.py `tune`), so no figure is pasted by hand.

Usage: python benchmarks/tune_bundled.py [--record]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PLATFORM, TP, FLOOR = "MI355X", 1, 0.98
SETTINGS = "reference engine, built-in prompts, 24 new tokens, K 3; corpus quantkit/data/vocab-corpus.jsonl"


def run() -> tuple[list[dict[str, object]], float]:
    from quantkit.progress import stderr_progress
    from quantkit.tune.run import tune

    tiny = ROOT / "examples" / "tiny"
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tune-bundled-") as work:
        result = tune(
            tiny / "target",
            tiny / "eagle3-draft",
            work,
            vocab_corpus=ROOT / "quantkit" / "data" / "vocab-corpus.jsonl",
            vocabs=[1024, 512],
            ks=[3],
            bodies=("bf16", "fp8"),
            prompts="builtin",
            max_new_tokens=24,
            backend="reference",
            platform=PLATFORM,
            tp=TP,
            floor=FLOOR,
            progress=stderr_progress("tune"),
        )
    best = result.recommended
    rows: list[dict[str, object]] = []
    for o in result.options:
        chosen = best is not None and (o.body, o.draft_vocab, o.k) == (best.body, best.draft_vocab, best.k)
        saving = None if o.cost_ratio is None else 1 - o.cost_ratio
        rows.append(
            {
                "what": f"tune, bundled pair: {o.body} body, {o.draft_vocab} rows, K={o.k} ({PLATFORM}, TP {TP})",
                "figure": (
                    f"AL {o.al:.3f}, AL ratio {o.al_ratio:.3f} (measured); cost per accepted token "
                    f"{o.cost_ratio:.2f} of the BF16 draft's (estimate from bytes)"
                    + ("; recommended" if chosen else "")
                    if o.error is None and o.al is not None and o.al_ratio is not None and o.cost_ratio is not None
                    else f"error: {o.error}"
                ),
                "body": o.body,
                "draft_vocab": o.draft_vocab,
                "k": o.k,
                "al": o.al,
                "al_ratio": o.al_ratio,
                "cost_ratio": o.cost_ratio,
                "estimated_saving": saving,
                "recommended": chosen,
                "platform": PLATFORM,
                "tp": TP,
                "floor": FLOOR,
                "settings": SETTINGS,
            }
        )
    return rows, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help="append the rows to benchmarks/results/tune_bundled.json")
    args = ap.parse_args()
    rows, seconds = run()
    for row in rows:
        print(f"{row['what']}: {row['figure']}")
    print(f"{len(rows)} options in {seconds:.0f} s", file=sys.stderr)
    if args.record:
        sys.path.insert(0, str(ROOT / "benchmarks"))
        from record import record

        print(record("tune_bundled", rows, what="quantkit tune on the bundled pair"))


if __name__ == "__main__":
    main()
