"""Issue 18, security items and "regular files only": no secret leaves through a model folder, no credential is
printed, no link loop or pipe hangs or multiplies a copy.

Through the real CLI in a subprocess, in the style of tests/e2e/test_bad_inputs.py (its `Bad` cases and `_assert_contract`:
exit 2, exactly one `error:` line, no traceback, nothing complete-looking left, every input byte for byte unchanged;
`light` cases must fail before torch/Quark/transformers/vLLM/lm-eval is imported). On top of that contract, a case
with a `secret` asserts that the secret's bytes are nowhere under the test's folder but in the secret file itself.

Beyond the table: a real Hugging Face cache (snapshots/<rev>/file -> ../../blobs/<hash>) as --model and as a Hub id,
`--overwrite` of outputs whose source had a sub-folder, publish against the Hub-protocol server in tests/fixtures/hub_server.py
(a token in a file: the server sees no request at all; an endpoint with user:PASSWORD@: the password is nowhere in
what the process prints), the dry-run folder rules, the executor's Quark-compatible aux copy, and Quark's own
per-shard engine reading only the planned shards.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TINY
from tests.e2e.test_bad_inputs import Bad, Ctx, _assert_contract
from tests.fixtures import hostile
from tests.fixtures.hostile import error_lines, run_cli, tree_digest
from tests.fixtures.hub_server import HubServer

FIFO_TIMEOUT = 60  # a read of a pipe blocks forever: a regression fails in a minute, not at the 600 s default
REPO = "amd-test/tiny-moe-mxfp4"


def _apply(src: Path, out: Path, *extra: str, recipe: str = "mxfp4-moe") -> list[str]:
    return ["apply", "--recipe", recipe, "--model", str(src), "--output", str(out), *extra]


def _secret_file(t: Ctx, name: str = "outside/token") -> tuple[Path, bytes]:
    """A file outside any model folder holding a Hub-token-shaped secret (what ~/.cache/huggingface/token holds)."""
    value = ("hf_" + secrets.token_hex(17)).encode()
    path = t.file(name, value + b"\n")
    return path, value


CASES: dict[str, Callable[[Ctx], Bad]] = {}
SECRETS: dict[str, bytes] = {}  # case -> bytes that must not be copied anywhere


def case(name: str) -> Callable[[Callable[[Ctx], Bad]], Callable[[Ctx], Bad]]:
    def register(fn: Callable[[Ctx], Bad]) -> Callable[[Ctx], Bad]:
        assert name not in CASES, name
        CASES[name] = fn
        return fn

    return register


def _link_case(t: Ctx, link: str, target: str | Path, *mentions: str, model: str = "moe-target") -> Bad:
    src = t.model(model, "src")
    secret, value = _secret_file(t)
    t.secret = value  # type: ignore[attr-defined]
    (src / link).unlink(missing_ok=True)
    (src / link).symlink_to(str(target).replace("{secret}", str(secret)))
    out = t.tmp / "out"
    return Bad(_apply(src, out), light=True, absent=(out,), watch=(secret,), mentions=(link, *mentions))


# --- item 1: links out of the source -------------------------------------------------------------------------------


@case("apply-link-outside-with-an-innocent-name")
def _(t: Ctx) -> Bad:
    return _link_case(t, "notes.txt", "{secret}", "outside")


@case("apply-link-outside-named-like-a-tokenizer-file")
def _(t: Ctx) -> Bad:
    return _link_case(t, "tokenizer_config.json", "{secret}", "outside")


@case("apply-relative-link-escaping-with-dotdot")
def _(t: Ctx) -> Bad:
    return _link_case(t, "chat_template.jinja", "../outside/token", "outside")


@case("apply-link-chain-ending-outside")
def _(t: Ctx) -> Bad:
    bad = _link_case(t, "z-last-hop", "{secret}", "outside")
    src = t.copies[0]
    (src / "generation_config.json").unlink()
    (src / "generation_config.json").symlink_to("z-last-hop")  # inside, but the chain ends outside
    return Bad(bad.args, light=True, absent=bad.absent, watch=bad.watch, mentions=("generation_config.json", "outside"))


@case("apply-weight-shard-linked-from-outside")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    elsewhere = t.tmp / "elsewhere" / "model.safetensors"
    elsewhere.parent.mkdir()
    shutil.move(src / "model.safetensors", elsewhere)
    (src / "model.safetensors").symlink_to(elsewhere)
    out = t.tmp / "out"
    return Bad(
        _apply(src, out, recipe="fp8-draft"),
        light=True,
        absent=(out,),
        watch=(elsewhere,),
        mentions=("model.safetensors", "outside"),
    )


@case("apply-hf-snapshot-link-into-another-repos-blobs")
def _(t: Ctx) -> Bad:
    cache = t.tmp / "hub"
    snap = hf_cache_repo(cache, TINY / "moe-target", "org/moe")
    other = hf_cache_repo(cache, TINY / "target", "org/other")
    t.copies += [cache]
    blob = os.readlink(other / "config.json").split("/")[-1]
    (snap / "generation_config.json").unlink()
    (snap / "generation_config.json").symlink_to(f"../../../models--org--other/blobs/{blob}")
    out = t.tmp / "out"
    return Bad(_apply(snap, out), light=True, absent=(out,), mentions=("generation_config.json", "outside"))


@case("apply-dangling-link")
def _(t: Ctx) -> Bad:
    src = t.model("moe-target", "src")
    (src / "special_tokens_map.json").symlink_to(t.tmp / "gone.json")
    out = t.tmp / "out"
    return Bad(_apply(src, out), light=True, absent=(out,), mentions=("special_tokens_map.json", "does not exist"))


# --- item 3: loops and links to folders -----------------------------------------------------------------------------


@case("apply-source-links-to-itself")
def _(t: Ctx) -> Bad:
    src = t.model("moe-target", "src")
    (src / "self").symlink_to(".")
    out = t.tmp / "out"
    return Bad(_apply(src, out), light=True, absent=(out,), mentions=("self", "folder"), max_seconds=30)


@case("apply-link-to-a-folder-outside")
def _(t: Ctx) -> Bad:
    src = t.model("moe-target", "src")
    (t.tmp / "home-ssh").mkdir()
    (t.tmp / "home-ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    (src / "original").symlink_to(t.tmp / "home-ssh")
    out = t.tmp / "out"
    return Bad(_apply(src, out), light=True, absent=(out,), watch=(t.tmp / "home-ssh",), mentions=("original",))


@case("apply-link-loop-inside-the-source")
def _(t: Ctx) -> Bad:
    src = t.model("moe-target", "src")
    (src / "a.json").symlink_to("b.json")
    (src / "b.json").symlink_to("a.json")
    out = t.tmp / "out"
    return Bad(_apply(src, out), light=True, absent=(out,), mentions=("a.json", "loop"))


@case("acceptance-target-links-to-itself")
def _(t: Ctx) -> Bad:
    # eval, acceptance and the gate read sources through the same resolve_source: a link to a folder is refused
    # there too, before any work (links out of the folder are fine there: nothing is copied).
    src = t.model("target", "src")
    (src / "self").symlink_to(".")
    return Bad(
        [
            "acceptance",
            "--target",
            str(src),
            "--draft",
            str(TINY / "eagle3-draft"),
            "--candidate",
            str(TINY / "eagle3-draft"),
            "--backend",
            "reference",
            "--max-new-tokens",
            "2",
        ],
        light=True,
        mentions=("self",),
    )


# --- item 11: pipes, devices and sockets ----------------------------------------------------------------------------


def _fifo(path: Path) -> Path:
    path.unlink(missing_ok=True)
    os.mkfifo(path)
    return path


@case("apply-fifo-as-config-json")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    _fifo(src / "config.json")
    out = t.tmp / "out"
    return Bad(
        _apply(src, out, recipe="fp8-draft"),
        light=True,
        absent=(out,),
        mentions=("config.json", "pipe"),
        timeout=FIFO_TIMEOUT,
    )


@case("apply-fifo-as-a-shard")
def _(t: Ctx) -> Bad:
    src = t.model("moe-target", "src")
    _fifo(src / "model-00002-of-00002.safetensors")
    out = t.tmp / "out"
    return Bad(
        _apply(src, out),
        light=True,
        absent=(out,),
        mentions=("model-00002-of-00002.safetensors", "pipe"),
        timeout=FIFO_TIMEOUT,
    )


@case("apply-fifo-as-the-index")
def _(t: Ctx) -> Bad:
    src = t.model("moe-target", "src")
    _fifo(src / "model.safetensors.index.json")
    out = t.tmp / "out"
    return Bad(
        _apply(src, out),
        light=True,
        absent=(out,),
        mentions=("model.safetensors.index.json", "pipe"),
        timeout=FIFO_TIMEOUT,
    )


@case("apply-fifo-among-the-aux-files")
def _(t: Ctx) -> Bad:
    src = t.model("moe-target", "src")
    _fifo(src / "tokenizer.json")
    out = t.tmp / "out"
    return Bad(_apply(src, out), light=True, absent=(out,), mentions=("tokenizer.json", "pipe"), timeout=FIFO_TIMEOUT)


@case("apply-fifo-as-the-recipe")
def _(t: Ctx) -> Bad:
    src = t.model("moe-target", "src")
    recipe = _fifo(t.tmp / "my-recipe.yaml")
    out = t.tmp / "out"
    return Bad(
        _apply(src, out, recipe=str(recipe)),
        light=True,
        absent=(out,),
        mentions=("my-recipe.yaml", "pipe"),
        timeout=FIFO_TIMEOUT,
    )


@case("apply-dev-zero-as-the-recipe")
def _(t: Ctx) -> Bad:
    src = t.model("moe-target", "src")
    out = t.tmp / "out"
    return Bad(
        _apply(src, out, recipe="/dev/zero"),
        light=True,
        absent=(out,),
        mentions=("/dev/zero", "device"),
        timeout=FIFO_TIMEOUT,
    )


@case("apply-config-json-linked-to-dev-zero")
def _(t: Ctx) -> Bad:
    src = t.model("eagle3-draft", "src")
    (src / "config.json").unlink()
    (src / "config.json").symlink_to("/dev/zero")
    out = t.tmp / "out"
    return Bad(
        _apply(src, out, recipe="fp8-draft"),
        light=True,
        absent=(out,),
        mentions=("config.json", "device"),
        timeout=FIFO_TIMEOUT,
    )


@case("apply-socket-in-the-source")
def _(t: Ctx) -> Bad:
    src = t.model("moe-target", "src")
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(src / "agent.sock"))
    sock.close()  # the socket file stays
    out = t.tmp / "out"
    return Bad(_apply(src, out), light=True, absent=(out,), mentions=("agent.sock", "socket"), timeout=FIFO_TIMEOUT)


@case("inspect-fifo-as-a-shard")
def _(t: Ctx) -> Bad:
    src = t.model("target", "src")
    _fifo(src / "model.safetensors")
    return Bad(["inspect", str(src)], light=True, mentions=("model.safetensors", "pipe"), timeout=FIFO_TIMEOUT)


@case("check-fifo-as-config-json")
def _(t: Ctx) -> Bad:
    src = t.model("target", "src")
    _fifo(src / "config.json")
    return Bad(["check", str(src), "--vllm", "off"], light=True, mentions=("config.json", "pipe"), timeout=FIFO_TIMEOUT)


@case("acceptance-prompts-fifo")
def _(t: Ctx) -> Bad:
    prompts = _fifo(t.tmp / "prompts.jsonl")
    return Bad(
        [
            "acceptance",
            "--target",
            str(TINY / "target"),
            "--draft",
            str(TINY / "eagle3-draft"),
            "--candidate",
            str(TINY / "eagle3-draft"),
            "--backend",
            "reference",
            "--prompts",
            str(prompts),
            "--max-new-tokens",
            "2",
        ],
        light=True,
        mentions=("prompts.jsonl", "pipe"),
        timeout=FIFO_TIMEOUT,
    )


@case("gate-config-fifo")
def _(t: Ctx) -> Bad:
    cfg = _fifo(t.tmp / "gate.yaml")
    out = t.tmp / "gate-out"
    return Bad(
        ["gate", str(cfg), "--out", str(out)],
        light=True,
        absent=(out,),
        mentions=("gate.yaml", "pipe"),
        timeout=FIFO_TIMEOUT,
    )


# --- publish: tokens, links, the allow-list and the dry-run folder --------------------------------------------------


def _published(t: Ctx) -> Path:
    out = hostile.fake_quantkit_output(TINY / "target", t.tmp / "out")
    t.copies.append(out)
    return out


def _publish(folder: Path, *extra: str) -> list[str]:
    return ["publish", str(folder), "--repo-id", "org/name", "--dry-run", *extra]


def _preview(folder: Path) -> Path:
    return folder.with_name(folder.name + ".publish-preview")


def _hermetic(t: Ctx, token: str = "") -> dict[str, str]:
    """No token from this machine: a private HF_HOME, and HF_TOKEN as given (empty: none)."""
    return {"HF_HOME": str(t.tmp / "hf-home"), "HF_TOKEN": token, "HUGGING_FACE_HUB_TOKEN": ""}


@case("publish-hub-token-deep-inside-a-tokenizer-file")
def _(t: Ctx) -> Bad:
    out = _published(t)
    tok = json.loads((out / "tokenizer.json").read_text())
    hidden = "hf_" + secrets.token_urlsafe(30).replace("-", "A").replace("_", "b")[:34]
    tok["added_tokens"].append(
        {
            "id": 999,
            "content": hidden,
            "special": False,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": True,
        }
    )
    (out / "tokenizer.json").write_text(json.dumps(tok))
    return Bad(
        _publish(out), light=True, absent=(_preview(out),), mentions=("tokenizer.json", "token"), env=_hermetic(t)
    )


@case("publish-hub-token-in-safetensors-metadata")
def _(t: Ctx) -> Bad:
    out = _published(t)
    header, data = hostile.read_header(out / "model.safetensors")
    header["__metadata__"] = {"format": "pt", "note": "hf_" + "Q7" * 17}
    hostile.write_safetensors(out / "model.safetensors", header, data)
    return Bad(
        _publish(out), light=True, absent=(_preview(out),), mentions=("model.safetensors", "token"), env=_hermetic(t)
    )


@case("publish-your-own-token-in-the-chat-template")
def _(t: Ctx) -> Bad:
    out = _published(t)
    own = "tok" + secrets.token_hex(16)  # not hf_-shaped: only "the user's own token" finds it
    with open(out / "chat_template.jinja", "a") as f:
        f.write("{# " + own + " #}\n")
    return Bad(
        _publish(out),
        light=True,
        absent=(_preview(out),),
        mentions=("chat_template.jinja", "your own"),
        env=_hermetic(t, own),
    )


@case("publish-your-own-token-from-the-login-token-file")
def _(t: Ctx) -> Bad:
    out = _published(t)
    own = "tok" + secrets.token_hex(16)
    (t.tmp / "hf-home").mkdir()
    (t.tmp / "hf-home" / "token").write_text(own)
    cfg = json.loads((out / "generation_config.json").read_text())
    cfg["comment"] = own
    (out / "generation_config.json").write_text(json.dumps(cfg))
    return Bad(
        _publish(out),
        light=True,
        absent=(_preview(out),),
        mentions=("generation_config.json", "your own"),
        env=_hermetic(t),
    )


@case("publish-folder-with-a-link-outside")
def _(t: Ctx) -> Bad:
    out = _published(t)
    secret, value = _secret_file(t)
    t.secret = value  # type: ignore[attr-defined]
    (out / "tokenizer_config.json").unlink()
    (out / "tokenizer_config.json").symlink_to(secret)
    return Bad(
        _publish(out),
        light=True,
        absent=(_preview(out),),
        watch=(secret,),
        mentions=("tokenizer_config.json", "outside"),
        env=_hermetic(t),
    )


@case("publish-folder-with-a-fifo")
def _(t: Ctx) -> Bad:
    out = _published(t)
    _fifo(out / "tokenizer.json")
    return Bad(
        _publish(out),
        light=True,
        absent=(_preview(out),),
        mentions=("tokenizer.json", "pipe"),
        env=_hermetic(t),
        timeout=FIFO_TIMEOUT,
    )


@case("publish-report-fifo")
def _(t: Ctx) -> Bad:
    out = _published(t)
    rep = _fifo(t.tmp / "report.json")
    return Bad(
        _publish(out, "--report", str(rep)),
        light=True,
        absent=(_preview(out),),
        mentions=("report.json", "pipe"),
        env=_hermetic(t),
        timeout=FIFO_TIMEOUT,
    )


@case("publish-dry-run-dir-is-the-folder")
def _(t: Ctx) -> Bad:
    out = _published(t)
    return Bad(
        _publish(out, "--dry-run-dir", str(out)),
        light=True,
        mentions=("--dry-run-dir", "is the model folder"),  # the one check of every command (io.files)
        env=_hermetic(t),
    )


@case("publish-dry-run-dir-inside-the-folder")
def _(t: Ctx) -> Bad:
    out = _published(t)
    return Bad(
        _publish(out, "--dry-run-dir", str(out / "preview")),
        light=True,
        absent=(out / "preview",),
        mentions=("lies inside",),
        env=_hermetic(t),
    )


@case("publish-dry-run-dir-contains-the-folder")
def _(t: Ctx) -> Bad:
    out = _published(t)
    return Bad(
        _publish(out, "--dry-run-dir", str(t.tmp)), light=True, watch=(t.tmp,), mentions=("contains",), env=_hermetic(t)
    )


@case("publish-dry-run-dir-via-a-link-to-the-folder")
def _(t: Ctx) -> Bad:
    out = _published(t)
    (t.tmp / "alias").symlink_to(out)
    return Bad(
        _publish(out, "--dry-run-dir", str(t.tmp / "alias" / "p")),
        light=True,
        absent=(out / "p",),
        mentions=("lies inside",),
        env=_hermetic(t),
    )


@case("publish-dry-run-dir-holds-someone-elses-files")
def _(t: Ctx) -> Bad:
    out = _published(t)
    mine = t.tmp / "mine"
    mine.mkdir()
    (mine / "README.md").write_text("my own notes\n")
    return Bad(
        _publish(out, "--dry-run-dir", str(mine)),
        light=True,
        watch=(mine,),
        mentions=("did not write",),
        env=_hermetic(t),
    )


@pytest.mark.parametrize("name", list(CASES))
def test_refused(name: str, tmp_path: Path) -> None:
    ctx = Ctx(tmp_path)
    try:
        bad = CASES[name](ctx)
        watched = [TINY, *ctx.copies, *bad.watch]
        before = {p: tree_digest(p) for p in watched}
        run = run_cli(
            bad.args,
            cwd=tmp_path,
            stdin=bad.stdin,
            env=bad.env,
            forbid_heavy=bad.light,
            timeout=bad.timeout,
            preexec_fn=bad.preexec_fn,
        )
        _assert_contract(bad, run, before)
        secret = getattr(ctx, "secret", None)
        if secret is not None:
            assert secret not in (run.stdout + run.stderr).encode()
            holders = [
                p
                for p in tmp_path.rglob("*")
                if p.is_file() and not p.is_symlink() and p.name != "token" and secret in p.read_bytes()
            ]
            assert not holders, f"the secret was copied to {holders}"
    finally:
        ctx.cleanup()


# --- Hugging Face cache snapshots keep working ---------------------------------------------------------------------


def hf_cache_repo(cache: Path, model: Path, repo_id: str, sub_folder: bool = False) -> Path:
    """`model` laid out as huggingface_hub's cache does (file_download.py `_create_symlink`): blobs/<sha256> holds
    the bytes, snapshots/<rev>/<file> is a relative link ../../blobs/<sha256>, refs/main names <rev>. Returns the
    snapshot folder."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    rev = hashlib.sha1(repo_id.encode()).hexdigest()
    snap = repo / "snapshots" / rev
    (repo / "blobs").mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(rev)
    snap.mkdir(parents=True)
    files = [(p.name, p) for p in sorted(model.iterdir()) if p.is_file()]
    if sub_folder:
        files.append(("original/params.json", model / "config.json"))
    for rel, p in files:
        data = p.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        (repo / "blobs" / digest).write_bytes(data)
        link = snap / rel
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to("../" * (rel.count("/") + 2) + f"blobs/{digest}")
    return snap


