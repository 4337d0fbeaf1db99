"""Results of `publish`: the files uploaded (or, for a dry run, that would be) and the Hub commit."""

from __future__ import annotations

from pydantic import Field, computed_field

from quantkit.results.base import CommandResult, Result


class PublishedFile(Result):
    """One file of the commit: its path in the repo, size and sha256."""

    path: str
    size: int
    sha256: str


class PublishResult(CommandResult):
    """What `publish` did (or, for a dry run, would do); its `--json`."""

    repo_id: str
    endpoint: str | None
    revision: str
    dry_run: bool
    files: list[PublishedFile]
    deleted: list[str] = Field(default_factory=list)
    commit_url: str | None = None
    commit_oid: str | None = None
    pr_url: str | None = None
    unchanged: bool = False  # re-publish of identical content: no new commit, commit_* is the existing head
    repo_url: str | None = None
    card_path: str | None = None  # dry run: where the card was written
    plan_path: str | None = None  # dry run: where the file list was written
    generated: list[str] = Field(default_factory=list)  # files quantkit wrote or rewrote for the upload
    skipped: list[str] = Field(default_factory=list)  # folder entries not uploaded (not what apply writes)

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total_bytes(self) -> int:
        return sum(f.size for f in self.files)


__all__ = ["PublishResult", "PublishedFile"]
