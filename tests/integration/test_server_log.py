"""quantkit.engines.server_log on log lines made from vLLM's own format strings, written by vLLM's own log formatter.

Each case names the vLLM (or quantkit plugin) module that logs the line and the message template as it stands in that
module's source: a %-format string, or an f-string with its replacement fields written `{}`. The test first finds the
template among the module's string literals (read with `ast` from the installed vLLM 0.32 source, adjacent literals
joined as Python joins them), so a case whose wording vLLM changed fails instead of testing an invented line; then it
renders the message, formats the record with vLLM's `NewLineFormatter` / `ColoredFormatter` and `_FORMAT` (vllm/logger.py,
vllm/logging_utils/formatter.py), and parses the line. No engine is started.
"""

from __future__ import annotations

import ast
import importlib.util
import logging
from functools import cache
from pathlib import Path

import pytest

from quantkit.engines.server_log import EMULATION, parse_line, parse_server_log, read_server_log
from tests.conftest import require_vllm

pytestmark = pytest.mark.vllm

ORACLE = "vllm.model_executor.layers.fused_moe.oracle."
LINEAR = "vllm.model_executor.kernels.linear"
OCP_MX = "vllm.model_executor.layers.quantization.quark.schemes.quark_ocp_mx"


def source_file(module: str) -> Path:
    """The installed source file of `module`, found without importing it or its packages (importing
    vllm.model_executor.layers takes ~40 s on the shared CI cores; only the source is read here)."""
    top, _, rest = module.partition(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        if top == "vllm":
            require_vllm()
        pytest.fail(f"{top} is not installed")
    base = Path(next(iter(spec.submodule_search_locations))).joinpath(*rest.split(".")) if rest else None
    for path in (base.with_suffix(".py"), base / "__init__.py") if base else ():
        if path.is_file():
            return path
    if base is None:
        return Path(next(iter(spec.submodule_search_locations))) / "__init__.py"
    pytest.fail(f"no source for {module}")


@cache
def literals(module: str) -> frozenset[str]:
    """Every string literal of `module`'s source; f-strings with each replacement field as `{}`."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source_file(module).read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            out.add(node.value)
        elif isinstance(node, ast.JoinedStr):
            out.add("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values))
    return frozenset(out)


def template(module: str, text: str, prefix: bool = False) -> str:
    """`text` as a literal of `module` (with prefix=True: the longest literal starting with `text`; an f-string's
    own literal parts are literals too, and shorter)."""
    found = literals(module)
    if prefix:
        hits = [s for s in found if s.startswith(text)]
        assert hits, f"{module} has no literal starting with {text!r}: vLLM changed the message"
        return max(hits, key=len)
    assert text in found, f"{module} has no literal {text!r}: vLLM changed the message"
    return text


def render(tmpl: str, args: tuple) -> str:
    return tmpl.format(*args) if "{}" in tmpl else (tmpl % args if args else tmpl)


@cache
def vllm_formatting() -> tuple[str, str, object]:
    """vllm/logger.py's `_FORMAT` (VLLM_LOGGING_PREFIX at its default, empty) and `_DATE_FORMAT`, and the module
    vllm/logging_utils/formatter.py, loaded from their files: importing vllm.logger imports torch (~11 s here)."""
    fmt = date = None
    for node in ast.walk(ast.parse(source_file("vllm.logger").read_text())):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name == "_FORMAT":
                assert isinstance(node.value, ast.JoinedStr)
                prefix, *rest = node.value.values
                assert "VLLM_LOGGING_PREFIX" in ast.unparse(prefix), "vllm/logger.py _FORMAT: prefix moved"
                fmt = "".join(v.value for v in rest if isinstance(v, ast.Constant))
            elif name == "_DATE_FORMAT":
                date = ast.literal_eval(node.value)
    assert fmt and date, "vllm/logger.py has no _FORMAT / _DATE_FORMAT"
    spec = importlib.util.spec_from_file_location("_vllm_log_formatter", source_file("vllm.logging_utils.formatter"))
    assert spec is not None and spec.loader is not None
    formatter = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(formatter)
    return fmt, date, formatter


def vllm_line(
    module: str,
    message: str,
    level: int = logging.INFO,
    process: str = "EngineCore_DP0",
    colour: bool = False,
    debug_paths: bool = False,
) -> str:
    """`message` as vLLM's configured handler writes it for a record from `module`."""
    fmt, date, formatter_module = vllm_formatting()
    fmt_cls = formatter_module.ColoredFormatter if colour else formatter_module.NewLineFormatter  # type: ignore[attr-defined]
    formatter = fmt_cls(fmt, date, log_level="DEBUG" if debug_paths else None)
    record = logging.LogRecord(module, level, str(source_file(module)), 123, message, None, None)
    record.vllm_process_name = process
    return formatter.format(record)


# (module, template text, args, kind, backend, fallback, emulated); `...` after the text: match it as a prefix
CASES = [
    (ORACLE + "mxfp4", "Using '{}' Mxfp4 MoE backend.", ("EMULATION",), "moe", "EMULATION", False, True),
    (
        ORACLE + "mxfp4",
        "Using '{}' Mxfp4 MoE backend.",
        ("AITER_MXFP4_MXFP4",),
        "moe",
        "AITER_MXFP4_MXFP4",
        False,
        False,
    ),
    (
        ORACLE + "mxfp4",
        "No Mxfp4 MoE backend supports activation=%s for the deployment configuration. Falling back "
        "to '%s' with BF16 activations.",
        ("QuantKey(u8,scale(u8,dynamic,GroupShape(row=1, col=32)),symmetric)", "AITER_TRITON_MXFP4_BF16"),
        "moe",
        "AITER_TRITON_MXFP4_BF16",
        True,
        False,
    ),
    (
        "vllm.model_executor.layers.quantization.quark.quark_moe",
        "Using {} backend for {}",
        ("EMULATION", "OCP_MX_Scheme.w_mxfp4_a_mxfp4"),
        "moe",
        "EMULATION",
        False,
        True,
    ),
    (
        "vllm.model_executor.layers.quantization.quark.quark_moe",
        "Using {} backend for {}",
        ("AITER_MXFP4_MXFP4", "w_mxfp4_a_mxfp4"),
        "moe",
        "AITER_MXFP4_MXFP4",
        False,
        False,
    ),
    (
        "vllm.model_executor.layers.fused_moe.experts.ocp_mx_emulation_moe",
        "Using OCP_MXQuantizationEmulationTritonExperts MOE backend. This...",
        (),
        "moe",
        EMULATION,
        False,
        True,
    ),
    (
        ORACLE + "fp8",
        "Using {} Fp8 MoE backend out of potential backends: {}.",
        ("AITER", "['AITER', 'TRITON']"),
        "moe",
        "AITER",
        False,
        False,
    ),
    (
        ORACLE + "int8",
        "Using {} Int8 MoE backend out of potential backends: {}.",
        ("TRITON", "['TRITON']"),
        "moe",
        "TRITON",
        False,
        False,
    ),
    (
        ORACLE + "unquantized",
        "Using {} Unquantized MoE backend out of potential backends: {}.",
        ("AITER", "['AITER', 'TRITON']"),
        "moe",
        "AITER",
        False,
        False,
    ),
    (
        ORACLE + "nvfp4",
        "Using '{}' NvFp4 MoE backend out of potential backends: {}.",
        ("EMULATION", "['EMULATION']"),
        "moe",
        "EMULATION",
        False,
        True,
    ),
    (ORACLE + "int_wna16", "Using '{}' WNA16 MoE backend.", ("MARLIN",), "moe", "MARLIN", False, False),
    (ORACLE + "mxfp8", "Using '%s' MxFp8 MoE backend.", ("TRITON",), "moe", "TRITON", False, False),
    (ORACLE + "mxfp8", "Using '%s' MxFp8 MoE backend (user-requested).", ("TRITON",), "moe", "TRITON", False, False),
    (ORACLE + "w4a8", "Using %s W4A8 MoE backend.", ("CUTLASS",), "moe", "CUTLASS", False, False),
    (
        "quantkit.vllm_plugin.patches",
        "No native MXFP4 MoE backend on CPU: using quantkit's %s (torch emulation).",
        ("CpuOcpMxEmulationExperts",),
        "moe",
        EMULATION,
        False,
        True,
    ),
    (
        "quantkit.vllm_plugin.patches",
        "vLLM's %s MXFP4 MoE backend would drop the checkpoint's MXFP4 activations (BF16 "
        "fallback): using quantkit's %s (torch emulation).",
        ("CPU", "CpuOcpMxEmulationExperts"),
        "moe",
        EMULATION,
        False,
        True,
    ),
    (
        "vllm.platforms.rocm",
        "Using %s backend (selected via --attention-backend).",
        ("ROCM_AITER_UNIFIED_ATTN",),
        "attention",
        "ROCM_AITER_UNIFIED_ATTN",
        False,
        False,
    ),
    (
        "vllm.platforms.rocm",
        "Using %s backend out of potential backends: %s.",
        ("ROCM_ATTN", "['ROCM_ATTN', 'TRITON_ATTN']"),
        "attention",
        "ROCM_ATTN",
        False,
        False,
    ),
    (
        "vllm.platforms.rocm",
        "Found incompatible backend(s) [%s] with %s. Overriding with %s out of potential backends: %s.",
        ("ROCM_AITER_FA", "AttentionType.DECODER", "TRITON_ATTN", "['TRITON_ATTN']"),
        "attention",
        "TRITON_ATTN",
        True,
        False,
    ),
    (
        "vllm.platforms.rocm",
        "Selected backend %s is incompatible with this layer (%s) of the %s run; using the "
        "auto-selected per-layer backend. Reason: %s",
        ("ROCM_AITER_FA", "decoder", "turboquant", "kv dtype"),
        "attention",
        "auto-selected",
        True,
        False,
    ),
    (
        "vllm.platforms.cuda",
        "Using %s attention backend out of potential backends: %s.",
        ("FLASH_ATTN", "['FLASH_ATTN', 'FLASHINFER']"),
        "attention",
        "FLASH_ATTN",
        False,
        False,
    ),
    (
        "vllm.platforms.cuda",
        "--block-size %d precluded higher-priority backend(s) %s. Using %s instead...",
        (1, "FLASH_ATTN", "TRITON_ATTN"),
        "attention",
        "TRITON_ATTN",
        True,
        False,
    ),
    (
        "vllm.platforms.cuda",
        "Using %s backend.",
        ("AttentionBackendEnum.FLASH_ATTN",),
        "attention",
        "FLASH_ATTN",
        False,
        False,
    ),
    ("vllm.platforms.cpu", "Using %s backend.", ("CPU_MLA",), "attention", "CPU_MLA", False, False),
    (
        LINEAR,
        "Selected %s for %s",
        ("AiterPreshuffledPerTokenFp8ScaledMMLinearKernel", "model.layers.0.self_attn.qkv_proj"),
        "linear",
        "AiterPreshuffledPerTokenFp8ScaledMMLinearKernel",
        False,
        False,
    ),
    (LINEAR, "Using %s for MXFP4 GEMM", ("AiterMxfp4LinearKernel",), "linear", "AiterMxfp4LinearKernel", False, False),
    (
        LINEAR,
        "Using %s for MXFP4 GEMM",
        ("EmulationMxfp4LinearKernel",),
        "linear",
        "EmulationMxfp4LinearKernel",
        False,
        True,
    ),
    (
        LINEAR,
        "Using %s for MXFP4 GEMM",
        ("CpuEmulationMxfp4LinearKernel",),
        "linear",
        "CpuEmulationMxfp4LinearKernel",
        False,
        True,
    ),
    (LINEAR, "Using %s for MXFP8 GEMM", ("AiterMxfp8LinearKernel",), "linear", "AiterMxfp8LinearKernel", False, False),
    (
        LINEAR,
        "Using %s for mixed-precision linear",
        ("MarlinLinearKernel",),
        "linear",
        "MarlinLinearKernel",
        False,
        False,
    ),
    (
        OCP_MX,
        "The current platform does not support native MXFP4/MXFP6 computation...",
        (),
        "linear",
        EMULATION,
        False,
        True,
    ),
    (
        OCP_MX,
        "The current platform supports native MXFP4/MXFP6 computation, but kernels for input_dtype=...",
        ("None", "mxfp4"),
        "linear",
        EMULATION,
        True,
        True,
    ),
    (
        "vllm.model_executor.layers.quantization.kv_cache",
        "Using KV cache scaling factor 1.0 for fp8_e4m3...",
        (),
        "kv_cache",
        "scale-1.0",
        False,
        False,
    ),
]


def case_message(module: str, text: str, args: tuple) -> str:
    if text.endswith("..."):
        return render(template(module, text[:-3], prefix=True), args)
    return render(template(module, text), args)


@pytest.mark.parametrize(
    ("module", "text", "args", "kind", "backend", "fallback", "emulated"),
    CASES,
    ids=[f"{c[0].rsplit('.', 1)[-1]}-{c[4]}-{i}" for i, c in enumerate(CASES)],
)
def test_vllm_format_strings_parse(module, text, args, kind, backend, fallback, emulated):
    message = case_message(module, text, args)
    line = vllm_line(module, message, logging.WARNING if fallback or emulated else logging.INFO)
    got = parse_line(line)
    assert got is not None, line
    assert (got.kind, got.backend, got.fallback, got.emulated) == (kind, backend, fallback, emulated)
    assert got.line == line and got.process == "EngineCore_DP0"
    assert source_file(module).name in got.source or module.startswith(LINEAR)
    # the same line in colour and with vLLM's DEBUG-level shortened paths reads the same
    for variant in (vllm_line(module, message, colour=True), vllm_line(module, message, debug_paths=True)):
        again = parse_line(variant)
        assert again is not None and (again.kind, again.backend) == (kind, backend), variant


def test_quark_moe_names_the_scheme_and_linear_lines_the_layer():
    got = parse_line(
        vllm_line(
            "vllm.model_executor.layers.quantization.quark.quark_moe",
            render(
                template("vllm.model_executor.layers.quantization.quark.quark_moe", "Using {} backend for {}"),
                ("EMULATION", "OCP_MX_Scheme.w_mxfp4_a_mxfp4"),
            ),
        )
    )
    assert got is not None and got.detail == "w_mxfp4_a_mxfp4"
    got = parse_line(
        vllm_line(
            LINEAR,
            render(
                template(LINEAR, "Selected %s for %s"), ("TritonFp8BlockScaledMMKernel", "model.layers.3.mlp.down_proj")
            ),
        )
    )
    assert got is not None and got.layer == "model.layers.3.mlp.down_proj"


def test_plain_line_from_another_file_is_not_a_backend():
    """ "Using %s backend." means an attention backend only from the platform files that log it that way."""
    msg = render(template("vllm.platforms.cpu", "Using %s backend."), ("CPU_MLA",))
    assert parse_line(vllm_line("vllm.config.speculative", msg)) is None
    assert parse_line(msg) is None  # without vLLM's prefix, the emitting file is unknown
    # a specific message is recognised without the prefix (another log format); an unrelated line never is
    assert parse_line(render(template(ORACLE + "mxfp4", "Using '{}' Mxfp4 MoE backend."), ("TRITON",))) is not None
    assert parse_line(vllm_line("vllm.engine.arg_utils", "Using max model len 2048")) is None


def test_mxfp4_unsupported_debug_line_is_not_a_choice():
    """The oracle's "does not support the deployment configuration" lines name backends it did NOT choose."""
    msg = render(
        template(ORACLE + "mxfp4", "Mxfp4 MoE backend '{}' does not support the deployment configuration"),
        ("AITER_MXFP4_MXFP4",),
    )
    assert parse_line(vllm_line(ORACLE + "mxfp4", msg + " since not on gfx950.", logging.DEBUG)) is None


def test_a_server_log_deduplicated_in_log_order(tmp_path):
    """A log as a CPU server writes it: the plugin's lines, MoE chosen by the plugin then named by Quark, the same
    line from two processes, a linear kernel per layer, the KV fallback; unrelated lines in between."""
    quark_moe = "vllm.model_executor.layers.quantization.quark.quark_moe"
    enabled = "quantkit CPU MXFP4 plugin: Quark OCP-MX emulation enabled on CPU (%s)."
    assert enabled in literals("quantkit.vllm_plugin")
    plugin_moe = render(
        template(
            "quantkit.vllm_plugin.patches", "No native MXFP4 MoE backend on CPU: using quantkit's %s (torch emulation)."
        ),
        ("CpuOcpMxEmulationExperts",),
    )
    mxfp4_gemm = render(template(LINEAR, "Using %s for MXFP4 GEMM"), ("CpuEmulationMxfp4LinearKernel",))
    lines = [
        vllm_line("quantkit.vllm_plugin", enabled % "register_linear_kernel(...)", process="APIServer"),
        vllm_line("vllm.engine.arg_utils", "Using max model len 2048", process="APIServer"),
        vllm_line("quantkit.vllm_plugin", enabled % "register_linear_kernel(...)"),
        vllm_line(LINEAR, mxfp4_gemm),
        vllm_line("quantkit.vllm_plugin.patches", plugin_moe),
        vllm_line(
            quark_moe,
            render(template(quark_moe, "Using {} backend for {}"), ("EMULATION", "OCP_MX_Scheme.w_mxfp4_a_mxfp4")),
        ),
        vllm_line(LINEAR, mxfp4_gemm, process="Worker_TP1"),
        vllm_line(
            "vllm.model_executor.layers.quantization.kv_cache",
            case_message(
                "vllm.model_executor.layers.quantization.kv_cache",
                "Using KV cache scaling factor 1.0 for fp8_e4m3...",
                (),
            ),
            logging.WARNING,
        ),
    ]
    path = tmp_path / "server.log"
    path.write_bytes(("\r\n".join(lines) + "\n").encode() + b"\xff garbage\n")
    got = read_server_log(path)
    assert got.cpu_plugin
    assert (got.moe, got.attention, got.linear, got.kv_cache) == (
        [EMULATION],
        [],
        ["CpuEmulationMxfp4LinearKernel"],
        ["scale-1.0"],
    )
    assert [ln.chosen_by for ln in got.of("moe")] == ["quantkit-cpu-plugin"]  # Quark's line repeats the choice
    assert got.of("moe")[0].line == lines[4]
    assert [ln.backend for ln in got.emulated] == ["CpuEmulationMxfp4LinearKernel", EMULATION]
    assert got.fallbacks == []
    assert parse_server_log("").lines == [] and not parse_server_log("").cpu_plugin
    assert got.to_dict()["moe"] == [EMULATION]


def test_the_plugins_override_supersedes_vllms_cpu_pick_in_its_process():
    """On an AMX host vLLM picks its CPU backend for W4A4 experts with BF16 activations and logs so; quantkit's plugin
    then returns its emulation in the same process (patches.py _select_with_cpu_fallback). The backends read from
    the log are the plugin's: vLLM's superseded lines of that process are dropped, and a later repeat of vLLM's
    pick from another process counts as the same choice, already superseded (lines are kept once)."""
    mxfp4 = ORACLE + "mxfp4"
    vllm_pick = render(template(mxfp4, "Using '{}' Mxfp4 MoE backend."), ("CPU",))
    bf16 = render(
        template(
            mxfp4,
            "No Mxfp4 MoE backend supports activation=%s for the deployment configuration. "
            "Falling back to '%s' with BF16 activations.",
        ),
        ("QuantKey(u8)", "CPU"),
    )
    plugin = render(
        template(
            "quantkit.vllm_plugin.patches",
            "vLLM's %s MXFP4 MoE backend would drop the checkpoint's "
            "MXFP4 activations (BF16 fallback): using quantkit's %s (torch emulation).",
        ),
        ("CPU", "CpuOcpMxEmulationExperts"),
    )
    got = parse_server_log(
        "\n".join(
            [
                vllm_line(mxfp4, bf16, logging.WARNING),
                vllm_line(mxfp4, vllm_pick),
                vllm_line("quantkit.vllm_plugin.patches", plugin),
                vllm_line(mxfp4, vllm_pick, process="Worker_TP1"),
            ]
        )
    )
    assert got.moe == [EMULATION]
    assert [(ln.chosen_by, ln.backend) for ln in got.of("moe")] == [("quantkit-cpu-plugin", EMULATION)]
    assert got.fallbacks == [] and [ln.detail for ln in got.emulated] == ["CpuOcpMxEmulationExperts"]
