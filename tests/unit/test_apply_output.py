"""apply's final files (quantkit.apply.output): the engine writes config.json and the files beside the weights once,
and apply does not rewrite, delete or copy them again afterwards."""

import json

from quantkit.apply import output as apply_output
from quantkit.apply import run as apply_run
from quantkit.io.files import is_aux_file


def test_native_engine_writes_the_final_files_once(tiny, tmp_path, monkeypatch):
    """The config.json the executor's `finish` hook wrote is the output's (same inode and mtime after the rename:
    nothing rewrote it), it holds vLLM's exclude, and the aux files are byte-identical to the source's."""
    seen: dict[str, tuple[int, int]] = {}
    real = apply_output.write_final_files

    def recording(plan, dst, qc):
        assert not (dst / "config.json").exists()  # Quark's own config.json is never written first
        real(plan, dst, qc)
        st = (dst / "config.json").stat()
        seen["config"] = (st.st_ino, st.st_mtime_ns)
        seen.update({p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in dst.iterdir() if is_aux_file(p.name)})

    monkeypatch.setattr(apply_run, "write_final_files", recording)
    src = tiny / "moe-target"
    result = apply_run.apply("mxfp4-moe", src, tmp_path / "out", engine="native", progress=None)
    out = tmp_path / "out"
    assert result.engine == "native" and "config" in seen
    st = (out / "config.json").stat()
    assert (st.st_ino, st.st_mtime_ns) == seen["config"]
    config = json.loads((out / "config.json").read_text())
    assert config["quantization_config"]["exclude"] == result.exclude
    aux = sorted(p.name for p in src.iterdir() if is_aux_file(p.name))
    assert aux and aux == sorted(p.name for p in out.iterdir() if is_aux_file(p.name))
    for name in aux:
        assert (out / name).read_bytes() == (src / name).read_bytes()
        assert ((out / name).stat().st_ino, (out / name).stat().st_mtime_ns) == seen[name]


def test_a_swallowed_signal_is_not_committed(tmp_path) -> None:
    """A signal the CLI's handler recorded, which a library then swallowed (the run went on), still stops the
    output folder from being renamed into place: the temporary folder goes, no output appears, the interrupt is
    raised again."""
    import pytest

    from quantkit import errors
    from quantkit.io.checkpoint import atomic_output

    out = tmp_path / "out"
    try:
        with pytest.raises(KeyboardInterrupt), atomic_output(out) as tmp:
            (tmp / "model.safetensors").write_bytes(b"x")
            errors.RECEIVED.append(("SIGINT", 130))  # what quantkit.cli.app.raise_interrupted records
        assert not out.exists()
        assert not list(tmp_path.iterdir())
        errors.RECEIVED[:] = [("SIGTERM", 143)]
        with pytest.raises(errors.Terminated), atomic_output(out):
            pass
        assert not out.exists()
    finally:
        errors.RECEIVED.clear()
    with atomic_output(out) as tmp:  # without a signal the folder is committed
        (tmp / "a").write_text("1")
    assert (out / "a").read_text() == "1"
