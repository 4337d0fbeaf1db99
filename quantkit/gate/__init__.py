"""`quantkit gate`: the pre-deployment gate over check, acceptance and eval, judged against thresholds."""

from quantkit.gate.reports import write_reports
from quantkit.gate.run import GateResult, run_gate

__all__ = ["GateResult", "run_gate", "write_reports"]
