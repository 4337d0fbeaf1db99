"""The journal of an interrupted native run (`.quantkit-journal.json` in the output while the run is
incomplete): the run key, the finished shards with their hashes, read back strictly, and the re-hash that decides
which finished shards a resume keeps."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quantkit.apply.shards.errors import ExecutorError, JournalError
from quantkit.io.checkpoint import sha256_file
from quantkit.results.apply import ShardSummary

JOURNAL_NAME = ".quantkit-journal.json"
JOURNAL_VERSION = 2  # 2: the run key holds drop, source format, model dtype and quantkit version


def run_key(
    src: Path,
    scheme: str,
    exclude: list[str],
    layer_config: dict[str, str] | None,
    drop: frozenset[str],
    decode: Any,
    model_dtype: str,
    max_shard_size: int | None = None,
) -> dict[str, Any]:
    """Everything besides the source shards' bytes that decides the output's bytes: a journal with another key is
    another run's, and resuming it would mix two runs' shards."""
    from quantkit import __version__

    key = {
        "source": str(src.resolve()),
        "scheme": scheme,
        "exclude": list(exclude),
        "layer_config": dict(layer_config or {}),
        "drop": sorted(drop),
        "source_format": getattr(decode, "name", None) if decode is not None else None,
        "model_dtype": model_dtype,
        "quantkit_version": __version__,
    }
    if max_shard_size is not None:  # absent in a default run's key, so that its journals read as before
        key["max_shard_size"] = max_shard_size
    return key


_Size = Annotated[int, Field(ge=0, le=2**63 - 1)]
_Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
_Sha256OrNone = Annotated[str, Field(pattern=r"^([0-9a-f]{64})?$")]  # "": a re-sharded output (sources apart)


class _JournalShard(BaseModel):
    """One finished shard as the journal records it (a ShardSummary plus what resume checks)."""

    model_config = ConfigDict(strict=True, extra="ignore")
    name: str
    bytes_in: _Size
    bytes_out: _Size
    sha256_in: (
        _Sha256OrNone  # of the source bytes this shard was quantized from: resume re-hashes the source against it
    )
    sha256_out: _Sha256
    tensors: _Size
    quantized: _Size
    seconds: float
    device: str
    resumed: bool = False
    weight_map: list[str]
    depends_on: list[str] = []  # other source shards it took parts from (a module split across shards)


class _JournalSource(BaseModel):
    """A source shard read in full by a re-sharded run (`--max-shard-size`): its size and SHA-256."""

    model_config = ConfigDict(strict=True, extra="ignore")
    bytes: _Size
    sha256: _Sha256


class _Journal(BaseModel):
    """The journal file as read back: the run key is compared separately, field by field."""

    model_config = ConfigDict(strict=True, extra="ignore")
    quantkit_journal: int
    shards: dict[str, _JournalShard] = {}
    sources: dict[str, _JournalSource] = {}


def read_journal(path: Path, key: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(The finished shards, the fully read sources of a re-sharded run) recorded in the journal at `path`, validated at the boundary: JournalError (one line,
    naming the fix) for a journal that cannot be read, is malformed, or is another run's."""
    fix = f"start over with apply --overwrite (or remove {path.parent})"
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:  # ValueError: also a 5,000-digit integer
        reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
        raise JournalError(f"{path}: not a readable quantkit journal ({reason}); {fix}") from None
    if not isinstance(raw, dict):
        raise JournalError(f"{path}: not a quantkit journal (a JSON {type(raw).__name__}, not an object); {fix}")
    version = raw.get("quantkit_journal")
    if version != JOURNAL_VERSION:
        raise JournalError(
            f"{path}: journal of a different run (journal format {str(version)[:20]}, this quantkit "
            f"writes {JOURNAL_VERSION}); {fix}"
        )
    try:
        journal = _Journal.model_validate(raw)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"])[:120]
        raise JournalError(f"{path}: malformed journal ({where}: {first['msg']}); {fix}") from None
    for name, shard in journal.shards.items():
        if shard.name != name:
            raise JournalError(
                f"{path}: malformed journal (shard {name[:80]!r} records name {shard.name[:80]!r}); {fix}"
            )
    differ = [k for k in {**key, "max_shard_size": None} if raw.get(k) != key.get(k)]
    if differ:
        raise JournalError(
            f"{path}: journal of a different run ({', '.join(differ)} differ"
            f"{'s' if len(differ) == 1 else ''}: {differ[0]} {_short_json(raw.get(differ[0]))} there, "
            f"{_short_json(key[differ[0]])} now); {fix}"
        )
    return (
        {name: shard.model_dump() for name, shard in journal.shards.items()},
        {name: source.model_dump() for name, source in journal.sources.items()},
    )


