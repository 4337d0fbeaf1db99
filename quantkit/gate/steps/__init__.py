"""The gate's steps, one module each, and `STEPS`, the registry the gate runs them from (in this order on each
candidate). Adding a step is one module here and one entry in `STEPS`."""

from quantkit.gate.steps.acceptance import Acceptance
from quantkit.gate.steps.base import GateCandidate, GateContext, Step, resolve_candidates
from quantkit.gate.steps.bench import Bench
from quantkit.gate.steps.check import Check
from quantkit.gate.steps.eval import Eval
from quantkit.gate.steps.serve import Serve
from quantkit.vocab import StepName

STEPS: dict[StepName, Step] = {
    "check": Check(),
    "acceptance": Acceptance(),
    "eval": Eval(),
    "serve": Serve(),
    "bench": Bench(),
}

__all__ = ["STEPS", "GateCandidate", "GateContext", "Step", "resolve_candidates"]