def _assert_applied(run: hostile.Run, out: Path, model: Path) -> dict[str, Any]:
    assert run.returncode == 0, run.stderr[-3000:]
    manifest = json.loads((out / "quantkit.json").read_text())
    for p in out.rglob("*"):
        assert not p.is_symlink(), f"{p} is a link"
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        assert (out / name).is_file() and (out / name).read_bytes() == (model / name).read_bytes(), name
    assert sorted(manifest["output_files"]) == sorted(
        p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()
    )
    return manifest


def test_apply_reads_a_huggingface_cache_snapshot(tmp_path: Path) -> None:
    """The snapshot's files are links into ../../blobs/: inside the same cache repo, so they are followed; its
    sub-folder (like Meta's original/) is not copied, and one warning line says so."""
    model = TINY / "moe-target"
    snap = hf_cache_repo(tmp_path / "hub", model, "org/moe", sub_folder=True)
    before = tree_digest(tmp_path / "hub")
    out = tmp_path / "out"
    run = run_cli(_apply(snap, out), cwd=tmp_path)
    manifest = _assert_applied(run, out, model)
    assert manifest["not_copied"] == ["original/"]
    assert not (out / "original").exists()
    warnings = [line for line in run.stderr.splitlines() if "warning: not copied" in line]
    assert len(warnings) == 1 and "original/" in warnings[0], run.stderr
    assert tree_digest(tmp_path / "hub") == before


