"""Scale values (finite, positive, E8M0 not NaN), read with numpy: what vLLM's process_weights_after_loading takes as
given (vllm/model_executor/layers/quantization/quark/schemes/quark_ocp_mx.py, quark_w8a8_fp8.py)."""

from __future__ import annotations

from collections.abc import Sequence

from quantkit.io.headers import TensorInfo
from quantkit.naming.precision import LoadedCheckpoint
from quantkit.progress import Progress
from quantkit.results.precision import LayerPrecision
from quantkit.rules.rule import Findings, RuleContext


def scale_values(ctx: RuleContext) -> None:
    """scale-values: every scale of every layer vLLM quantizes is finite and positive."""
    ctx.progress("scale tensors")
    view = ctx.subject
    scale_data(view.loaded, view.layers, view.modules, ctx.findings, ctx.progress)


def scale_data(
    ck: LoadedCheckpoint,
    layers: Sequence[LayerPrecision],
    modules: dict[str, list[tuple[str, TensorInfo]]],
    findings: Findings,
    progress: Progress,
) -> None:
    """Every scale of every layer vLLM quantizes: finite and positive; E8M0 0xFF is NaN."""
    import numpy as np

    from quantkit.io.tensordata import TensorReader

    reader = TensorReader(ck.path)
    reported = {f.layer_or_tensor for f in findings}
    todo = []
    for lp in layers:
        if not lp.quantized or lp.scheme is None or lp.problem:
            continue
        for m in lp.checkpoint_modules:
            for t, info in modules.get(m, []):
                if t.endswith(("weight_scale", "input_scale")) and t not in reported:
                    todo.append((lp, t, info))
    for n, (_lp, t, info) in enumerate(todo):
        if n and n % 2000 == 0:
            progress(f"scale tensors {n}/{len(todo)}")
        arr = reader.array(info.file, t)
        if info.dtype in ("U8", "F8_E8M0"):
            nan = int(np.count_nonzero(arr == 0xFF))
            if nan:
                idx = np.argwhere(arr == 0xFF)[0].tolist()
                findings.add(
                    "error",
                    "scale-e8m0-nan",
                    t,
                    f"{t} has {nan} E8M0 scale byte(s) 0xFF, which is NaN (first at {idx}); every value "
                    "in those 32-element groups becomes NaN",
                    "re-quantize the layer",
                )
            continue
        bad_nan, bad_inf = int(np.isnan(arr).sum()), int(np.isinf(arr).sum())
        finite = arr[np.isfinite(arr)]
        nonpos = int((finite <= 0).sum())
        if bad_nan or bad_inf:
            findings.add(
                "error",
                "scale-not-finite",
                t,
                f"{t} has {bad_nan} NaN and {bad_inf} Inf value(s); the layer's output becomes NaN/Inf",
                "re-quantize the layer (check the source weights for NaN/Inf)",
            )
        if nonpos:
            findings.add(
                "error",
                "scale-not-positive",
                t,
                f"{t} has {nonpos} value(s) <= 0 (min {float(finite.min()):g}); a zero scale zeroes its "
                "channel, a negative one flips it",
                "re-quantize the layer",
            )
