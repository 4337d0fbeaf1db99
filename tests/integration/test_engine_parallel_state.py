# tier: integration
"""vLLM's parallel state belongs to the process: an MoE engine built after a dense one in the same process (a gate's
steps, acceptance's engines, a test session) gets the expert-parallel group it needs, and the dense engine still
generates as before while both live (quantkit.engines.vllm_engine._reset_dense_parallel_state). Without the reset, vLLM 0.32 raises
"expert parallel group is not initialized" building the MoE engine (CI saw it when xdist gave one worker a dense
engine before tests/integration/test_pair.py)."""

from __future__ import annotations

from tests.conftest import TINY, require_vllm

PROMPT = "The capital of France is"


def test_moe_engine_after_a_dense_engine_in_the_same_process(vllm_spec_engine):
    require_vllm()
    from vllm import SamplingParams
    from vllm.distributed import parallel_state

    from quantkit.engines.vllm_engine import make_llm

    params = SamplingParams(temperature=0.0, max_tokens=8)
    before = vllm_spec_engine.generate([PROMPT], params, use_tqdm=False)[0].outputs[0].token_ids
    assert parallel_state.model_parallel_is_initialized()
    moe = make_llm(TINY / "moe-target", None, max_model_len=256)
    assert parallel_state._EP is not None  # the MoE engine's expert-parallel group exists now
    assert len(moe.generate([PROMPT], params, use_tqdm=False)[0].outputs[0].token_ids) > 0
    # while both live, the dense engine runs on the rebuilt groups unchanged (an engine's shutdown tears the state
    # down for every engine of the process: vLLM's own behaviour, not this reset's)
    after = vllm_spec_engine.generate([PROMPT], params, use_tqdm=False)[0].outputs[0].token_ids
    assert list(after) == list(before)
