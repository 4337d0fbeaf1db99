"""`quantkit bench`: served speedup of no speculation, the BF16 draft and quantized drafts, across concurrency (run.py: the arms and cells; load.py: vLLM's own benchmark client in-process; figures.py: speedups, c_step, crossover, K schedule; identity.py; charts.py)."""

# The ranges of bench's numeric settings, shared by the CLI's options (quantkit.cli.bench) and the Python API's
# BenchSpec (quantkit.specs): refused outside them before any import of vLLM.
MAX_CONCURRENCY = 4096  # closed-loop clients of one cell (10 x C requests: 40,960 prompt rows at most)
MAX_K = 16  # num_speculative_tokens; EAGLE-3 drafts are trained for a few
MAX_LIST = 64  # distinct values of --concurrency or --k in one run
MAX_REQUEST_TIMEOUT_S = 86_400  # --request-timeout: a day