def _short_json(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def finished_shard_verdict(src: Path, dst: Path, name: str, entry: dict[str, Any]) -> str:
    """ "kept" when the output shard and the source shard both still hash as the journal recorded; else what changed.

    The source is re-hashed in full, at disk speed: size and mtime prove nothing (a file rewritten with the same
    size and its mtime set back, os.utime, is another file), and a stale shard would make the folder differ from an
    uninterrupted run while quantkit.json recorded a hash the source no longer has."""
    out, source = dst / name, src / name
    if not out.is_file() or out.stat().st_size != entry["bytes_out"]:
        return "output"
    if source.stat().st_size != entry["bytes_in"]:
        return "source"
    if sha256_file(out) != entry["sha256_out"]:
        return "output"
    if sha256_file(source) != entry["sha256_in"]:
        return "source"
    return "kept"


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    from quantkit.io.files import write_file_atomic

    # Compact: json's C encoder (indent would use the pure-Python one, holding the GIL for the journal's whole
    # weight map after every shard).
    write_file_atomic(path, json.dumps(data, separators=(",", ":")), error=None)


class Journal:
    """The journal of one run in its output folder: the run key and every finished shard (its summary, its source's
    hash and its weight map), rewritten atomically after each shard, removed when the run completes."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    @property
    def shards(self) -> dict[str, dict[str, Any]]:
        return self.data["shards"]

    def kept_shards(
        self,
        src: Path,
        dst: Path,
        shards: list[str],
        *,
        streams: int,
        depends_on: dict[str, list[str]] | None = None,
    ) -> tuple[dict[str, ShardSummary], dict[str, list[str]], list[tuple[int, str]], list[str]]:
        """Which finished shards a resume keeps: (their summaries, their weight maps, the (index, name) of the shards
        still to do, the finished shards whose source changed since). A shard is kept only if its output and its
        source still hash as recorded (both re-hashed in full, `streams` files at a time: see
        finished_shard_verdict), and, when it took parts of a module from other shards (`depends_on`), only if each of
        those is kept too (its source bytes proven unchanged); every other one is forgotten and its output removed.
        The journal is saved."""
        self.data["shards"] = {k: v for k, v in self.shards.items() if k in shards}
        finished = [(name, self.shards[name]) for name in shards if name in self.shards]
        with ThreadPoolExecutor(
            max_workers=max(1, min(streams, len(finished))), thread_name_prefix="quantkit-rehash"
        ) as hashers:
            verdicts = dict(
                zip(
                    (name for name, _ in finished),
                    hashers.map(lambda f: finished_shard_verdict(src, dst, f[0], f[1]), finished),
                    strict=True,
                )
            )
        deps = depends_on or {}
        kept = {name for name, v in verdicts.items() if v == "kept"}
        while True:  # a shard whose parts came from a shard that is redone is redone too
            drop = {name for name in kept if any(d not in kept for d in deps.get(name, []))}
            if not drop:
                break
            kept -= drop
        records: dict[str, ShardSummary] = {}
        weight_maps: dict[str, list[str]] = {}
        todo: list[tuple[int, str]] = []
        changed: list[str] = []
        for i, name in enumerate(shards):
            entry = self.shards.get(name)
            verdict = verdicts.get(name)
            if entry is not None and verdict == "kept" and name in kept:
                records[name] = ShardSummary(
                    name=name,
                    bytes_in=entry["bytes_in"],
                    bytes_out=entry["bytes_out"],
                    sha256_in=entry["sha256_in"],
                    sha256_out=entry["sha256_out"],
                    tensors=entry["tensors"],
                    quantized=entry["quantized"],
                    seconds=0.0,
                    device=entry["device"],
                    resumed=True,
                )
                weight_maps[name] = entry["weight_map"]
            else:
                if verdict == "source":
                    changed.append(name)
                self.shards.pop(name, None)
                (dst / name).unlink(missing_ok=True)
                todo.append((i, name))
        self.save()
        return records, weight_maps, todo, changed

    def kept_outputs(
        self,
        src: Path,
        dst: Path,
        outputs: dict[str, tuple[list[str], list[str]]],
        *,
        streams: int,
    ) -> tuple[dict[str, ShardSummary], dict[str, str], list[str]]:
        """A re-sharded run's resume: which finished output shards it keeps, (their summaries, the SHA-256 of every
        source shard they take tensors from, the sources that changed since). `outputs` maps each planned output
        shard to (its tensors, its sources). An output shard is kept only if it is planned with the same tensors and
        sources as journaled, its file re-hashes as recorded, and every one of its sources re-hashes as recorded
        (finished_shard_verdict's reasons); every other one is forgotten and its file removed. The journal is saved."""
        recorded = {
            n: e for n, e in self.shards.items() if n in outputs and outputs[n] == (e["weight_map"], e["depends_on"])
        }
        sources_seen = self.data.get("sources", {})
        wanted = sorted({s for n in recorded for s in outputs[n][1] if s in sources_seen})

        def source_ok(name: str) -> bool:
            entry = sources_seen[name]
            path = src / name
            return path.is_file() and path.stat().st_size == entry["bytes"] and sha256_file(path) == entry["sha256"]

        def output_ok(name: str) -> bool:
            entry, path = recorded[name], dst / name
            return (
                path.is_file()
                and path.stat().st_size == entry["bytes_out"]
                and sha256_file(path) == entry["sha256_out"]
            )

        jobs = [("source", n) for n in wanted] + [("output", n) for n in recorded]
        with ThreadPoolExecutor(max_workers=max(1, min(streams, len(jobs))), thread_name_prefix="quantkit-rehash") as h:
            verdicts = dict(
                zip(jobs, h.map(lambda j: source_ok(j[1]) if j[0] == "source" else output_ok(j[1]), jobs), strict=True)
            )
        good_sources = {n for n in wanted if verdicts[("source", n)]}
        changed = [n for n in wanted if not verdicts[("source", n)]]
        kept: dict[str, ShardSummary] = {}
        for name in outputs:
            entry = recorded.get(name)
            if entry is not None and verdicts[("output", name)] and all(s in good_sources for s in entry["depends_on"]):
                kept[name] = ShardSummary(
                    name=name,
                    bytes_in=entry["bytes_in"],
                    bytes_out=entry["bytes_out"],
                    sha256_out=entry["sha256_out"],
                    tensors=entry["tensors"],
                    quantized=entry["quantized"],
                    seconds=0.0,
                    device=entry["device"],
                    resumed=True,
                )
            else:
                self.shards.pop(name, None)
                (dst / name).unlink(missing_ok=True)
        self.data["shards"] = {n: e for n, e in self.shards.items() if n in kept}
        self.data["sources"] = {n: e for n, e in sources_seen.items() if n in good_sources}
        self.save()
        return kept, {n: e["sha256"] for n, e in self.data["sources"].items()}, changed

    def record_source(self, name: str, nbytes: int, sha256: str) -> None:
        """A source shard a re-sharded run has read and hashed in full, saved at once."""
        self.data.setdefault("sources", {})[name] = {"bytes": nbytes, "sha256": sha256}
        self.save()

    def record(self, summary: ShardSummary, weight_map: list[str], depends_on: list[str] | None = None) -> None:
        """One more finished shard, saved at once (a crash after this keeps it for a resume)."""
        self.shards[summary.name] = {
            **summary.model_dump(),
            "weight_map": weight_map,
            "depends_on": list(depends_on or []),
        }
        self.save()

    def save(self) -> None:
        write_json_atomic(self.path, self.data)

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def open_journal(dst: Path, key: dict[str, Any], *, resume: bool) -> Journal:
    """The journal of the run `key` into `dst`: a fresh one, or with `resume` the interrupted run's (read strictly:
    JournalError for another run's). ExecutorError for a non-empty `dst` without `resume`, or one that holds no
    journal. Creates `dst`."""
    path = dst / JOURNAL_NAME
    data: dict[str, Any] = {"quantkit_journal": JOURNAL_VERSION, **key, "shards": {}}
    if dst.exists() and any(dst.iterdir()):
        if not resume:
            raise ExecutorError(
                f"output {dst} exists and is not empty; remove it, or pass resume=True to continue an interrupted run"
            )
        if not path.is_file():
            raise ExecutorError(
                f"output {dst} holds no {JOURNAL_NAME}, so it is not an interrupted run to resume; "
                "remove it or choose another output folder"
            )
        data["shards"], sources = read_journal(path, key)
        if sources:
            data["sources"] = sources
    dst.mkdir(parents=True, exist_ok=True)
    return Journal(path, data)
