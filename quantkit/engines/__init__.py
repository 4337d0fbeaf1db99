"""Everything that runs a model: the platform answer ("can vLLM run this here"), the PyTorch EAGLE-3 and reference
engines, the in-process vLLM and what it loaded, and the `vllm serve` process with its client.

Nothing is imported here: each module is imported where it is needed, so that light commands stay light."""
