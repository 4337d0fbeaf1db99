"""Results of `demo`: each step of the pipeline on the bundled tiny models, the gate's verdict and the outputs."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_serializer

from quantkit.results.base import CommandResult


class DemoResult(CommandResult):
    """`quantkit demo --json` and the demo's demo.json."""

    workdir: str
    gate_passed: bool | None = None
    gate_verdict: str | None = None
    seconds: float = 0.0
    steps: list[dict[str, Any]] = Field(default_factory=list)  # {step, seconds, passed, ...} in run order
    outputs: dict[str, str] = Field(default_factory=dict)  # what the demo wrote, by name
    conclusion: str = ""  # what the gate proved, against which thresholds, and where to look next (quantkit.demo)

    @field_serializer("seconds")
    def _seconds(self, v: float) -> float:
        return round(v, 1)


__all__ = ["DemoResult"]
