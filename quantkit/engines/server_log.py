"""Read a vLLM server log for the kernel backends vLLM actually chose: MoE, attention, linear (and the KV-cache scale
it fell back to), each with the log line it came from.

vLLM chooses most backends at load time and says so only in its log; a fallback (no native kernel, a package missing
from the image, an env flag unset) is an INFO or WARNING line, never an error. This module recognises the lines vLLM
0.32 writes for those choices, by the message format each call site uses (below, one `_Pattern` per call site), and
returns them as a typed `ServerBackends`. It does not judge them: comparing with a prediction is the caller's
(quantkit.engines.backend_check).

vLLM's line layout (vllm/logger.py `_FORMAT`, default config): `[VLLM_LOGGING_PREFIX](<process> pid=<pid>) <LEVEL>
<mm-dd HH:MM:SS> [<file>:<line>] <message>`; the file is the emitting module's file name (a shortened path only at
DEBUG level, vllm/logging_utils/formatter.py `NewLineFormatter`). `*_once` calls (vllm/logger.py) print a given
message with given arguments once per process (scope "local") or once overall ("global"), so a backend chosen by
many layers appears once, and the same line can appear once per process (API server, engine core, workers).

The call sites (vLLM 0.32.0, paths under vllm/):
- MoE, `Using '<backend>' Mxfp4 MoE backend.`: model_executor/layers/fused_moe/oracle/mxfp4.py `_make_log_backend`,
  logged by `select_mxfp4_moe_backend`, `_return_or_raise` and the gpt-oss selector; `Falling back to '<backend>'
  with BF16 activations.` from `_warn_on_bf16_fallback` (a W4A4 checkpoint served with BF16 activations).
- MoE, the other oracles' `_make_log_backend` (model_executor/layers/fused_moe/oracle/): `Using <b> Fp8 MoE backend
  out of potential backends: [...]` (fp8.py), `Using <b> Int8 MoE backend out of ...` (int8.py), `Using <b>
  Unquantized MoE backend out of ...` (unquantized.py), `Using '<b>' NvFp4 MoE backend out of ...` (nvfp4.py),
  `Using '<b>' WNA16 MoE backend.` (int_wna16.py), `Using '%s' MxFp8 MoE backend.` (mxfp8.py), `Using %s W4A8 MoE
  backend.` (w4a8.py).
- MoE, Quark: `Using <backend> backend for <ocp_mx_scheme>` (model_executor/layers/quantization/quark/quark_moe.py
  `QuarkOCP_MX_MoEMethod.__init__`, after NONE is turned into EMULATION), and the emulation experts' own warning
  `Using OCP_MXQuantizationEmulationTritonExperts MOE backend. This will dequantize weights on the fly ...`
  (model_executor/layers/fused_moe/experts/ocp_mx_emulation_moe.py).
- MoE, quantkit's CPU plugin (quantkit/vllm_plugin/patches.py, logger `vllm.quantkit_cpu_mx`): `No native MXFP4 MoE
  backend on CPU: using quantkit's <class> (torch emulation).`; the plugin's `quantkit CPU MXFP4 plugin: Quark
  OCP-MX emulation enabled on CPU (...)` (quantkit/vllm_plugin/__init__.py) marks a server it patched.
- Attention: ROCm (platforms/rocm.py `get_attn_backend_cls`): `Using %s backend (selected via
  --attention-backend).`, `Using %s backend out of potential backends: %s.`, `Found incompatible backend(s) [%s]
  with %s. Overriding with %s out of potential backends: %s.` (a fallback), `Selected backend %s is incompatible
  with this layer (%s) of the %s run; using the auto-selected per-layer backend.` (a fallback); CUDA
  (platforms/cuda.py): `Using %s attention backend out of potential backends: %s.`, `Using %s backend.` (an explicit
  --attention-backend), `--block-size %d precluded higher-priority backend(s) %s. Using %s instead` (a fallback);
  CPU (platforms/cpu.py): `Using %s backend.` for AMX_MLA and CPU_MLA only. CPU_ATTN, the CPU default for MHA/GQA
  models, is returned without a log line, so a CPU server of a non-MLA model has no attention entry.
- Linear: `Selected %s for %s` (kernel class, layer; model_executor/kernels/linear/__init__.py, FP8/INT8 scaled-mm
  and the other `init_*_linear_kernel` functions; logged only when the caller passes a module name), `Using %s for
  MXFP4 GEMM` / `MXFP8 GEMM` / `MXFP6 GEMM` / `mixed-precision linear` (same file); Quark OCP-MX linears with
  simulated dequantization (model_executor/layers/quantization/quark/schemes/quark_ocp_mx.py `__init__`): `The
  current platform does not support native MXFP4/MXFP6 computation. Simulated weight dequantization ...` and `The
  current platform supports native MXFP4/MXFP6 computation, but kernels for input_dtype=... are not yet integrated`.
- KV cache: `Using KV cache scaling factor 1.0 for fp8_e4m3.` (model_executor/layers/quantization/kv_cache.py
  `BaseKVCacheMethod.process_weights_after_loading`): an FP8 KV cache with no scales from the checkpoint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from quantkit.results.base import Result

BackendKind = Literal["moe", "attention", "linear", "kv_cache"]
ChosenBy = Literal["vllm", "quantkit-cpu-plugin"]
KINDS: tuple[BackendKind, ...] = ("moe", "attention", "linear", "kv_cache")

EMULATION = "EMULATION"  # Mxfp4MoeBackend.EMULATION.value, the name vLLM logs for OCP-MX emulated experts
LINEAR_EMULATION = "EMULATION"  # the name given here to a Quark OCP-MX linear with simulated dequantization
KV_SCALE_1 = "scale-1.0"  # the name given here to an FP8 KV cache with no checkpoint scales


class BackendLine(Result):
    """One backend choice vLLM logged: what kind, the name as vLLM logs it, and the line it came from."""

    kind: BackendKind
    backend: str  # as vLLM logs it: 'EMULATION', 'AITER_MXFP4_MXFP4', 'ROCM_AITER_FA', 'EmulationMxfp4LinearKernel'
    what: str  # what the line is about: 'Mxfp4 MoE', 'attention', 'MXFP4 GEMM', 'fp8 scaled-mm', ...
    layer: str | None = None  # the layer a linear kernel was selected for, when the line names one
    detail: str | None = None  # what else the line says: the OCP-MX scheme, the requested activation, candidates
    fallback: bool = False  # the line says vLLM fell back from what was asked or preferred
    emulated: bool = False  # the chosen path emulates the quantized format (dequantize, compute in BF16)
    chosen_by: ChosenBy = "vllm"
    source: str  # the vLLM (or quantkit plugin) file and function that writes the line
    level: str | None = None
    process: str | None = None  # '(EngineCore_DP0 pid=..)' process name, when the line carries one
    line: str  # the log line, ANSI colours removed


class ServerBackends(Result):
    """Backends a vLLM server chose, read from its log: distinct names per kind in the order they were logged, and
    every line they came from. A kind with no line is empty (not logged, or not used by the model)."""

    moe: list[str] = []
    attention: list[str] = []
    linear: list[str] = []
    kv_cache: list[str] = []
    cpu_plugin: bool = False  # the quantkit CPU MXFP4 plugin patched this server (its "enabled" line is there)
    lines: list[BackendLine] = []

    def of(self, kind: BackendKind) -> list[BackendLine]:
        """The lines of one kind, in log order."""
        return [ln for ln in self.lines if ln.kind == kind]

    @property
    def emulated(self) -> list[BackendLine]:
        return [ln for ln in self.lines if ln.emulated]

    @property
    def fallbacks(self) -> list[BackendLine]:
        return [ln for ln in self.lines if ln.fallback]


@dataclass(frozen=True)
class _Pattern:
    kind: BackendKind
    what: str
    regex: re.Pattern[str]
    source: str
    files: tuple[str, ...] = ()  # the emitting file names; a line naming another file is not this call site
    fallback: bool = False
    emulated: bool | None = None  # None: decided from the backend name
    chosen_by: ChosenBy = "vllm"
    backend: str | None = None  # a fixed name when the message carries none


def _p(kind: BackendKind, what: str, regex: str, source: str, files: tuple[str, ...] = (), **kw: object) -> _Pattern:
    return _Pattern(kind, what, re.compile(regex), source, files, **kw)  # type: ignore[arg-type]


_B = r"'?(?P<backend>[A-Za-z0-9_.]+)'?"
_ORACLE = "vllm/model_executor/layers/fused_moe/oracle/"
_LINEAR = "vllm/model_executor/kernels/linear/__init__.py"
_OCP_MX = "vllm/model_executor/layers/quantization/quark/schemes/quark_ocp_mx.py QuarkOCP_MX.__init__"

PATTERNS: tuple[_Pattern, ...] = (
    # --- MoE
    _p("moe", "Mxfp4 MoE", rf"^Using {_B} Mxfp4 MoE backend\.", _ORACLE + "mxfp4.py _make_log_backend", ("mxfp4.py",)),
    _p(
        "moe",
        "Mxfp4 MoE",
        r"^No Mxfp4 MoE backend supports activation=(?P<detail>.+?) for the deployment "
        rf"configuration\. Falling back to {_B} with BF16 activations\.",
        _ORACLE + "mxfp4.py _warn_on_bf16_fallback",
        ("mxfp4.py",),
        fallback=True,
    ),
    _p(
        "moe",
        "Mxfp4 MoE",
        rf"^Using {_B} backend for (?:OCP_MX_Scheme\.)?(?P<detail>w_\w+)$",
        "vllm/model_executor/layers/quantization/quark/quark_moe.py QuarkOCP_MX_MoEMethod.__init__",
        ("quark_moe.py",),
    ),
    _p(
        "moe",
        "Mxfp4 MoE",
        r"^Using (?P<detail>OCP_MXQuantizationEmulationTritonExperts) MOE backend\. This will "
        "dequantize weights on the fly",
        "vllm/model_executor/layers/fused_moe/experts/ocp_mx_emulation_moe.py OCP_MXQuantizationEmulationTritonExperts",
        ("ocp_mx_emulation_moe.py",),
        emulated=True,
        backend=EMULATION,
    ),
    _p("moe", "Fp8 MoE", rf"^Using {_B} Fp8 MoE backend out of potential backends", _ORACLE + "fp8.py", ("fp8.py",)),
    _p(
        "moe", "Int8 MoE", rf"^Using {_B} Int8 MoE backend out of potential backends", _ORACLE + "int8.py", ("int8.py",)
    ),
    _p(
        "moe",
        "Unquantized MoE",
        rf"^Using {_B} Unquantized MoE backend out of potential backends",
        _ORACLE + "unquantized.py",
        ("unquantized.py",),
    ),
    _p(
        "moe",
        "NvFp4 MoE",
        rf"^Using {_B} NvFp4 MoE backend out of potential backends",
        _ORACLE + "nvfp4.py",
        ("nvfp4.py",),
    ),
    _p("moe", "WNA16 MoE", rf"^Using {_B} WNA16 MoE backend\.", _ORACLE + "int_wna16.py", ("int_wna16.py",)),
    _p("moe", "MxFp8 MoE", rf"^Using {_B} MxFp8 MoE backend", _ORACLE + "mxfp8.py", ("mxfp8.py",)),
    _p("moe", "W4A8 MoE", rf"^Using {_B} W4A8 MoE backend\.", _ORACLE + "w4a8.py", ("w4a8.py",)),
    _p(
        "moe",
        "Mxfp4 MoE",
        r"^(?:No native MXFP4 MoE backend on CPU|vLLM's \w+ MXFP4 MoE backend would drop the "
        r"checkpoint's MXFP4 activations \(BF16 fallback\)): using quantkit's (?P<detail>\w+) \(torch emulation\)\.",
        "quantkit/vllm_plugin/patches.py _select_with_cpu_fallback",
        ("patches.py",),
        emulated=True,
        chosen_by="quantkit-cpu-plugin",
        backend=EMULATION,
    ),
    # --- attention
    _p(
        "attention",
        "attention",
        rf"^Using {_B} backend \(selected via --attention-backend\)\.",
        "vllm/platforms/rocm.py RocmPlatform.get_attn_backend_cls",
        ("rocm.py",),
    ),
    _p(
        "attention",
        "attention",
        rf"^Using {_B} backend out of potential backends: (?P<detail>\[.*\])\.",
        "vllm/platforms/rocm.py RocmPlatform.get_attn_backend_cls",
        ("rocm.py",),
    ),
    _p(
        "attention",
        "attention",
        r"^Found incompatible backend\(s\) (?P<detail>\[.*?\]) with \S+\. Overriding with "
        rf"{_B} out of potential backends",
        "vllm/platforms/rocm.py RocmPlatform.get_attn_backend_cls",
        ("rocm.py",),
        fallback=True,
    ),
    _p(
        "attention",
        "attention",
        r"^Selected backend (?P<detail>\S+) is incompatible with this layer",
        "vllm/platforms/rocm.py RocmPlatform.get_attn_backend_cls",
        ("rocm.py",),
        fallback=True,
        backend="auto-selected",
    ),
    _p(
        "attention",
        "attention",
        rf"^Using {_B} attention backend out of potential backends",
        "vllm/platforms/cuda.py CudaPlatformBase.get_attn_backend_cls",
        ("cuda.py",),
    ),
    _p(
        "attention",
        "attention",
        r"^--block-size \d+ precluded higher-priority backend\(s\) (?P<detail>.*?)\. "
        rf"Using {_B} instead",
        "vllm/platforms/cuda.py CudaPlatformBase.get_attn_backend_cls",
        ("cuda.py",),
        fallback=True,
    ),
    _p(
        "attention",
        "attention",
        rf"^Using {_B} backend\.$",
        "vllm/platforms/cpu.py / cuda.py get_attn_backend_cls",
        ("cpu.py", "cuda.py"),
    ),
    # --- linear
    _p(
        "linear",
        "scaled-mm",
        rf"^Selected {_B} for (?P<layer>\S+)$",
        _LINEAR + " (init_*_linear_kernel)",
        ("__init__.py",),
    ),
    _p(
        "linear", "MXFP4 GEMM", rf"^Using {_B} for MXFP4 GEMM$", _LINEAR + " init_mxfp4_linear_kernel", ("__init__.py",)
    ),
    _p("linear", "MXFP8 GEMM", rf"^Using {_B} for MXFP8 GEMM$", _LINEAR, ("__init__.py",)),
    _p("linear", "MXFP6 GEMM", rf"^Using {_B} for MXFP6 GEMM$", _LINEAR, ("__init__.py",)),
    _p(
        "linear",
        "mixed-precision linear",
        rf"^Using {_B} for mixed-precision linear$",
        _LINEAR + " choose_mp_linear_kernel",
        ("__init__.py",),
    ),
    _p(
        "linear",
        "MXFP4 linear",
        r"^The current platform does not support native MXFP4/MXFP6 computation\. "
        "Simulated weight dequantization",
        _OCP_MX,
        ("quark_ocp_mx.py",),
        emulated=True,
        backend=LINEAR_EMULATION,
    ),
    _p(
        "linear",
        "MXFP4 linear",
        r"^The current platform supports native MXFP4/MXFP6 computation, but kernels for "
        r"(?P<detail>input_dtype=\S+ and weight_dtype=\S+) are not yet integrated",
        _OCP_MX,
        ("quark_ocp_mx.py",),
        emulated=True,
        fallback=True,
        backend=LINEAR_EMULATION,
    ),
    # --- KV cache
    _p(
        "kv_cache",
        "fp8 KV scales",
        r"^Using KV cache scaling factor 1\.0 for fp8_e4m3\.",
        "vllm/model_executor/layers/quantization/kv_cache.py BaseKVCacheMethod.process_weights_after_loading",
        ("kv_cache.py",),
        backend=KV_SCALE_1,
    ),
)

_PLUGIN_ENABLED = re.compile(r"quantkit CPU MXFP4 plugin: Quark OCP-MX emulation enabled on CPU")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
# vllm/logger.py _FORMAT: "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d]"
_PREFIX = re.compile(
    r"(?:\((?P<process>[^()]*?) pid=\d+\) )?(?P<level>DEBUG|INFO|WARNING|ERROR|CRITICAL) "
    r"\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? \[(?P<file>[^\]]+?):\d+\] (?P<msg>.*)$"
)


def _is_emulated(backend: str) -> bool:
    return backend.upper() == EMULATION or "emulation" in backend.lower()


def parse_line(line: str) -> BackendLine | None:
    """The backend choice one log line records, or None when the line is not one of `PATTERNS`."""
    clean = _ANSI.sub("", line).strip()
    m = _PREFIX.search(clean)
    msg, file, level, process = (
        (m["msg"].strip(), m["file"].rsplit("/", 1)[-1], m["level"], m["process"]) if m else (clean, None, None, None)
    )
    for pat in PATTERNS:
        if file is not None and pat.files and file not in pat.files:
            continue
        if file is None and pat.kind == "attention" and pat.regex.pattern.endswith(r"backend\.$"):
            continue  # "Using X backend." is too plain to trust without the emitting file
        hit = pat.regex.search(msg)
        if hit is None:
            continue
        groups = hit.groupdict()
        backend = pat.backend or groups["backend"]
        backend = backend.removeprefix("AttentionBackendEnum.")
        return BackendLine(
            kind=pat.kind,
            backend=backend,
            what=pat.what,
            layer=groups.get("layer"),
            detail=groups.get("detail"),
            fallback=pat.fallback,
            emulated=_is_emulated(backend) if pat.emulated is None else pat.emulated,
            chosen_by=pat.chosen_by,
            source=pat.source,
            level=level,
            process=process,
            line=clean,
        )
    return None


def parse_server_log(text: str) -> ServerBackends:
    """Every backend choice in a vLLM server log (`text`), in log order; the same choice logged by several processes
    is kept once (the first line)."""
    out = ServerBackends()
    seen: set[tuple[str, str, str, str | None, bool]] = set()
    for raw in re.split(r"[\r\n]+", text):
        if not raw.strip():
            continue
        if _PLUGIN_ENABLED.search(raw):
            out.cpu_plugin = True
        parsed = parse_line(raw)
        if parsed is None:
            continue
        key = (parsed.kind, parsed.backend, parsed.what, parsed.layer, parsed.fallback)
        if key in seen:
            continue
        if parsed.kind == "moe" and parsed.chosen_by == "quantkit-cpu-plugin":
            # the plugin overrides vLLM's pick in its process (patches.py _select_with_cpu_fallback): vLLM's own
            # MoE lines logged there before it ("Using 'CPU' ...", its BF16-activation fallback) no longer hold
            out.lines = [
                ln
                for ln in out.lines
                if not (ln.kind == "moe" and ln.chosen_by == "vllm" and ln.process == parsed.process)
            ]
            out.moe = list(dict.fromkeys(ln.backend for ln in out.lines if ln.kind == "moe"))
        seen.add(key)
        out.lines.append(parsed)
        names: list[str] = getattr(out, parsed.kind)
        if parsed.backend not in names:
            names.append(parsed.backend)
    return out


def read_server_log(path: str | Path) -> ServerBackends:
    """`parse_server_log` of a log file (undecodable bytes replaced)."""
    return parse_server_log(Path(path).read_bytes().decode("utf-8", "replace"))


__all__ = [
    "EMULATION",
    "KINDS",
    "PATTERNS",
    "BackendKind",
    "BackendLine",
    "ServerBackends",
    "parse_line",
    "parse_server_log",
    "read_server_log",
]
