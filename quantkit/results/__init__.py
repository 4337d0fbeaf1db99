"""The result model: what every stage writes and every reader (gate, report files, card, demo, CLI) reads.

One typed, versioned model, written once: `apply` writes an ApplyResult (quantkit.json), `check` a CheckResult
whose summary is CheckSummary, `acceptance` an AcceptanceResult, `eval` an EvalResult; the gate assembles these
very objects into a GateReport (report.json, and report-<candidate>.json per candidate), and `publish` reads that
report and the ApplyResult into the model card. No stage rebuilds another's result as a dict.

Every document carries `schema_version` (SCHEMA_VERSION; `base.CommandResult`). Readers are tolerant within a
version: unknown keys are ignored and sections may be missing (a partial report still renders a card); a higher
version is refused, since its meaning may have changed. Figures that could not be computed are null in JSON (never
NaN).

Mean acceptance length AL = 1 + accepted draft tokens / drafts (vLLM's and Quark's definition); eval `delta` =
candidate - baseline, `recovery` = candidate / baseline (inverted for lower-is-better metrics).

One module per stage (base, apply, precision, check, kernels, deploy, acceptance, evaluate, serve, gate, publish,
demo, recipes, reading); each lists its public names in `__all__`, and this package hands them all on, so
`from quantkit.results import X` works for every X (the module holding X is imported when X is first asked for). This
file is not edited: a new class goes in its stage's module and that module's `__all__`, a new stage is a new module
(found in the folder).
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

# The closed vocabularies live in quantkit.vocab; these names are handed on for callers that imported them from here.
from quantkit.vocab import DENSE_TARGET, EAGLE3_DRAFT, MOE_TARGET, ModelKind, Severity  # noqa: F401

if TYPE_CHECKING:
    from quantkit.results.acceptance import *  # noqa: F403
    from quantkit.results.apply import *  # noqa: F403
    from quantkit.results.base import *  # noqa: F403
    from quantkit.results.bench import *  # noqa: F403
    from quantkit.results.check import *  # noqa: F403
    from quantkit.results.demo import *  # noqa: F403
    from quantkit.results.deploy import *  # noqa: F403
    from quantkit.results.evaluate import *  # noqa: F403
    from quantkit.results.gate import *  # noqa: F403
    from quantkit.results.kernels import *  # noqa: F403
    from quantkit.results.precision import *  # noqa: F403
    from quantkit.results.publish import *  # noqa: F403
    from quantkit.results.reading import *  # noqa: F403
    from quantkit.results.recipes import *  # noqa: F403
    from quantkit.results.serve import *  # noqa: F403

# The stage modules whose public names this package hands on are every module of this folder (_homes). Each is
# imported when one of its names is first asked for (PEP 562), not with the package: a command needs one stage's
# models, and building every stage's costs more. It pays: `python benchmarks/dry_run_large.py --fast-paths`, row
# `fast_path_cpu_ratio.results_lazy_loader` (the `apply --dry-run` process's CPU with every stage imported up front
# over this; 1.17 on the 67,667-tensor index).
_ALL = re.compile(r"^__all__ = (\[.*?\])", re.M | re.S)
_HOME: dict[str, str] = {}  # public name -> its stage module, read from each module's `__all__` without importing it


def _homes() -> dict[str, str]:
    if not _HOME:
        here = Path(__file__).parent
        for stage in sorted(p.stem for p in here.glob("*.py") if p.stem != "__init__"):
            found = _ALL.search((here / f"{stage}.py").read_text(encoding="utf-8"))
            if found is None:  # pragma: no cover - every stage module lists its names
                raise ImportError(f"quantkit.results.{stage} has no __all__ list")
            _HOME.update(dict.fromkeys(ast.literal_eval(found.group(1)), stage))
    return _HOME


def __getattr__(name: str) -> Any:
    stage = _homes().get(name)
    if stage is None:
        raise AttributeError(f"module 'quantkit.results' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"quantkit.results.{stage}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_homes()})
