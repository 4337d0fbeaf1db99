"""Per-prompt speculative-decoding counters, the common output of both acceptance backends (no torch here, so the CLI's validation stays light)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class SequenceStats:
    """Spec-decode counters and output of one prompt."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    output_ids: list[int] = field(default_factory=list)
    target_forwards: int = 0
