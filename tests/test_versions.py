"""quantkit.versions reads a package's version from its metadata's headers alone: it answers as
importlib.metadata.version for every installed distribution, and leaves to the e-mail parser any header block that is
not plain."""

from __future__ import annotations

import email
import importlib.metadata as md

import pytest

from quantkit.versions import _plain_version, installed_version


def test_every_installed_distribution_answers_as_importlib_metadata() -> None:
    names = {d.metadata["Name"] for d in md.distributions()} - {None}
    assert len(names) > 20
    for name in names:
        assert installed_version(name) == md.version(name), name
    with pytest.raises(md.PackageNotFoundError):
        installed_version("no-such-package-quantkit-test")


@pytest.mark.parametrize("head", [
    "Metadata-Version: 2.1\nName: x\nVersion: 1.0", "Name: x\nVersion:  2.0 \r", "Name: x\nVersion: 3\n more",
    "Name: x\n cont\nversion: 4", "From me\nVersion: 5", "Name x\nVersion: 6", "Version : 7\nVersion: 8",
    "A: b\rVersion: 9", "Version:\t10\r", "", "Name: y", "Ver\u00e9sion: 1\nVersion: 11", "VERSION: 12\nVersion: 13",
])
def test_a_plain_version_header_reads_as_the_email_parser_reads_it(head: str) -> None:
    got = _plain_version(head)
    assert got is None or got == email.message_from_string(head + "\n\n")["Version"]
