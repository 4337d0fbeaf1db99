"""SPEED-Bench (nvidia/SPEED-Bench) as a prompt source: `speed-bench:CONFIG[/CATEGORY]`, read from a local folder laid
out as the Hub dataset repo (`CONFIG/test-*.parquet`) or fetched from the Hub at a pinned revision.

What the dataset is, from its loaders: configs `qualitative` (11 categories x 80) and `throughput_1k` ...
`throughput_32k` (categories `low_entropy`, `mixed`, `high_entropy`), one `test` split each; columns `question_id`,
`category`, `sub_category`, `turns` (one string per user turn), `source`, `src_id`, `difficulty`, `multiturn`
(NVIDIA/Model-Optimizer examples/specdec_bench/specdec_bench/datasets/speed.py `config_type`, `TURNS_PLACEHOLDER`;
ai-dynamo/aiperf `SpeedBenchRow`). Rows whose source forbids redistribution ship the placeholder text and must be
resolved locally with ModelOpt's `prepare_data.py --dataset speed --config CONFIG`, which writes
`data/speed/CONFIG/test.parquet`: that folder is a valid source here. The throughput prompts are N x 1000 tiktoken
o200k_base tokens (speed.py `_pad_or_truncate_prompt`), so quantkit cuts them again to the target's tokenizer.

The data is never bundled or published (NVIDIA Evaluation Dataset License): results carry the dataset id, the
revision and a content hash of the files read, never the prompts.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path

from quantkit.errors import QuantkitError
from quantkit.io.prompts import PromptRecord

PREFIX = "speed-bench:"
SPEED_BENCH_REPO = "nvidia/SPEED-Bench"
# the Hub commit quantkit was written against (the public revision 487aa71 that consumers pin, e.g. a SPEED-Bench
# prompt-mix builder's SOURCE_REVISION); pass --speed-bench nvidia/SPEED-Bench@REV for another
SPEED_BENCH_REVISION = "487aa718444e816458d1a0a52bfce7a454285cf4"
CONFIGS = ("qualitative", "throughput_1k", "throughput_2k", "throughput_8k", "throughput_16k", "throughput_32k")
QUALITATIVE_CATEGORIES = (
    "coding",
    "humanities",
    "math",
    "multilingual",
    "qa",
    "rag",
    "reasoning",
    "roleplay",
    "stem",
    "summarization",
    "writing",
)
THROUGHPUT_CATEGORIES = ("low_entropy", "mixed", "high_entropy")
PLACEHOLDER = "FULL BENCHMARK DATA SHOULD BE FETCHED FROM THE SOURCE USING SPECDEC_BENCH"
REQUIRED_COLUMNS = ("question_id", "category", "turns")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w./-]+)?$")


class SpeedBenchError(QuantkitError):
    """A SPEED-Bench selector or source cannot be used as asked."""


@dataclass(frozen=True)
class SpeedBenchSet:
    records: list[PromptRecord]
    config: str
    category: str | None
    repo: str | None  # Hub dataset id, None for a local folder
    revision: str | None  # the commit read from the Hub (None: a local folder)
    content_sha256: str
    files: list[str]  # relative to the dataset root

    @property
    def name(self) -> str:
        return PREFIX + self.config + (f"/{self.category}" if self.category else "")


def is_speed_bench(prompts: str | Path) -> bool:
    return str(prompts).startswith(PREFIX)


def parse_selector(spec: str) -> tuple[str, str | None]:
    """`speed-bench:CONFIG[/CATEGORY]` -> (config, category)."""
    body = spec[len(PREFIX) :] if spec.startswith(PREFIX) else spec
    config, _, category = body.partition("/")
    if config not in CONFIGS:
        raise SpeedBenchError(
            f"--prompts {spec}: unknown SPEED-Bench config {config!r}; use one of "
            f"{', '.join(CONFIGS)}, e.g. speed-bench:qualitative or speed-bench:throughput_8k/mixed"
        )
    known = QUALITATIVE_CATEGORIES if config == "qualitative" else THROUGHPUT_CATEGORIES
    if category and category not in known:
        raise SpeedBenchError(f"--prompts {spec}: {config} has no category {category!r}; use one of {', '.join(known)}")
    return config, category or None


def throughput_tokens(config: str) -> int | None:
    """The prompt length a throughput config is built to (speed.py `_get_num_tokens_from_config`: 8k -> 8000)."""
    m = re.fullmatch(r"throughput_(\d+)k", config)
    return int(m.group(1)) * 1000 if m else None


def _fetch(repo: str, revision: str, config: str) -> tuple[Path, str]:
    """The dataset's `CONFIG/` files from the Hub at `revision` (HF_ENDPOINT and HF_TOKEN as huggingface_hub reads
    them, looked up at call time) -> (snapshot folder, the commit it is)."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    where = f"--speed-bench {repo}@{revision}"
    try:
        path = Path(
            snapshot_download(
                repo,
                repo_type="dataset",
                revision=revision,
                allow_patterns=[f"{config}/*.parquet"],
                endpoint=os.environ.get("HF_ENDPOINT") or None,
                token=os.environ.get("HF_TOKEN") or None,
            )
        )
    except GatedRepoError:
        raise SpeedBenchError(
            f"{where}: the dataset is gated; accept its licence on the Hub and set HF_TOKEN, or pass a local folder"
        ) from None
    except RevisionNotFoundError:
        raise SpeedBenchError(f"{where}: no such revision; pass {repo}@<commit> or a local folder") from None
    except RepositoryNotFoundError:
        raise SpeedBenchError(
            f"{where}: no such Hub dataset (or no access); check the id, set HF_TOKEN, or pass a local folder"
        ) from None
    except LocalEntryNotFoundError:
        raise SpeedBenchError(
            f"{where}: the Hub is unreachable and the files are not cached; pass a local folder "
            "laid out as CONFIG/test-*.parquet"
        ) from None
    except (HfHubHTTPError, OSError) as e:
        raise SpeedBenchError(f"{where}: download failed ({type(e).__name__}); pass a local folder") from None
    commit = path.name if re.fullmatch(r"[0-9a-f]{40}", path.name) else revision
    return path, commit