def test_apply_reads_a_hub_id_resolved_to_the_cache(tmp_path: Path) -> None:
    """A Hub id, resolved offline by huggingface_hub's snapshot_download to the cached snapshot."""
    model = TINY / "moe-target"
    hf_cache_repo(tmp_path / "hub", model, "org/moe")
    out = tmp_path / "out"
    run = run_cli(
        ["apply", "--recipe", "mxfp4-moe", "--model", "org/moe", "--output", str(out)],
        cwd=tmp_path,
        env={"HF_HUB_CACHE": str(tmp_path / "hub"), "HF_HUB_OFFLINE": "1"},
    )
    manifest = _assert_applied(run, out, model)
    assert manifest["source"] == "org/moe" and manifest["not_copied"] == []


# --- item 8: --overwrite of quantkit's own output --------------------------------------------------------------------


def test_overwrite_replaces_an_output_whose_source_has_a_sub_folder(tmp_path: Path) -> None:
    src = hostile.copy_model(TINY / "moe-target", tmp_path / "src")
    (src / "original").mkdir()
    (src / "original" / "params.json").write_text('{"dim": 64}\n')
    (src / "README.md").write_text("# the source's card\n")
    out = tmp_path / "out"
    first = run_cli(_apply(src, out), cwd=tmp_path)
    manifest = _assert_applied(first, out, src)
    assert manifest["not_copied"] == ["README.md", "original/"]
    again = run_cli(_apply(src, out, "--overwrite"), cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]


