"""The command line as a user sees it: help, version, recipe views, the demo, and how light it is to start.

Here: what a fresh process imports; the in-process cases are in tests/unit/test_cli_help.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HEAVY_MODULES = ["torch", "quark", "transformers", "vllm", "lm_eval", "safetensors", "numpy"]


def test_help_and_recipes_list_import_nothing_heavy() -> None:
    # A fresh interpreter: the test process itself may already hold torch from other tests.
    code = textwrap.dedent(
        """
        import contextlib, io, json, sys
        from quantkit.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            assert main(["--help"], standalone_mode=False) == 0
            main(["recipes", "list"], standalone_mode=False)
            main(["recipes", "list", "--json"], standalone_mode=False)
            main(["recipes", "show", "fp8-draft", "--json"], standalone_mode=False)
        print(json.dumps(sorted({name.split(".")[0] for name in sys.modules})))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    loaded = set(json.loads(out))
    assert "quantkit" in loaded and "click" in loaded  # the probe really ran the CLI
    assert loaded.isdisjoint(HEAVY_MODULES), sorted(loaded & set(HEAVY_MODULES))


# --- demo ---------------------------------------------------------------------------------------------------------


def test_auto_devices_on_a_host_without_gpu_nodes_import_no_torch() -> None:
    # A dry run with the default `--devices auto` used to import torch (1-2 s) only to count GPUs. Where no GPU
    # device file exists, torch can see none: the plan says cpu without it, and torch itself agrees.
    from quantkit.apply.run import GPU_DEVICE_NODES, no_gpu_device_nodes

    if not no_gpu_device_nodes():
        pytest.skip(f"this host has a GPU device file ({', '.join(GPU_DEVICE_NODES)}): torch decides here")
    root = Path(__file__).resolve().parents[2]
    code = textwrap.dedent(
        """
        import json, sys
        from quantkit.apply.run import resolve_devices
        print(json.dumps([resolve_devices("auto"), resolve_devices(None), "torch" in sys.modules]))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=root).stdout
    auto, default, torch_loaded = json.loads(out)
    assert auto == default == ["cpu"]
    assert torch_loaded is False
    import torch

    assert torch.cuda.device_count() == 0 or not torch.cuda.is_available()  # the reference: torch sees no GPU


# moved from tests/unit/test_naming_tables.py: it needs a fresh process
def test_quantkit_entries_on_ascii_names_need_no_regex_import() -> None:
    """Importing the regex package is ~12 ms of a dry run; quantkit's own entries on ASCII names do without it."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from quantkit.naming.exclude import excluded_names\n"
        "from quantkit.naming.layers import RuntimeLayer\n"
        "layers = [RuntimeLayer(f'model.layers.{i}.mlp.gate_up_proj', 'fused_linear', 'dense_mlp',"
        " shards=(f'model.layers.{i}.mlp.gate_proj', f'model.layers.{i}.mlp.up_proj')) for i in range(12)]\n"
        "got = excluded_names(layers, [r're:model\\.layers\\.\\d+\\.mlp\\.gate_up_proj$', r're:model\\.layers\\.(?:3|4)\\.',"
        " r're:vision_tower\\.', 'lm_head'])\n"
        "assert len(got) == 12, got\n"
        "assert 'regex' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