def _resolve(source: str | Path | None, config: str) -> tuple[Path, str | None, str | None]:
    """(dataset root, Hub repo or None, revision or None)."""
    text = str(source) if source is not None else f"{SPEED_BENCH_REPO}@{SPEED_BENCH_REVISION}"
    if Path(text).is_dir():
        return Path(text), None, None
    if Path(text).exists():
        raise SpeedBenchError(
            f"--speed-bench {text}: not a folder; pass a folder laid out as CONFIG/test-*.parquet or a Hub dataset id"
        )
    if not _HUB_ID.match(text):
        raise SpeedBenchError(f"--speed-bench {text}: neither a folder nor a Hub dataset id (owner/name[@revision])")
    repo, _, rev = text.partition("@")
    rev = rev or (SPEED_BENCH_REVISION if repo == SPEED_BENCH_REPO else "main")
    root, commit = _fetch(repo, rev, config)
    return root, repo, commit


def _content_hash(root: Path, files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        h.update(f.read_bytes())
        h.update(b"\0")
    return h.hexdigest()


def _placeholder_fix(config: str) -> str:
    return (
        f"resolve them locally with NVIDIA Model-Optimizer's examples/specdec_bench: python prepare_data.py "
        f"--dataset speed --config {config}, then pass --speed-bench <the data/speed folder it writes>"
    )


def load_speed_bench(spec: str, source: str | Path | None = None) -> SpeedBenchSet:
    """The rows of one config (and category) as prompt records: the first turn as a user message, later turns as
    follow-ups. Refuses placeholder rows, missing columns and empty selections in one line each."""
    import pyarrow.parquet as pq

    config, category = parse_selector(spec)
    root, repo, revision = _resolve(source, config)
    files = sorted((root / config).glob("test*.parquet"))
    where = f"--speed-bench {source if source is not None else SPEED_BENCH_REPO}"
    if not files:
        raise SpeedBenchError(
            f"{where}: no {config}/test-*.parquet in {root}; lay the folder out as the Hub dataset "
            "repo (CONFIG/test-00000-of-00001.parquet) or as prepare_data.py writes it"
        )
    from quantkit.io.files import require_regular_file

    for f in files:  # a pipe, a device or a link loop is no parquet file: say so, not "fetch it again"
        require_regular_file(
            f,
            f"{where}: {f.relative_to(root)}",
            fix="put the real parquet file there (a pipe or device is never read)",
            error=SpeedBenchError,
        )
    records: list[PromptRecord] = []
    placeholders = 0
    for f in files:
        try:
            table = pq.read_table(f)
        except Exception as e:  # pyarrow raises ArrowInvalid, OSError, ...: any of them means "not parquet we read"
            raise SpeedBenchError(
                f"{where}: {f.relative_to(root)} is not a readable parquet file ({type(e).__name__}); fetch it again"
            ) from None
        missing = [c for c in REQUIRED_COLUMNS if c not in table.column_names]
        if missing:
            raise SpeedBenchError(
                f"{where}: {f.relative_to(root)} lacks column(s) {', '.join(missing)}; SPEED-Bench "
                f"rows have {', '.join(REQUIRED_COLUMNS)} (and sub_category, source, ...)"
            )
        for row in table.select(list(REQUIRED_COLUMNS)).to_pylist():
            if category is not None and row["category"] != category:
                continue
            turns = row["turns"]
            if not isinstance(turns, list) or not turns or not all(isinstance(t, str) and t for t in turns):
                raise SpeedBenchError(
                    f"{where}: row {row['question_id']} in {f.relative_to(root)} has no turns "
                    "(a list of non-empty strings); fetch the dataset again"
                )
            if any(t.strip() == PLACEHOLDER for t in turns):
                placeholders += 1
                continue
            records.append(
                PromptRecord(
                    id=str(row["question_id"]),
                    domain=str(row["category"]),
                    messages=({"role": "user", "content": turns[0]},),
                    prompt=None,
                    followups=tuple(turns[1:]),
                )
            )
    if placeholders:
        raise SpeedBenchError(
            f"{where}: {placeholders} of {placeholders + len(records)} {spec[len(PREFIX) :]} rows "
            f"are placeholders whose text must be fetched from the original sources; " + _placeholder_fix(config)
        )
    if not records:
        raise SpeedBenchError(f"{where}: no rows for {spec}; check the category")
    return SpeedBenchSet(
        records=records,
        config=config,
        category=category,
        repo=repo,
        revision=revision,
        content_sha256=_content_hash(root, files),
        files=[f.relative_to(root).as_posix() for f in files],
    )
