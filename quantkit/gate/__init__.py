"""`quantkit gate`: the pre-deployment gate over check, acceptance, eval and a real `vllm serve`, judged against
thresholds into one verdict (pass, regression, anomalous, infeasible)."""

from quantkit.gate.reports import write_reports
from quantkit.gate.run import run
from quantkit.results.gate import GateResult

__all__ = ["GateResult", "run", "write_reports"]
