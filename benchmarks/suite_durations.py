"""Where the test suite's time goes: pytest run once per file (or per tier folder) in its own process, each timed for
wall and CPU seconds (its whole process tree: servers and CLI subprocesses included), with every test's duration
from a JUnit XML, summed and ranked. CPU seconds are the figure to compare on a shared host: wall seconds grow with
other people's load, CPU seconds much less.

    python benchmarks/suite_durations.py run OUT_DIR tests/unit tests/integration tests/e2e   # one process each
    python benchmarks/suite_durations.py run OUT_DIR tests/e2e/test_serve.py ...               # or per file
    python benchmarks/suite_durations.py table OUT_DIR [--top 20] > benchmarks/results/suite-durations-after.txt

`run` passes PYTEST_ARGS (environment, split on spaces) to every pytest, e.g. PYTEST_ARGS="-n 2" for xdist.
"""

from __future__ import annotations

import datetime
import os
import platform
import resource
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _slug(target: str) -> str:
    return target.strip("/").replace("/", "_").removesuffix(".py")


def run(out: Path, targets: list[str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    extra = os.environ.get("PYTEST_ARGS", "").split()
    for target in targets:
        slug = _slug(target)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        load = os.getloadavg()
        t0 = time.perf_counter()
        with (out / f"{slug}.log").open("w") as log:
            rc = subprocess.call(
                [
                    sys.executable,
                    "-m",
                    "pytest",
                    "-q",
                    "-p",
                    "no:cacheprovider",
                    "--durations=0",
                    f"--junitxml={out / (slug + '.xml')}",
                    *extra,
                    target,
                ],
                cwd=ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                # started in the background (nohup ... &), a shell ignores SIGINT for its children,
                # and the tests that interrupt an apply with SIGINT would see it ignored
                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
            )
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        line = (
            f"{target}\trc={rc}\twall={wall:.1f}\tcpu={cpu:.1f}\tload_before={load[0]:.2f}\t"
            f"load_after={os.getloadavg()[0]:.2f}\tat={datetime.datetime.now(datetime.timezone.utc):%H:%M:%S}"
        )
        with (out / "_runs.tsv").open("a") as f:
            f.write(line + "\n")
        print(line, flush=True)


def _runs(out: Path) -> dict[str, dict[str, str]]:
    runs: dict[str, dict[str, str]] = {}
    for line in (out / "_runs.tsv").read_text().splitlines():
        target, *fields = line.split("\t")
        runs[target] = dict(f.split("=", 1) for f in fields)
    return runs


def _cases(xml: Path) -> list[tuple[str, float, str]]:
    """(test id, seconds, outcome) per test case; setup and teardown are in the case's time."""
    cases = []
    for case in ET.parse(xml).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = child.tag
        name = f"{case.get('classname', '').replace('.', '/')}.py::{case.get('name')}"
        cases.append((name, float(case.get("time") or 0.0), outcome))
    return cases


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def table(out: Path, top: int) -> str:
    runs = _runs(out)
    lines = [
        f"# {out.name}: pytest once per target, {datetime.date.today()}, host {platform.node()}, "
        f"{os.cpu_count()} CPUs ({_cpu_model()}), python {platform.python_version()}",
        "# wall and cpu: seconds of the target's pytest process tree; load: 1-min load average before/after",
        "",
        f"{'target':62} {'tests':>6} {'fail':>5} {'skip':>5} {'wall s':>8} {'cpu s':>8}  load",
    ]
    every: list[tuple[str, float, str]] = []
    totals = [0, 0, 0, 0.0, 0.0]
    for target, r in runs.items():
        xml = out / f"{_slug(target)}.xml"
        cases = _cases(xml) if xml.is_file() else []
        every += cases
        n = len(cases)
        fail = sum(c[2] in ("failure", "error") for c in cases)
        skip = sum(c[2] == "skipped" for c in cases)
        wall, cpu = float(r["wall"]), float(r["cpu"])
        totals = [totals[0] + n, totals[1] + fail, totals[2] + skip, totals[3] + wall, totals[4] + cpu]
        lines.append(
            f"{target:62} {n:>6} {fail:>5} {skip:>5} {wall:>8.1f} {cpu:>8.1f}  {r['load_before']}/{r['load_after']}"
        )
    lines.append(f"{'total':62} {totals[0]:>6} {totals[1]:>5} {totals[2]:>5} {totals[3]:>8.1f} {totals[4]:>8.1f}")
    lines += ["", f"slowest {top} tests (seconds, setup included: a fixture's cost is on the first test that asks)"]
    for name, secs, outcome in sorted(every, key=lambda c: -c[1])[:top]:
        lines.append(f"{secs:8.1f}  {name}{'' if outcome == 'passed' else '  [' + outcome + ']'}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("run", "table"):
        sys.exit(__doc__)
    if sys.argv[1] == "run":
        run(Path(sys.argv[2]), sys.argv[3:])
    else:
        top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 20
        sys.stdout.write(table(Path(sys.argv[2]), top))
