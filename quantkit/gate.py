"""`quantkit gate`: the pre-deployment gate. Runs check / acceptance / eval on candidates, compares every figure
with its threshold, and writes one report (JSON, Markdown, JUnit XML). It fails closed: a missed threshold, a step
that errored, or a step with no result fails the gate.

Gate config (YAML; unknown keys are errors; paths are relative to the config file):

    name: tiny-bundled
    target: ../examples/tiny/target           # the verifier
    draft: ../examples/tiny/eagle3-draft      # the BF16 EAGLE-3 draft (acceptance baseline)
    candidates:                               # quantized checkpoints under test
      - {name: draft-fp8, path: ../out/draft-fp8}                           # a draft: baseline = draft
      - {name: moe-mxfp4, path: ../out/moe-mxfp4, baseline: ../examples/tiny/moe-target}
    steps: [check, acceptance, eval]
    check: {platform: gfx950, tp: 1, vllm: auto}
    acceptance: {min_ratio: 0.98, per_domain_min_ratio: 0.95, min_al: 2.0, use_ci_lower_bound: false,
                 backend: auto, prompts: builtin, num_speculative_tokens: 3, max_new_tokens: 64}
    eval: {tasks: [tiny_french_mc], min_recovery: 0.98, use_lower_bound: false, limit: 100, backend: hf}

Which step applies to which candidate: `check` to all; `acceptance` to drafts (against `draft` with `target`) and
to quantized targets whose baseline is `target` (run as the verifier of `draft`); `eval` to targets.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal
from xml.sax.saxutils import escape, quoteattr

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quantkit import __version__, jsonout
from quantkit.errors import QuantkitError
from quantkit.yamlio import load_yaml

GATE_SCHEMA_VERSION = 1
Progress = Callable[[str], None]


class GateConfigError(QuantkitError):
    """The gate config file is missing, not YAML, or breaks the schema."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Candidate(_Strict):
    name: str
    path: str
    baseline: str | None = None


class CheckStep(_Strict):
    platform: Literal["gfx950", "gfx942", "cuda", "cpu"] = "gfx950"
    tp: int = Field(default=1, ge=1)
    vllm: Literal["auto", "off", "required"] = "auto"


class AcceptanceStep(_Strict):
    min_ratio: float = Field(default=0.98, gt=0)
    per_domain_min_ratio: float | None = Field(default=None, gt=0)
    min_al: float | None = Field(default=None, ge=1)
    use_ci_lower_bound: bool = False
    backend: Literal["auto", "reference", "vllm"] = "auto"
    prompts: str = "builtin"
    num_speculative_tokens: int = Field(default=3, ge=1)
    max_new_tokens: int = Field(default=64, ge=1)
    temperature: float = Field(default=0.0, ge=0)


class EvalStep(_Strict):
    tasks: list[str] = Field(min_length=1)
    min_recovery: float = Field(default=0.98, gt=0)
    use_lower_bound: bool = False
    limit: int | None = Field(default=None, ge=1)
    num_fewshot: int = Field(default=0, ge=0)
    backend: Literal["hf", "vllm"] = "hf"


class GateConfig(_Strict):
    name: str
    target: str
    draft: str | None = None
    candidates: list[Candidate] = Field(min_length=1)
    steps: list[Literal["check", "acceptance", "eval"]] = Field(min_length=1)
    check: CheckStep = CheckStep()
    acceptance: AcceptanceStep = AcceptanceStep()
    eval: EvalStep | None = None


def load_gate_config(path: str | Path) -> tuple[GateConfig, Path]:
    """Parse and validate a gate config; one-line errors name the file and the key."""
    p = Path(path)
    try:
        data = load_yaml(p.read_text())
    except OSError as e:
        raise GateConfigError(f"gate config {p}: cannot read it ({e.strerror or e}); pass a gate YAML file") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = str(getattr(e, "problem", None) or "not valid YAML")[:200]
        raise GateConfigError(f"gate config {p}:{where}: {problem}") from None
    if not isinstance(data, dict):
        raise GateConfigError(f"gate config {p}: expected a mapping with name, target, candidates, steps")
    try:
        cfg = GateConfig.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        key = ".".join(str(x) for x in err["loc"])
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].lower()
        raise GateConfigError(f"gate config {p}: {key}: {msg}") from None
    if "eval" in cfg.steps and cfg.eval is None:
        raise GateConfigError(f"gate config {p}: eval: the eval step needs an 'eval:' section with tasks")
    if "acceptance" in cfg.steps and cfg.draft is None:
        raise GateConfigError(f"gate config {p}: draft: the acceptance step needs the BF16 draft")
    names = [c.name for c in cfg.candidates]
    if len(set(names)) != len(names):
        raise GateConfigError(f"gate config {p}: candidates: names must be unique")
    base = p.resolve().parent
    for where, value in [("target", cfg.target), ("draft", cfg.draft)] + \
            [(f"candidates[{i}].path", c.path) for i, c in enumerate(cfg.candidates)] + \
            [(f"candidates[{i}].baseline", c.baseline) for i, c in enumerate(cfg.candidates)]:
        if value is not None and not (base / value).exists():
            raise GateConfigError(f"gate config {p}: {where}: {value} does not exist (paths are relative to the "
                                  "config file)")
    return cfg, base


