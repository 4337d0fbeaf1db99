"""The rule table: what vLLM rejects or runs wrong for a checkpoint, a draft with its target, or a deployment, replayed
from vLLM's own code (each rule cites the file and function). check and deploy run it; quantkit.rules.table holds it."""
