"""`quantkit check`: what vLLM will load, before any GPU time is spent (the entry point is quantkit.check.run.run)."""