def test_overwrite_accepts_older_outputs_that_recorded_a_sub_folder_by_name(tmp_path: Path) -> None:
    """Before issue 18, apply copied sub-folders and recorded them by name in output_files; such an output is
    quantkit's whole and --overwrite replaces it. A file added into a sub-folder of a newer output is not."""
    src = hostile.copy_model(TINY / "moe-target", tmp_path / "src")
    out = tmp_path / "out"
    assert run_cli(_apply(src, out), cwd=tmp_path).returncode == 0
    manifest = json.loads((out / "quantkit.json").read_text())
    (out / "original").mkdir()
    (out / "original" / "params.json").write_text("{}\n")
    old = {**manifest, "output_files": sorted({p.split("/")[0] for p in manifest["output_files"]} | {"original"})}
    (out / "quantkit.json").write_text(json.dumps(old))
    run = run_cli(_apply(src, out, "--overwrite"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert not (out / "original").exists()

    (out / "original").mkdir()
    (out / "original" / "mine.txt").write_text("precious\n")
    refused = run_cli(_apply(src, out, "--overwrite"), cwd=tmp_path, forbid_heavy=True)
    assert refused.returncode == 2 and len(error_lines(refused.stderr)) == 1, refused.stderr
    assert "original" in refused.stderr and (out / "original" / "mine.txt").read_text() == "precious\n"


# --- item 1: the executor's Quark-compatible aux copy, and Quark's own per-shard path -------------------------------


def test_executor_aux_copy_refuses_links_before_any_shard(tmp_path: Path) -> None:
    """quantize_checkpoint copies every file and folder as Quark does (copy_aux=True), but never a link out of the
    source, a link to a folder or a pipe; and it says so before the first shard is written."""
    from quantkit.apply.shards import ExecutorError, quantize_checkpoint

    src = hostile.copy_model(TINY / "moe-target", tmp_path / "src")
    (src / "extra").mkdir()
    (src / "extra" / "notes.txt").write_text("a real sub-folder is copied, as Quark does\n")
    outside = tmp_path / "token"
    outside.write_text("hf_" + "x" * 34)
    for i, (name, make) in enumerate(
        [
            ("self", lambda p: p.symlink_to(".")),
            ("extra/leak.txt", lambda p: p.symlink_to(outside)),
            (".hidden.json", lambda p: p.symlink_to(outside)),
            ("pipe", os.mkfifo),
        ]
    ):
        make(src / name)
        dst = tmp_path / f"dst{i}"
        with pytest.raises(ExecutorError) as e:
            quantize_checkpoint(src, dst, scheme="mxfp4", exclude=["lm_head"], layer_config=None, devices=["cpu"])
        assert name.split("/")[-1] in str(e.value) and "\n" not in str(e.value)
        assert not dst.exists() or not list(dst.glob("*.safetensors")), list(dst.iterdir())
        (src / name).unlink()
    dst = tmp_path / "ok"
    quantize_checkpoint(src, dst, scheme="mxfp4", exclude=["lm_head"], layer_config=None, devices=["cpu"])
    assert (dst / "extra" / "notes.txt").read_text().startswith("a real sub-folder")


def test_quark_per_shard_engine_reads_only_the_planned_checkpoint(tmp_path: Path) -> None:
    """Quark's file-to-file path quantizes every *.safetensors under its source and copies every folder; through
    apply it sees only the indexed shards and config, so a sub-folder's weights are neither quantized nor copied."""
    src = hostile.copy_model(TINY / "moe-target", tmp_path / "src")
    (src / "original").mkdir()
    shutil.copy(src / "model-00001-of-00002.safetensors", src / "original" / "consolidated.safetensors")
    (src / "notes.md").write_text("not a checkpoint file\n")
    out = tmp_path / "out"
    run = run_cli(_apply(src, out, "--engine", "quark"), cwd=tmp_path)
    manifest = _assert_applied(run, out, src)
    assert sorted(p.name for p in out.iterdir() if p.name.endswith(".safetensors")) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    assert not (out / "original").exists() and manifest["not_copied"] == ["notes.md", "original/"]


# --- publish against the Hub-protocol server --------------------------------------------------------------------------


@pytest.fixture
def hub_token() -> str:
    return "hf_quantkit" + secrets.token_hex(12)


@pytest.fixture
def hub(hub_token: str):
    with HubServer(hub_token) as server:
        yield server


def _hub_env(tmp_path: Path, token: str, endpoint: str | None = None) -> dict[str, str]:
    env = {
        "HF_HUB_DISABLE_XET": "1",
        "HF_HUB_OFFLINE": "0",
        "HF_HOME": str(tmp_path / "hf-home"),
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_TOKEN": token,
        "HUGGING_FACE_HUB_TOKEN": "",
    }
    if endpoint:
        env["HF_ENDPOINT"] = endpoint
    return env


def _folder(tmp_path: Path) -> Path:
    return hostile.fake_quantkit_output(TINY / "target", tmp_path / "tiny-target-fp8")


@pytest.mark.parametrize("kind", ["pattern", "own"])
def test_publish_with_a_token_in_a_file_sends_nothing(
    kind: str, hub: HubServer, hub_token: str, tmp_path: Path
) -> None:
    folder = _folder(tmp_path)
    leaked = "hf_" + "k3Y" * 12 if kind == "pattern" else hub_token
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg["model_max_length_note"] = f"see {leaked}"
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    run = run_cli(["publish", str(folder), "--repo-id", REPO], cwd=tmp_path, env=_hub_env(tmp_path, hub_token, hub.url))
    where = f"\nexit {run.returncode}\nstderr: {run.stderr[-3000:]}"
    assert run.returncode == 2, where
    lines = error_lines(run.stderr)
    assert len(lines) == 1 and "tokenizer_config.json" in lines[0] and "Traceback" not in run.stderr, where
    assert hub.requests == [], "the Hub was contacted before the refusal"
    assert hub_token not in run.stdout + run.stderr and leaked not in run.stdout + run.stderr


def test_publish_uploads_only_what_apply_writes(hub: HubServer, hub_token: str, tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    (folder / "notes.txt").write_text("my notes\n")
    (folder / "original").mkdir()
    (folder / "original" / "params.json").write_text("{}\n")
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x02}q\x00.")
    run = run_cli(
        ["publish", str(folder), "--repo-id", REPO, "--json"], cwd=tmp_path, env=_hub_env(tmp_path, hub_token, hub.url)
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert result["skipped"] == ["notes.txt", "original/", "pytorch_model.bin"]
    files = set(hub.files(REPO))
    assert files == {".gitattributes", *(f["path"] for f in result["files"])}
    assert files - {"deploy.json"} == {
        ".gitattributes",
        "README.md",
        "quantkit.json",
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
        "generation_config.json",
    }
    warnings = [line for line in run.stderr.splitlines() if "warning: not uploaded" in line]
    assert len(warnings) == 1 and "notes.txt" in warnings[0]


@pytest.mark.parametrize("failure", ["refused-connection", "wrong-password"])
def test_endpoint_credentials_are_never_printed(failure: str, hub: HubServer, hub_token: str, tmp_path: Path) -> None:
    """HF_ENDPOINT=http://user:PASSWORD@host, and the endpoint fails: the error line shows the URL as
    http://***@host, and the password is nowhere in what the process prints."""
    password = "Pw" + secrets.token_hex(8)
    host = "127.0.0.1:9" if failure == "refused-connection" else hub.url.removeprefix("http://")
    run = run_cli(
        ["publish", str(_folder(tmp_path)), "--repo-id", REPO],
        cwd=tmp_path,
        env=_hub_env(tmp_path, hub_token, f"http://alice:{password}@{host}"),
        timeout=300,
    )
    where = f"\nexit {run.returncode}\nstderr: {run.stderr[-3000:]}"
    assert run.returncode == 2, where
    lines = error_lines(run.stderr)
    assert len(lines) == 1 and "Traceback" not in run.stderr, where
    assert f"http://***@{host}" in lines[0], where
    assert password not in run.stdout + run.stderr and hub_token not in run.stdout + run.stderr, where


def test_retry_logs_and_results_of_a_mirror_with_a_password_show_no_password(hub_token: str, tmp_path: Path) -> None:
    """A Hub mirror behind HTTP Basic auth (user:password@ in HF_ENDPOINT, which httpx sends as Basic): the
    preupload call fails twice with 500, huggingface_hub logs each retried URL on stderr, then the publish
    succeeds. No log line, no result line and no --json field holds the password."""
    password = "Pw" + secrets.token_hex(8)
    with HubServer(hub_token, basic=("alice", password)) as mirror:
        mirror.fail_next("preupload", 500, times=2)
        endpoint = f"http://alice:{password}@{mirror.url.removeprefix('http://')}"
        run = run_cli(
            ["publish", str(_folder(tmp_path)), "--repo-id", REPO, "--json"],
            cwd=tmp_path,
            env=_hub_env(tmp_path, hub_token, endpoint),
            timeout=300,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        assert mirror.history(REPO)[0].message.startswith("quantkit publish")
    retried = [line for line in run.stderr.splitlines() if "thrown while requesting" in line]
    assert len(retried) == 2 and all("http://***@" in line for line in retried), run.stderr
    assert password not in run.stdout + run.stderr
    result = json.loads(run.stdout)
    assert result["endpoint"] == f"http://***@{mirror.url.removeprefix('http://')}"


def test_dry_run_replaces_only_its_own_previous_preview(tmp_path: Path) -> None:
    folder = _folder(tmp_path)
    before = tree_digest(folder)
    preview = tmp_path / "preview"
    env = {"HF_HOME": str(tmp_path / "hf-home"), "HF_TOKEN": ""}
    first = run_cli(
        ["publish", str(folder), "--repo-id", REPO, "--dry-run", "--dry-run-dir", str(preview)], cwd=tmp_path, env=env
    )
    assert first.returncode == 0, first.stderr[-3000:]
    plan = json.loads((preview / "upload-plan.json").read_text())
    (preview / "deploy.json").write_text("{}\n")  # a file the plan lists: still the preview's own
    again = run_cli(
        ["publish", str(folder), "--repo-id", REPO, "--dry-run", "--dry-run-dir", str(preview)], cwd=tmp_path, env=env
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert json.loads((preview / "upload-plan.json").read_text())["files"] == plan["files"]
    assert tree_digest(folder) == before
    assert not [p for p in tmp_path.iterdir() if ".quantkit-" in p.name]


# --- the scrubber itself ---------------------------------------------------------------------------------------------


def test_scrub_secrets_patterns() -> None:
    from quantkit.errors import register_secret, scrub_secrets

    assert scrub_secrets("at http://u:p%40ss@h:8/x?y=1") == "at http://***@h:8/x?y=1"
    assert scrub_secrets("https://h/resolve?token=abc&sig=zz&keep=1") == "https://h/resolve?token=***&sig=***&keep=1"
    hub = "hf_" + "a1B2" * 9
    assert scrub_secrets(f"Authorization: Bearer {hub}") == "Authorization: Bearer ***"
    assert scrub_secrets(f"token {hub} leaked") == "token hf_*** leaked"
    value = "s3cr3t-" + secrets.token_hex(4)
    register_secret(value)
    assert scrub_secrets(f"password {value}, encoded s3cr3t-{value[7:]}") == "password ***, encoded ***"
    for plain in ("a/b@c", "mail me@example.org", "https://x.org/a@b", "/models/org--name/snapshots"):
        assert scrub_secrets(plain) == plain
