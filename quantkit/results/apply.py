"""Results of `apply`: the per-layer decisions, the shards the executor wrote, and ApplyResult (quantkit.json)."""

from __future__ import annotations

from typing import Any, Literal

from quantkit.results.base import CommandResult, Result
from quantkit.vocab import DENSE_TARGET, ModelKind


class LayerDecision(Result):
    """What apply does with one vLLM runtime layer, and why."""

    runtime_name: str
    role: str = ""
    kind: str = ""
    checkpoint_modules: list[str] = []
    action: Literal["quantize", "keep"]
    scheme: str | None = None
    reason: str = ""
    source_format: str | None = None  # how the source stored it (bf16, fp8-block, int4-pack-quantized)


class ShardSummary(Result):
    """One shard as the executor wrote it: sizes, the SHA-256 of the bytes read and written, device, seconds, and
    how many tensors it holds and how many of them were quantized."""

    name: str
    bytes_in: int = 0
    bytes_out: int = 0
    sha256_in: str = ""
    sha256_out: str = ""
    device: str = ""
    seconds: float = 0.0
    resumed: bool = False
    tensors: int = 0
    quantized: int = 0


class ExecutorReport(Result):
    """What the native shard executor (quantkit.apply.shards.quantize_checkpoint) did."""

    source: str
    output: str
    scheme: str
    devices: list[str]
    exclude: list[str]
    shards: list[ShardSummary] = []
    total_seconds: float = 0.0
    mb_per_s: float = 0.0
    peak_rss_mb: float = 0.0
    resumed_shards: int = 0
    source_changed: list[str] = []  # finished before an interrupt, redone: its source changed
    ignored_files: list[str] = []  # *.safetensors the index does not name: not read
    source_sha256: dict[str, str] = {}  # every source shard's SHA-256 (a re-sharded run's shards are not the source's)
    readers: int = 0
    page_locked: bool = False  # the slot buffers were page-locked for asynchronous GPU copies
    max_memory_mb: float = 0.0  # the host-memory budget the run was held to
    slots: int = 0  # batches in flight at once (each in one slot buffer)
    slot_mb: float = 0.0
    cpu_processes: int = 0  # child processes that quantized on CPU (quantkit.apply.shards.cpu_pool); 0: threads
    quantization_config: dict[str, Any] = {}  # as Quark's file-to-file path writes it (checkpoint names)


class DraftVocabReport(Result):
    """A draft's lm_head pruned to its most used target tokens (quantkit.apply.vocab): what was kept and from what."""

    source: str
    rows_before: int
    rows_after: int
    target_vocab_size: int
    corpus: str
    corpus_sha256: str | None = None
    corpus_tokens: int = 0
    corpus_distinct_tokens: int = 0
    coverage: float | None = None  # share of the corpus's tokens the kept rows cover
    always_kept: int = 0  # special and EOS tokens, kept whatever their count
    lm_head_sha256: str = ""
    reason: str = ""


class ApplyResult(CommandResult):
    """Everything `apply` did; written as quantkit.json (the manifest) and printed by `--json`."""

    command: str = ""
    output: str = ""
    source: str = ""
    target: str | None = None  # the --target an EAGLE-3 draft was applied with (folder or Hub id)
    recipe: dict[str, Any] = {}
    model_kind: ModelKind = DENSE_TARGET
    architecture: str = ""
    path: str = ""
    path_reason: str = ""
    device: str = ""
    engine: str = "quark"
    source_format: str = "bf16"
    exclude: list[str] = []
    quark_exclude: list[str] = []
    layers: list[LayerDecision] = []
    size_before_bytes: int = 0
    size_after_bytes: int = 0
    timings_s: dict[str, float] = {}
    peak_rss_mb: float = 0.0
    versions: dict[str, str] = {}
    source_files: dict[str, str] = {}
    verified: dict[str, Any] = {}
    target_num_layers: int | None = None
    output_files: list[str] = []  # every file written, as paths relative to the output (`sub/file`)
    not_copied: list[str] = []  # source files (and `folder/`s) not copied: not what a checkpoint carries (io.files)
    # The shard executor (engine "native") and --dry-run:
    devices: list[str] = []
    device_plan: dict[str, list[str]] = {}  # device -> source shards it quantizes
    shards: list[ShardSummary] = []
    resumed_shards: int = 0
    max_shard_size: int | None = None  # --max-shard-size in bytes: output re-sharded (None: the source's shards)
    throughput_mb_s: float | None = None
    dry_run: bool = False
    # *.safetensors in the source that its index does not name: neither quantized nor copied (the index is the truth)
    ignored_weight_files: list[str] = []
    draft_vocab: DraftVocabReport | None = None  # --draft-vocab: the lm_head pruned before the recipe ran

    @property
    def quantized(self) -> list[LayerDecision]:
        return [d for d in self.layers if d.action == "quantize"]

    @property
    def kept(self) -> list[LayerDecision]:
        return [d for d in self.layers if d.action == "keep"]

    def to_dict(self) -> dict[str, Any]:
        d = super().to_dict()
        d["summary"] = {
            "quantized_layers": len(self.quantized),
            "kept_layers": len(self.kept),
            "size_ratio": round(self.size_after_bytes / max(self.size_before_bytes, 1), 4),
        }
        return d


__all__ = ["DraftVocabReport", "ApplyResult", "ExecutorReport", "LayerDecision", "ShardSummary"]
