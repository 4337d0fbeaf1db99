"""`quantkit inspect`: per-layer vLLM precision and reason from headers only, on a header-only synthetic
DeepSeek-V3-style MXFP4 checkpoint (benchmarks/inspect_large.py writes it) and on real `apply` outputs.

Here: what a fresh process imports; the rest is in tests/unit/test_inspect.py.
"""

from __future__ import annotations

import subprocess
import sys

from tests.unit import test_inspect as unit

synthetic = unit.synthetic  # the unit file's module fixture, used here too


def test_inspect_imports_no_torch(synthetic, tiny):
    code = (
        "import sys\nfrom quantkit.check.inspect import inspect_checkpoint\n"
        f"r = inspect_checkpoint({str(synthetic)!r})\n"
        f"d = inspect_checkpoint({str(tiny / 'eagle3-draft')!r}, 4)\n"
        "assert r.bytes_by_precision['MXFP4'] > 0 and d.layers\n"
        "print('LOADED', sorted(m for m in ('torch', 'quark', 'vllm', 'transformers', 'safetensors') "
        "if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "LOADED []" in out.stdout
