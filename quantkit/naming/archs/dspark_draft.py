"""`DSparkDraftModel`: one architecture string, two drafts. vLLM's registry maps it to DeepSeek-V4's DSpark class
(vllm/models/deepseek_v4: DSparkDeepseekV4ForCausalLM), but SpecForge writes the same string for its Qwen3-based DSpark
drafts (`model_type: qwen3`), which vLLM builds only as `Qwen3DSparkModel` (quantkit.naming.archs.qwen3_dspark). Told
apart by config.json's model_type; each is refused in one line that names the class vLLM would build and the fix."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantkit.naming.builder import CheckpointModules
from quantkit.naming.family import DraftLayout, Family
from quantkit.naming.layers import CheckpointLayoutError, RuntimeLayer

SOURCE = "vllm/model_executor/models/registry.py"


def dspark_draft_layers(config: Mapping[str, Any], _ckpt: CheckpointModules, _t: int | None) -> list[RuntimeLayer]:
    if str(config.get("model_type")) == "qwen3":
        raise CheckpointLayoutError(
            "config.json says DSparkDraftModel with model_type qwen3: SpecForge's Qwen3 DSpark draft, but vLLM's "
            "registry maps DSparkDraftModel to DeepSeek-V4's DSparkDeepseekV4ForCausalLM; set architectures to "
            '["Qwen3DSparkModel"] (vLLM then builds qwen3_dspark.py Qwen3DSparkForCausalLM, which quantkit names)'
        )
    raise CheckpointLayoutError(
        f"config.json says DSparkDraftModel with model_type {config.get('model_type')!r}: DeepSeek-V4's DSpark draft "
        "(vLLM builds DSparkDeepseekV4ForCausalLM), a draft layout quantkit does not name yet (its target, "
        "DeepSeek-V4, is family deepseek_v4); serve it as it is"
    )


FAMILY = Family(
    "dspark_draft", ("DSparkDraftModel",), SOURCE, dspark_draft_layers,
    quark_templates={"*": "qwen3"}, draft=DraftLayout(method="dspark"),
)  # fmt: skip
