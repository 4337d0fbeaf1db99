"""`quantkit deploy`: the `vllm serve` manifest of a checkpoint or a draft + target pair (`run`), its environment
(`env`), and the known-bad combinations from quantkit.rules.table. Serving a checkpoint for real is
quantkit.engines.vllm_server; the release checks and verdict are quantkit.gate's."""