@dataclass
class GateCheck:
    """One compared figure: passes when `value op threshold` holds."""

    candidate: str
    step: str
    name: str
    value: float | None
    threshold: float | None
    op: str
    passed: bool
    message: str = ""

    def line(self) -> str:
        if self.value is None:
            return f"{self.candidate}: {self.step}: {self.name}: {self.message}"
        return (f"{self.candidate}: {self.step}: {self.name} = {self.value:.4g} "
                f"(threshold {self.op} {self.threshold:.4g}){'' if self.passed else ' FAILED'}")


@dataclass
class GateResult:
    name: str
    config: str
    passed: bool
    checks: list[GateCheck]
    candidates: dict[str, dict[str, Any]]
    seconds: float
    outputs: dict[str, str] = field(default_factory=dict)

    @property
    def failures(self) -> list[GateCheck]:
        return [c for c in self.checks if not c.passed]

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema_version": GATE_SCHEMA_VERSION,
            "quantkit_version": __version__,
            "gate": {"name": self.name, "config": self.config, "passed": self.passed,
                     "checks": [asdict(c) for c in self.checks], "seconds": round(self.seconds, 2)},
            "candidates": self.candidates,
        }


def _cmp(value: float, op: str, threshold: float) -> bool:
    return value >= threshold if op == ">=" else value <= threshold


