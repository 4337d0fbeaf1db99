"""Deployment: the `vllm serve` manifest of a checkpoint or draft + target pair with its known-bad combinations
(`manifest`; the rules are quantkit.rules.table's), and a real `vllm serve` run that measures TTFT, tokens/s and served
acceptance length (`serve`). The release checks and verdict moved to quantkit.gate.release and quantkit.gate.verdict
(`checks` hands them on until issue 19's cleanup)."""
