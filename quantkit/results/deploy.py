"""Results of `deploy`: the `vllm serve` manifest (deploy.json), its environment variables and its findings."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

from pydantic import ConfigDict, computed_field

from quantkit.results.base import CommandResult, Result
from quantkit.results.check import Finding
from quantkit.results.kernels import KernelPath

DEPLOY_SCHEMA_VERSION = 1
DEPLOY_FILE = "deploy.json"

# deploy.json's keys in the order it has always written them (computed fields included).
_KEY_ORDER = (
    "schema_version",
    "model",
    "draft",
    "platform",
    "tensor_parallel_size",
    "max_model_len",
    "kv_cache_dtype",
    "num_speculative_tokens",
    "speculative_config",
    "argv",
    "command",
    "shell",
    "env",
    "findings",
    "ok",
    "vllm_version",
    "vllm_min_version",
    "vllm_min_version_why",
    "predicted_backends",
    "kernel_paths",
    "multi_node",
)


class EnvVar(Result):
    """One environment variable for `vllm serve`, why it is set, and who says so."""

    model_config = ConfigDict(frozen=True)

    name: str
    value: str
    why: str
    source: str


class VersionNeed(Result):
    """One reason the deployment needs a vLLM at least this new."""

    model_config = ConfigDict(frozen=True)

    version: str
    why: str
    source: str


class MultiNode(Result):
    """vLLM's own multi-node launch over Ray (docs/serving/parallelism_scaling.md: TP = GPUs per node, PP = nodes):
    start the head, then each worker, then `argv` on the head."""

    nodes: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    ray_port: int = 6379
    head: list[str]  # `ray start --head ...` (with VLLM_HOST_IP=<head ip> and the env on every node)
    worker: list[str]  # `ray start --address ...` on each of the nodes - 1 workers
    env: list[str]  # what every node needs in its environment before `ray start`
    per_rank: dict[str, int | str]  # the static split: heads, kv heads, experts, MXFP4 groups, layers per stage


class DeployManifest(CommandResult):
    """How to serve `model` (with `draft` as its EAGLE-3 speculator) on `platform`, and what is known to be wrong.

    `to_dict()` is deploy.json:

        {"schema_version": 1, "model": TARGET, "draft": DRAFT|null, "platform": "gfx950", "tensor_parallel_size": 8,
         "max_model_len": 131072, "kv_cache_dtype": "auto", "num_speculative_tokens": 3,
         "speculative_config": {"method": "eagle3", "model": DRAFT, "num_speculative_tokens": 3} | null,
         "argv": ["vllm", "serve", TARGET, "--tensor-parallel-size", "8", ...], "command": "vllm serve ...",
         "shell": "VLLM_ROCM_USE_AITER=1 ... vllm serve ...",
         "env": [{"name", "value", "why", "source"}], "findings": [{"severity", "code", "layer_or_tensor", "message",
         "fix", "source"}], "ok": true}
    """

    schema_version: int = DEPLOY_SCHEMA_VERSION
    model: str
    draft: str | None
    platform: str
    tensor_parallel_size: int
    max_model_len: int | None
    kv_cache_dtype: str
    num_speculative_tokens: int | None
    # where K came from: --num-speculative-tokens, "tune.json (quantkit tune --apply)" or "default" (None: no draft)
    num_speculative_tokens_source: str | None = None
    speculative_config: dict[str, Any] | None
    argv: list[str]
    env: list[EnvVar]
    findings: list[Finding] = []
    vllm_version: str | None = None  # the vLLM the rules held for (--vllm-version / installed / newest known)
    vllm_min_version: str | None = None  # the oldest vLLM this deployment works on (None: no rule needs a newer one)
    vllm_min_version_why: list[VersionNeed] = []
    # kind ("moe" | "linear" | "attention") -> the backend vLLM 0.32 is predicted to log for the served target on
    # `platform` (the slowest layer of that kind): Mxfp4MoeBackend values ("AITER_MXFP4_MXFP4", "EMULATION", ...) or
    # linear kernel class names ("AiterPreshuffledPerTokenFp8ScaledMMLinearKernel", "UnquantizedLinearMethod", ...)
    predicted_backends: dict[str, str] = {}
    kernel_paths: list[KernelPath] = []  # per layer group (quantkit.rules.kernels), target then draft
    multi_node: MultiNode | None = None  # deploy --nodes N > 1

    @computed_field  # type: ignore[prop-decorator]
    @property
    def command(self) -> str:
        """The `vllm serve` command line, shell-quoted."""
        return shlex.join(self.argv)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def shell(self) -> str:
        """One line to paste into a shell: the environment assignments, then the command."""
        return " ".join([f"{e.name}={shlex.quote(e.value)}" for e in self.env] + [self.command])

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        return not self.errors

    def to_dict(self) -> dict[str, Any]:
        data = super().to_dict()
        return {k: data[k] for k in _KEY_ORDER}

    def write(self, folder: str | Path) -> Path:
        """Write `deploy.json` into `folder` and return its path."""
        path = Path(folder) / DEPLOY_FILE
        from quantkit.io.files import write_file_atomic

        return write_file_atomic(path, json.dumps(self.to_dict(), indent=2) + "\n")


__all__ = ["DEPLOY_FILE", "DEPLOY_SCHEMA_VERSION", "DeployManifest", "EnvVar", "MultiNode", "VersionNeed"]