def run_gate(config_path: str | Path, progress: Progress | None = None) -> GateResult:
    """Run the configured steps on every candidate and judge every figure."""
    progress = progress or (lambda m: print(f"[quantkit gate] {m}", file=sys.stderr, flush=True))
    t0 = time.perf_counter()
    cfg, base = load_gate_config(config_path)
    rel = lambda p: str((base / p).resolve()) if p is not None else None  # noqa: E731
    target, draft = rel(cfg.target), rel(cfg.draft)
    checks: list[GateCheck] = []
    candidates: dict[str, dict[str, Any]] = {}

    from quantkit.checkpoint import resolve_source
    from quantkit.drafts import model_kind

    for cand in cfg.candidates:
        path = rel(cand.path)
        kind = model_kind(resolve_source(path).config)
        baseline = rel(cand.baseline) or (draft if kind == "eagle3-draft" else target)
        report: dict[str, Any] = {"schema_version": 1, "model": path, "baseline_model": baseline, "model_kind": kind}
        candidates[cand.name] = report
        ran: dict[str, bool] = {}

        def add(step: str, name: str, value: float | None, op: str, threshold: float | None, message: str = "",
                cand_name: str = cand.name) -> None:
            ok = value is not None and threshold is not None and _cmp(value, op, threshold)
            checks.append(GateCheck(cand_name, step, name, value, threshold, op, ok, message))

        def failed_step(step: str, e: BaseException, cand_name: str = cand.name) -> None:
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            if not isinstance(e, QuantkitError):
                msg = f"{type(e).__name__}: {msg}"
                if os.environ.get("QUANTKIT_DEBUG") == "1":
                    traceback.print_exc()
            checks.append(GateCheck(cand_name, step, f"{step}.error", None, None, "", False, f"step failed: {msg}"))

        if "check" in cfg.steps:
            progress(f"{cand.name}: check")
            try:
                from quantkit.check import check_checkpoint

                res = check_checkpoint(path, target=target if kind == "eagle3-draft" else None, tp=cfg.check.tp,
                                       platform=cfg.check.platform, vllm=cfg.check.vllm, progress=lambda _m: None)
                report["check"] = {"errors": len(res.errors), "warnings": len(res.warnings),
                                   "findings": [asdict(f) for f in res.findings], "vllm_load": res.vllm_load}
                first = res.errors[0] if res.errors else None
                add("check", "check.errors", float(len(res.errors)), "<=", 0.0,
                    f"first: {first.code} on {first.layer_or_tensor}: {first.message}" if first else "")
                # A candidate that vLLM would load with no quantized layer is not what the gate was asked to pass.
                quantized = sum(1 for lp in res.layers if lp.quantized)
                add("check", "check.quantized_layers", float(quantized), ">=", 1.0,
                    "" if quantized else "vLLM would load no layer quantized: is this the unquantized source?")
                ran["check"] = True
            except Exception as e:  # noqa: BLE001 - the gate reports every failure as a failed step
                failed_step("check", e)

        wants_acceptance = kind == "eagle3-draft" or (baseline == target and draft is not None)
        if "acceptance" in cfg.steps and wants_acceptance:
            a = cfg.acceptance
            progress(f"{cand.name}: acceptance")
            try:
                from quantkit.acceptance.run import run_acceptance

                res = run_acceptance(target, draft, path, prompts=a.prompts, num_speculative_tokens=a.num_speculative_tokens,
                                     temperature=a.temperature, max_new_tokens=a.max_new_tokens, backend=a.backend,
                                     progress=lambda _m: None)
                report["acceptance"] = {
                    "backend": res.backend, "num_speculative_tokens": a.num_speculative_tokens,
                    "prompts": a.prompts, "num_prompts": res.settings["num_prompts"],
                    "baseline": {"model": draft, "mean_acceptance_length": res.baseline.mean_acceptance_length,
                                 "per_domain": {d: v["mean_acceptance_length"] for d, v in res.baseline.per_domain.items()},
                                 "per_position": res.baseline.acceptance_rate_per_pos},
                    "candidate": {"model": path, "mean_acceptance_length": res.candidate.mean_acceptance_length,
                                  "per_domain": {d: v["mean_acceptance_length"] for d, v in res.candidate.per_domain.items()},
                                  "per_position": res.candidate.acceptance_rate_per_pos},
                    "ratio": res.ratio, "ratio_ci": res.ratio_ci, "per_domain_ratio": res.per_domain_ratio,
                }
                add("acceptance", "acceptance.ratio", res.ratio, ">=", a.min_ratio)
                if a.use_ci_lower_bound:
                    add("acceptance", "acceptance.ratio_ci_low", res.ratio_ci[0], ">=", a.min_ratio)
                if a.per_domain_min_ratio is not None:
                    for d, r in res.per_domain_ratio.items():
                        add("acceptance", f"acceptance.per_domain_ratio.{d}", r, ">=", a.per_domain_min_ratio)
                if a.min_al is not None:
                    add("acceptance", "acceptance.candidate_al", res.candidate.mean_acceptance_length, ">=", a.min_al)
                ran["acceptance"] = True
            except Exception as e:  # noqa: BLE001
                failed_step("acceptance", e)

        if "eval" in cfg.steps and kind != "eagle3-draft":
            e_cfg = cfg.eval
            assert e_cfg is not None
            progress(f"{cand.name}: eval")
            try:
                from quantkit.evaluate import run_eval

                res = run_eval(path, baseline, e_cfg.tasks, backend=e_cfg.backend, limit=e_cfg.limit,
                               num_fewshot=e_cfg.num_fewshot, progress=lambda _m: None)
                data = res.to_dict()
                report["eval"] = {"backend": e_cfg.backend, "limit": e_cfg.limit, "num_fewshot": e_cfg.num_fewshot,
                                  "tasks": data["tasks"]}
                if not data["tasks"]:
                    add("eval", "eval.tasks", None, ">=", e_cfg.min_recovery, "no task result")
                for t in data["tasks"]:
                    label = f"eval.{t['task']}.{t['metric']}"
                    add("eval", f"{label}.recovery", t.get("recovery"), ">=", e_cfg.min_recovery,
                        "" if t.get("recovery") is not None else "no recovery (baseline score 0?)")
                    if e_cfg.use_lower_bound:
                        add("eval", f"{label}.recovery_lower_bound", t.get("recovery_lower_bound"), ">=",
                            e_cfg.min_recovery)
                ran["eval"] = True
            except Exception as e:  # noqa: BLE001
                failed_step("eval", e)

    # Fail closed: a configured step that produced a result for no candidate is a failure, not a pass.
    for step in cfg.steps:
        if not any(c.step == step for c in checks):
            checks.append(GateCheck("*", step, f"{step}.result", None, None, "", False,
                                    f"no result: no candidate is one the {step} step applies to"))
    for name, report in candidates.items():
        mine = [c for c in checks if c.candidate == name]
        report["gate"] = {"passed": all(c.passed for c in mine),
                          "checks": [{"name": c.name, "value": c.value, "threshold": c.threshold, "op": c.op,
                                      "passed": c.passed} for c in mine]}
    return GateResult(cfg.name, str(Path(config_path).resolve()), all(c.passed for c in checks), checks, candidates,
                      time.perf_counter() - t0)


