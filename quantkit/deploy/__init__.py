"""Deployment: the `vllm serve` manifest of a checkpoint or draft + target pair with its known-bad combinations
(`manifest`), a real `vllm serve` run that measures TTFT, tokens/s and served acceptance length (`serve`), and the
release checks and verdict that compare a candidate with its source (`checks`)."""