# --- report writers ----------------------------------------------------------------------------------------------


def render_markdown(result: GateResult) -> str:
    lines = [f"## quantkit gate `{result.name}`: {'PASSED' if result.passed else 'FAILED'}", ""]
    if result.failures:
        lines += ["Failed:", ""] + [f"- {c.line()}" for c in result.failures] + [""]
    lines += ["| candidate | step | figure | value | threshold | result |", "|---|---|---|---|---|---|"]
    for c in result.checks:
        value = "-" if c.value is None else f"{c.value:.4g}"
        thr = "-" if c.threshold is None else f"{c.op} {c.threshold:.4g}"
        verdict = "pass" if c.passed else f"**FAIL**{': ' + c.message if c.message else ''}"
        lines.append(f"| {c.candidate} | {c.step} | `{c.name}` | {value} | {thr} | {verdict} |")
    for name, rep in result.candidates.items():
        acc = rep.get("acceptance")
        if acc:
            lines += ["", f"### {name}: acceptance length ({acc['backend']}, K={acc['num_speculative_tokens']})", "",
                      "| domain | BF16 draft AL | candidate AL | ratio |", "|---|---|---|---|"]
            for d, r in acc["per_domain_ratio"].items():
                lines.append(f"| {d} | {acc['baseline']['per_domain'][d]:.3f} | {acc['candidate']['per_domain'][d]:.3f} "
                             f"| {r:.3f} |")
            lo, hi = acc["ratio_ci"]
            lines.append(f"| **all** | {acc['baseline']['mean_acceptance_length']:.3f} | "
                         f"{acc['candidate']['mean_acceptance_length']:.3f} | {acc['ratio']:.3f} (95% CI {lo:.3f}-{hi:.3f}) |")
        ev = rep.get("eval")
        if ev:
            lines += ["", f"### {name}: eval ({ev['backend']}, limit {ev['limit']})", "",
                      "| task | metric | baseline | quantized | delta | recovery |", "|---|---|---|---|---|---|"]
            for t in ev["tasks"]:
                fmt = lambda v: "-" if v is None else f"{v:.4f}"  # noqa: E731
                lines.append(f"| {t['task']} | {t['metric']} | {fmt(t.get('baseline'))} | {fmt(t.get('candidate'))} | "
                             f"{fmt(t.get('delta'))} | {fmt(t.get('recovery'))} |")
        chk = rep.get("check")
        if chk:
            lines += ["", f"### {name}: check: {chk['errors']} errors, {chk['warnings']} warnings"]
            for f in chk["findings"]:
                if f["severity"] in ("error", "warning"):
                    lines.append(f"- {f['severity']}: `{f['code']}` {f['layer_or_tensor']}: {f['message']}")
    return "\n".join(lines) + "\n"


def render_junit(result: GateResult) -> str:
    cases = []
    for c in result.checks:
        name = quoteattr(c.name)
        cls = quoteattr(f"quantkit.gate.{c.candidate}.{c.step}")
        if c.passed:
            cases.append(f"    <testcase classname={cls} name={name}/>")
        else:
            cases.append(f"    <testcase classname={cls} name={name}>\n"
                         f"      <failure message={quoteattr(c.line())}>{escape(c.message or c.line())}</failure>\n"
                         f"    </testcase>")
    failures = len(result.failures)
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f'<testsuites tests="{len(result.checks)}" failures="{failures}">\n'
            f'  <testsuite name={quoteattr("quantkit-gate " + result.name)} tests="{len(result.checks)}" '
            f'failures="{failures}" time="{result.seconds:.2f}">\n' + "\n".join(cases) + "\n  </testsuite>\n</testsuites>\n")


def write_reports(result: GateResult, out_dir: str | Path, junit: str | Path | None = None) -> dict[str, str]:
    """report.json (+ one report-<candidate>.json per candidate for `publish --report`), report.md, junit.xml."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "report.json", "markdown": out / "report.md",
             "junit": Path(junit) if junit else out / "junit.xml"}
    result.outputs = {k: str(v) for k, v in paths.items()}
    paths["json"].write_text(jsonout.dumps(result.to_dict()) + "\n")
    for name, rep in result.candidates.items():
        (out / f"report-{name}.json").write_text(jsonout.dumps(rep) + "\n")
    md = render_markdown(result)
    paths["markdown"].write_text(md)
    paths["junit"].parent.mkdir(parents=True, exist_ok=True)
    paths["junit"].write_text(render_junit(result))
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        with open(summary, "a", encoding="utf-8") as f:
            f.write(md)
    return result.outputs
