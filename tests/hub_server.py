"""A Hugging Face Hub-protocol server on 127.0.0.1 for tests: the endpoints the real huggingface_hub client calls.

Stdlib only (http.server in a thread, ephemeral port). Repos live in memory: each commit is a dict path -> Blob,
commit ids are sha1s, LFS objects are stored by sha256. Written against huggingface_hub 1.33 (the venv's version);
what each endpoint receives and returns is taken from the client source named at each handler. Classic LFS only:
run the client with HF_HUB_DISABLE_XET=1 (the preupload answer carries no Xet information).

Every endpoint except the signed upload/download URLs (the S3/CDN stand-ins, which real clients call without the
Authorization header) answers 401 unless the request has `Authorization: Bearer <token>`. `fail_next(route,
status, times)` makes the next `times` requests to a route fail with `status` before they change anything.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import hmac
import itertools
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import yaml

GITATTRIBUTES = b"""*.bin filter=lfs diff=lfs merge=lfs -text
*.pt filter=lfs diff=lfs merge=lfs -text
*.safetensors filter=lfs diff=lfs merge=lfs -text
*.gguf filter=lfs diff=lfs merge=lfs -text
*.msgpack filter=lfs diff=lfs merge=lfs -text
*.onnx filter=lfs diff=lfs merge=lfs -text
"""
LFS_MIN_SIZE = 10 * 1024 * 1024  # the Hub stores files of 10 MB and more in LFS whatever .gitattributes says
DATE = "2026-11-29T12:00:00.000Z"  # parse_datetime (utils/_datetime.py) wants '%Y-%m-%dT%H:%M:%S.%fZ'
ROUTES = ("create_repo", "preupload", "lfs_batch", "lfs_upload", "lfs_verify", "commit", "resolve", "cdn")


def git_blob_sha1(data: bytes) -> str:
    """Git's blob id (what huggingface_hub's `sha.git_hash` computes for regular files, _commit_api._local_oid)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def lfs_pointer(sha256: str, size: int) -> bytes:
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()


@dataclass
class Blob:
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def git_oid(self) -> str:
        """The tree entry's oid: the git blob id of the file, or of its LFS pointer."""
        return git_blob_sha1(lfs_pointer(self.sha256, len(self.data)) if self.lfs else self.data)

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.git_oid


@dataclass
class Commit:
    oid: str
    parent: str | None
    message: str
    description: str
    files: dict[str, Blob]


@dataclass
class Repo:
    repo_id: str
    private: bool
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    prs: dict[int, str] = field(default_factory=dict)  # refs/pr/N -> commit oid
    lfs: dict[str, bytes] = field(default_factory=dict)  # sha256 -> content (uploaded objects, committed or not)

    def resolve(self, rev: str) -> str | None:
        """A branch name, refs/heads/NAME, refs/pr/N, or a full commit oid -> commit oid."""
        if rev in self.branches:
            return self.branches[rev]
        if rev.startswith("refs/heads/") and rev[len("refs/heads/"):] in self.branches:
            return self.branches[rev[len("refs/heads/"):]]
        if rev.startswith("refs/pr/") and rev[len("refs/pr/"):].isdigit():
            return self.prs.get(int(rev[len("refs/pr/"):]))
        return rev if rev in self.commits else None

    def history(self, rev: str) -> list[Commit]:
        """Commits reachable from `rev`, newest first."""
        out, oid = [], self.resolve(rev)
        while oid is not None:
            out.append(self.commits[oid])
            oid = self.commits[oid].parent
        return out


class HubError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, headers: dict[str, str] | None = None,
                 extra: dict[str, Any] | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.headers = status, message, code, headers or {}
        self.extra = extra or {}


class HubServer:
    """`with HubServer(token) as hub:` serves at `hub.url` until the block ends."""

    def __init__(self, token: str, read_token: str | None = None, host: str = "127.0.0.1",
                 basic: tuple[str, str] | None = None):
        self.token = token
        self.read_token = read_token  # accepted for reads; writes with it get 403, as with a read-only Hub token
        # (user, password) accepted as HTTP Basic auth, as a mirror or proxy in front of a Hub does: httpx sends the
        # user:password@ of an endpoint URL that way, in place of huggingface_hub's Bearer header.
        self.basic = basic
        self.repos: dict[str, Repo] = {}
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status); never headers or bodies
        self.faults: dict[str, list[int]] = {}
        self.lock = threading.RLock()
        self._secret = hashlib.sha256(b"signing key " + token.encode()).digest()
        self._counter = itertools.count()
        self._httpd = ThreadingHTTPServer((host, 0), _Handler)
        self._httpd.daemon_threads = True
        self._httpd.hub = self  # type: ignore[attr-defined]
        self.port = self._httpd.server_address[1]
        self.url = f"http://{host}:{self.port}"
        # The CDN/S3 stand-in is another host name for the same socket: huggingface_hub treats a redirect to another
        # host as a signed CDN URL (utils/_http.py `_is_same_or_hub_host`) and drops the Authorization header for it.
        self.cdn_url = f"http://localhost:{self.port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="hub-server", daemon=True)

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    # --- test helpers ---

    def fail_next(self, route: str, status: int = 500, times: int = 1) -> None:
        if route not in ROUTES:
            raise ValueError(f"unknown route {route}; one of {ROUTES}")
        with self.lock:
            self.faults.setdefault(route, []).extend([status] * times)

    def files(self, repo_id: str, rev: str = "main") -> dict[str, bytes]:
        repo = self.repos[repo_id]
        oid = repo.resolve(rev)
        return {} if oid is None else {p: b.data for p, b in repo.commits[oid].files.items()}

    def add_dataset(self, repo_id: str, files: dict[str, bytes]) -> str:
        """A dataset repo holding `files` (regular, non-LFS blobs) in one commit on main; returns the commit id."""
        with self.lock:
            repo = self.create_repo(f"datasets/{repo_id}")
            parent = repo.commits[repo.branches["main"]]
            commit = self._new_commit(repo, parent.oid, "add data", "",
                                      {**parent.files, **{p: Blob(d, False) for p, d in files.items()}})
            repo.branches["main"] = commit.oid
            return commit.oid

    def history(self, repo_id: str, rev: str = "main") -> list[Commit]:
        return self.repos[repo_id].history(rev)

    def count(self, method: str, path_part: str) -> int:
        return sum(1 for m, p, _ in self.requests if m == method and path_part in p)

    # --- internals ---

    def _fault(self, route: str) -> None:
        with self.lock:
            pending = self.faults.get(route)
            if pending:
                status = pending.pop(0)
                raise HubError(status, f"injected failure on {route}")

    def _sign(self, *parts: str) -> str:
        return hmac.new(self._secret, "/".join(parts).encode(), "sha256").hexdigest()[:32]

    def _new_commit(self, repo: Repo, parent: str | None, message: str, description: str,
                    files: dict[str, Blob]) -> Commit:
        seed = json.dumps([parent, message, sorted((p, b.git_oid) for p, b in files.items()), next(self._counter)])
        commit = Commit(hashlib.sha1(seed.encode()).hexdigest(), parent, message, description, files)
        repo.commits[commit.oid] = commit
        return commit

    def create_repo(self, repo_id: str, private: bool = False) -> Repo:
        """A repo as the Hub creates it: main with one commit holding the default .gitattributes."""
        repo = Repo(repo_id, private)
        first = self._new_commit(repo, None, "initial commit", "", {".gitattributes": Blob(GITATTRIBUTES, False)})
        repo.branches["main"] = first.oid
        self.repos[repo_id] = repo
        return repo


def _front_matter(text: str) -> dict[str, Any] | None:
    if not text.startswith("---"):
        return None
    parts = text.split("\n---", 1)
    if len(parts) < 2:
        raise ValueError("front matter is not closed by ---")
    data = yaml.safe_load(parts[0][3:])
    if data is not None and not isinstance(data, dict):
        raise ValueError("front matter is not a mapping")
    return data


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as httpx uses it; every response has Content-Length

    @property
    def hub(self) -> HubServer:
        return self.server.hub  # type: ignore[attr-defined]

    def log_message(self, format: str, *args: Any) -> None:  # keep pytest output clean
        pass

    # --- plumbing ---

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            chunks = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip(), 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _send(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None,
              content_type: str = "application/json", head: bool = False) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if not head and body:
            self.wfile.write(body)
        self.hub.requests.append((self.command, urlsplit(self.path).path, status))

    def _json(self, status: int, data: Any, headers: dict[str, str] | None = None,
              content_type: str = "application/json") -> None:
        self._send(status, json.dumps(data).encode(), headers, content_type)

    def _auth(self, write: bool) -> None:
        given = self.headers.get("Authorization")
        if given is None:
            raise HubError(401, "Invalid username or password.")
        if self.hub.basic and given.startswith("Basic "):
            expected = base64.b64encode(":".join(self.hub.basic).encode()).decode()
            if hmac.compare_digest(given, f"Basic {expected}"):
                return
            raise HubError(401, "Invalid username or password.")
        if self.hub.read_token and hmac.compare_digest(given, f"Bearer {self.hub.read_token}"):
            if write:
                raise HubError(403, "You don't have the rights to create or write to this repo")
            return
        if not hmac.compare_digest(given, f"Bearer {self.hub.token}"):
            # The Hub's answer to a bad token (utils/_http.py hf_raise_for_status checks this exact message).
            raise HubError(401, "Invalid credentials in Authorization header")

    def _repo(self, repo_id: str) -> Repo:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            raise HubError(404, f"Repository {repo_id} not found", "RepoNotFound")
        return repo

    def _rev(self, repo: Repo, rev: str) -> Commit:
        oid = repo.resolve(rev)
        if oid is None:
            raise HubError(404, f"Invalid rev id: {rev}", "RevisionNotFound")
        return repo.commits[oid]

    def _dispatch(self) -> None:
        method = self.command
        url = urlsplit(self.path)
        seg = [unquote(s) for s in url.path.split("/")[1:]]
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        body = self._body() if method in ("POST", "PUT") else b""
        try:
            with self.hub.lock:
                self._route(method, seg, query, body)
        except HubError as e:
            headers = {"X-Error-Message": e.message, **e.headers}
            if e.code:
                headers["X-Error-Code"] = e.code
            self._send(e.status, json.dumps({"error": e.message, **e.extra}).encode(), headers, head=method == "HEAD")

    do_GET = do_HEAD = do_POST = do_PUT = _dispatch

    def _route(self, method: str, seg: list[str], query: dict[str, str], body: bytes) -> None:
        # Signed URLs handed out by the LFS batch endpoint and the resolve redirect: no Authorization header.
        if seg[:1] == ["__lfs-upload"] and method == "PUT" and len(seg) == 4:
            return self.lfs_upload(f"{seg[1]}/{seg[2]}", seg[3], query, body)
        if seg[:1] == ["__cdn"] and method in ("GET", "HEAD") and len(seg) == 4:
            return self.cdn(f"{seg[1]}/{seg[2]}", seg[3], query, method == "HEAD")
        self._auth(write=method in ("POST", "PUT") and seg[:2] != ["api", "validate-yaml"]
                   and "paths-info" not in seg)
        if seg == ["api", "repos", "create"] and method == "POST":
            return self.create_repo(json.loads(body))
        if seg == ["api", "validate-yaml"] and method == "POST":
            return self.validate_yaml(json.loads(body))
        if seg[:2] == ["api", "datasets"] and len(seg) >= 4 and method == "GET":
            # dataset repos (hf_api.py repo_info / list_repo_tree with repo_type="dataset"), kept as "datasets/<id>"
            repo_id, rest = f"datasets/{seg[2]}/{seg[3]}", seg[4:]
            if not rest or (rest[:1] == ["revision"] and len(rest) == 2):
                return self.model_info(repo_id, rest[1] if rest else None)
            if rest[:1] == ["tree"] and len(rest) >= 2:
                return self.tree(repo_id, rest[1], "/".join(rest[2:]), query)
        if seg[:1] == ["datasets"] and len(seg) >= 6 and seg[3] == "resolve" and method in ("GET", "HEAD"):
            return self.resolve(f"datasets/{seg[1]}/{seg[2]}", seg[4], "/".join(seg[5:]), method == "HEAD")
        if seg[:2] == ["api", "models"] and len(seg) >= 4:
            repo_id, rest = f"{seg[2]}/{seg[3]}", seg[4:]
            if not rest and method == "GET":
                return self.model_info(repo_id, None)
            if rest[:1] == ["revision"] and len(rest) == 2 and method == "GET":
                return self.model_info(repo_id, rest[1])
            if rest[:1] == ["preupload"] and len(rest) == 2 and method == "POST":
                return self.preupload(repo_id, rest[1], json.loads(body))
            if rest[:1] == ["commit"] and len(rest) == 2 and method == "POST":
                return self.commit(repo_id, rest[1], query, body)
            if rest[:1] == ["tree"] and len(rest) >= 2 and method == "GET":
                return self.tree(repo_id, rest[1], "/".join(rest[2:]), query)
            if rest[:1] == ["paths-info"] and len(rest) == 2 and method == "POST":
                return self.paths_info(repo_id, rest[1], body)
            if rest == ["refs"] and method == "GET":
                return self.refs(repo_id)
            if rest[:1] == ["branch"] and len(rest) == 2 and method == "POST":
                return self.create_branch(repo_id, rest[1], json.loads(body or b"{}"))
        if seg[:1] == ["__lfs-verify"] and method == "POST" and len(seg) == 3:
            return self.lfs_verify(f"{seg[1]}/{seg[2]}", json.loads(body))
        if len(seg) == 6 and seg[1].endswith(".git") and seg[2:] == ["info", "lfs", "objects", "batch"] \
                and method == "POST":
            return self.lfs_batch(f"{seg[0]}/{seg[1][:-4]}", json.loads(body))
        if len(seg) >= 5 and seg[2] == "resolve" and method in ("GET", "HEAD"):
            return self.resolve(f"{seg[0]}/{seg[1]}", seg[3], "/".join(seg[4:]), method == "HEAD")
        raise HubError(404, f"no route for {method} {'/'.join(seg)}")

    # --- endpoints ---

    def create_repo(self, payload: dict[str, Any]) -> None:
        """hf_api.py HfApi.create_repo: POST /api/repos/create {name, organization, visibility?, type?};
        409 when it exists (exist_ok=True swallows it); answers {url}."""
        self.hub._fault("create_repo")
        if payload.get("type", "model") != "model":
            raise HubError(400, "this test server only has model repos")
        repo_id = f"{payload.get('organization') or 'user'}/{payload['name']}"
        url = f"{self.hub.url}/{repo_id}"
        if repo_id in self.hub.repos:
            # The Hub repeats the url in the 409 body; create_repo(exist_ok=True) reads it from there.
            raise HubError(409, "You already created this model repo", extra={"url": url})
        self.hub.create_repo(repo_id, payload.get("visibility") == "private" or bool(payload.get("private")))
        self._json(200, {"url": url, "name": repo_id, "id": repo_id})

    def validate_yaml(self, payload: dict[str, Any]) -> None:
        """hf_api.py HfApi._validate_yaml (called by create_commit when README.md is added)."""
        try:
            _front_matter(payload.get("content", ""))
        except (yaml.YAMLError, ValueError) as e:
            return self._json(400, {"errors": [{"message": str(e).splitlines()[0]}], "warnings": []})
        self._json(200, {"errors": [], "warnings": []})

    def model_info(self, repo_id: str, rev: str | None) -> None:
        """hf_api.py HfApi.model_info/repo_info: GET /api/models/{repo}[/revision/{rev}] -> ModelInfo(**json)."""
        repo = self._repo(repo_id)
        commit = self._rev(repo, rev or "main")
        card = None
        if "README.md" in commit.files:
            try:
                card = _front_matter(commit.files["README.md"].data.decode())
            except (yaml.YAMLError, ValueError, UnicodeDecodeError):
                card = None
        siblings = [{"rfilename": p, "size": len(b.data), "blobId": b.git_oid,
                     **({"lfs": {"size": len(b.data), "sha256": b.sha256,
                                 "pointerSize": len(lfs_pointer(b.sha256, len(b.data)))}} if b.lfs else {})}
                    for p, b in sorted(commit.files.items())]
        self._json(200, {"id": repo_id, "_id": repo_id, "modelId": repo_id, "author": repo_id.split("/")[0],
                         "sha": commit.oid, "private": repo.private, "gated": False, "disabled": False,
                         "lastModified": DATE, "createdAt": DATE, "tags": (card or {}).get("tags", []),
                         "library_name": (card or {}).get("library_name"), "cardData": card, "siblings": siblings})

    def _upload_mode(self, commit: Commit, path: str, size: int, sample: bytes) -> str:
        patterns = []
        attrs = commit.files.get(".gitattributes")
        for line in (attrs.data.decode(errors="replace").splitlines() if attrs else []):
            parts = line.split()
            if len(parts) >= 2 and "filter=lfs" in parts[1:]:
                patterns.append(parts[0])
        name = path.rsplit("/", 1)[-1]
        if any(fnmatch.fnmatch(name, p) or fnmatch.fnmatch(path, p) for p in patterns):
            return "lfs"
        return "lfs" if size >= LFS_MIN_SIZE or b"\0" in sample else "regular"

    def preupload(self, repo_id: str, rev: str, payload: dict[str, Any]) -> None:
        """_commit_api.py _fetch_upload_modes: POST /api/models/{repo}/preupload/{rev} {files: [{path, sample (b64
        of the first 512 bytes), size}]} -> {files: [{path, uploadMode lfs|regular, shouldIgnore, oid}]}; `oid` is
        the file's current id at rev (sha256 for LFS, git blob sha1 otherwise), which the client compares with the
        local one to drop unchanged files from the commit (hf_api.py create_commit)."""
        self.hub._fault("preupload")
        commit = self._rev(self._repo(repo_id), rev)
        out = []
        for f in payload.get("files", []):
            mode = self._upload_mode(commit, f["path"], int(f["size"]), base64.b64decode(f.get("sample", "")))
            existing = commit.files.get(f["path"])
            oid = None if existing is None else (existing.sha256 if existing.lfs else existing.git_oid)
            out.append({"path": f["path"], "uploadMode": mode, "shouldIgnore": False, "oid": oid})
        self._json(200, {"files": out, "commitOid": commit.oid})

    def lfs_batch(self, repo_id: str, payload: dict[str, Any]) -> None:
        """lfs.py post_lfs_batch_info: POST /{repo}.git/info/lfs/objects/batch {operation: upload, transfers,
        objects: [{oid, size}], hash_algo, ref?} -> {transfer, objects: [{oid, size, actions: {upload: {href},
        verify: {href}}}]}; no `actions` when the object is already stored (lfs.py lfs_upload skips it)."""
        self.hub._fault("lfs_batch")
        repo = self._repo(repo_id)
        if payload.get("operation") != "upload":
            raise HubError(400, "only the upload operation is served")
        objects = []
        for o in payload.get("objects", []):
            oid, size = o["oid"], int(o["size"])
            entry: dict[str, Any] = {"oid": oid, "size": size, "authenticated": True}
            if oid not in repo.lfs:
                sig = self.hub._sign(repo_id, oid, str(size))
                entry["actions"] = {
                    "upload": {"href": f"{self.hub.cdn_url}/__lfs-upload/{repo_id}/{oid}?size={size}&sig={sig}",
                               "header": {}},
                    "verify": {"href": f"{self.hub.url}/__lfs-verify/{repo_id}", "header": {}},
                }
            objects.append(entry)
        self._json(200, {"transfer": "basic", "objects": objects}, content_type="application/vnd.git-lfs+json")

    def lfs_upload(self, repo_id: str, oid: str, query: dict[str, str], body: bytes) -> None:
        """lfs.py _upload_single_part: PUT of the raw bytes to the upload href, no Authorization (a signed URL)."""
        if not hmac.compare_digest(query.get("sig", ""), self.hub._sign(repo_id, oid, query.get("size", ""))):
            raise HubError(403, "SignatureDoesNotMatch")
        self.hub._fault("lfs_upload")
        if hashlib.sha256(body).hexdigest() != oid or len(body) != int(query["size"]):
            raise HubError(400, "uploaded content does not match the announced oid/size")
        self._repo(repo_id).lfs[oid] = body
        self._send(200, headers={"ETag": f'"{hashlib.md5(body).hexdigest()}"'})

    def lfs_verify(self, repo_id: str, payload: dict[str, Any]) -> None:
        """lfs.py lfs_upload step 3: POST {oid, size} to the verify href, with the Authorization header."""
        self.hub._fault("lfs_verify")
        data = self._repo(repo_id).lfs.get(payload.get("oid", ""))
        if data is None or len(data) != payload.get("size"):
            raise HubError(404, f"object {payload.get('oid')} not found or of another size")
        self._json(200, {"success": True})

    def commit(self, repo_id: str, rev: str, query: dict[str, str], body: bytes) -> None:
        """_commit_api.py _send_commit/_prepare_commit_payload: POST /api/models/{repo}/commit/{rev}[?create_pr=1],
        NDJSON lines {key: header, value: {summary, description, parentCommit?}}, {key: file, value: {path,
        content (base64), encoding}}, {key: lfsFile, value: {path, algo: sha256, oid, size}}, {key: deletedFile |
        deletedFolder, value: {path}} -> {commitUrl, commitOid, pullRequestUrl}. All or nothing: every check runs
        before the branch moves."""
        repo = self._repo(repo_id)
        base = self._rev(repo, rev)
        self.hub._fault("commit")
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        if not lines or lines[0].get("key") != "header":
            raise HubError(400, "the first line of a commit must be its header")
        header = lines[0]["value"]
        parent_commit = header.get("parentCommit")
        if parent_commit and not base.oid.startswith(parent_commit):
            raise HubError(412, f"parentCommit {parent_commit} is not the head of {rev} ({base.oid})")
        files = dict(base.files)
        for line in lines[1:]:
            key, value = line.get("key"), line.get("value", {})
            path = value.get("path", "")
            if key == "file":
                if value.get("encoding") != "base64":
                    raise HubError(400, f"{path}: only base64 file content is supported")
                files[path] = Blob(base64.b64decode(value["content"]), False)
            elif key == "lfsFile":
                data = repo.lfs.get(value.get("oid", ""))
                if data is None or ("size" in value and len(data) != value["size"]):
                    raise HubError(400, f"{path}: LFS object {value.get('oid')} was not uploaded")
                files[path] = Blob(data, True)
            elif key == "deletedFile":
                if path not in files:
                    raise HubError(404, f"{path}: A file with this name doesn't exist", "EntryNotFound")
                del files[path]
            elif key == "deletedFolder":
                prefix = path.rstrip("/") + "/"
                files = {p: b for p, b in files.items() if not p.startswith(prefix)}
            else:
                raise HubError(400, f"unknown commit line {key!r}")
        commit = self.hub._new_commit(repo, base.oid, header.get("summary", ""), header.get("description", ""),
                                      files)
        pr_url = None
        if query.get("create_pr") == "1":
            num = max(repo.prs, default=0) + 1
            repo.prs[num] = commit.oid
            pr_url = f"{self.hub.url}/{repo_id}/discussions/{num}"
        elif rev.startswith("refs/pr/"):
            repo.prs[int(rev[len("refs/pr/"):])] = commit.oid
        else:
            repo.branches[rev[len("refs/heads/"):] if rev.startswith("refs/heads/") else rev] = commit.oid
        self._json(200, {"success": True, "commitOid": commit.oid, "commitUrl": f"{self.hub.url}/{repo_id}/commit/"
                         f"{commit.oid}", "pullRequestUrl": pr_url, "hookOutput": ""})

    def _entry(self, path: str, blob: Blob) -> dict[str, Any]:
        entry: dict[str, Any] = {"type": "file", "oid": blob.git_oid, "size": len(blob.data), "path": path}
        if blob.lfs:
            entry["lfs"] = {"oid": blob.sha256, "size": len(blob.data),
                            "pointerSize": len(lfs_pointer(blob.sha256, len(blob.data)))}
        return entry

    @staticmethod
    def _folder(path: str, files: dict[str, Blob]) -> dict[str, Any]:
        inside = sorted(p for p in files if p.startswith(path + "/"))
        return {"type": "directory", "oid": hashlib.sha1("\n".join(inside).encode()).hexdigest(), "path": path}

    def tree(self, repo_id: str, rev: str, path: str, query: dict[str, str]) -> None:
        """hf_api.py HfApi.list_repo_tree: GET /api/models/{repo}/tree/{rev}[/{path}]?recursive=&expand= ->
        [{type: file, oid, size, path, lfs?: {oid, size, pointerSize}} | {type: directory, oid, path}]; one page
        (utils/_pagination.py follows a Link: next header, which this server never sends)."""
        commit = self._rev(self._repo(repo_id), rev)
        recursive = query.get("recursive", "false").lower() in ("1", "true")
        prefix = path.strip("/") + "/" if path.strip("/") else ""
        if prefix and not any(p.startswith(prefix) for p in commit.files):
            raise HubError(404, f"{path}: no such folder", "EntryNotFound")
        out: dict[str, dict[str, Any]] = {}
        for p, blob in sorted(commit.files.items()):
            if not p.startswith(prefix):
                continue
            rest = p[len(prefix):].split("/")
            for depth in range(1, len(rest)):  # the folders on the way
                folder = prefix + "/".join(rest[:depth])
                if recursive or depth == 1:
                    out.setdefault(folder, self._folder(folder, commit.files))
            if recursive or len(rest) == 1:
                out[p] = self._entry(p, blob)
        self._json(200, list(out.values()))

    def paths_info(self, repo_id: str, rev: str, body: bytes) -> None:
        """hf_api.py HfApi.get_paths_info: POST /api/models/{repo}/paths-info/{rev}, form-encoded paths=..&expand=
        -> the tree entries of those paths that exist (missing ones are left out, not an error)."""
        commit = self._rev(self._repo(repo_id), rev)
        form = parse_qs(body.decode())
        out = []
        for path in form.get("paths", []):
            path = path.strip("/")
            if path in commit.files:
                out.append(self._entry(path, commit.files[path]))
            elif any(p.startswith(path + "/") for p in commit.files):
                out.append(self._folder(path, commit.files))
        self._json(200, out)

    def refs(self, repo_id: str) -> None:
        """hf_api.py HfApi.list_repo_refs: GET /api/models/{repo}/refs[?include_prs=1]."""
        repo = self._repo(repo_id)
        self._json(200, {
            "branches": [{"name": b, "ref": f"refs/heads/{b}", "targetCommit": oid}
                         for b, oid in repo.branches.items()],
            "converts": [], "tags": [],
            "pullRequests": [{"name": f"refs/pr/{n}", "ref": f"refs/pr/{n}", "targetCommit": oid}
                             for n, oid in repo.prs.items()],
        })

    def create_branch(self, repo_id: str, branch: str, payload: dict[str, Any]) -> None:
        """hf_api.py HfApi.create_branch: POST /api/models/{repo}/branch/{branch} {startingPoint?}; 409 if it
        exists."""
        repo = self._repo(repo_id)
        if branch in repo.branches:
            raise HubError(409, f"Reference refs/heads/{branch} already exists")
        start = self._rev(repo, payload.get("startingPoint") or "main")
        repo.branches[branch] = start.oid
        self._json(200, {})

    def resolve(self, repo_id: str, rev: str, path: str, head: bool) -> None:
        """file_download.py get_hf_file_metadata (HEAD) and http_get (GET) on /{repo}/resolve/{rev}/{path}: needs
        X-Repo-Commit and an ETag. A regular file is served here (ETag = git blob id); an LFS file answers 302 to
        the CDN stand-in with X-Linked-Etag (sha256) and X-Linked-Size, as the Hub does; the client stops at that
        redirect for metadata and downloads from the Location without the Authorization header."""
        self.hub._fault("resolve")
        repo = self._repo(repo_id)
        commit = self._rev(repo, rev)
        blob = commit.files.get(path)
        if blob is None:
            raise HubError(404, f"Entry not found: {path}", "EntryNotFound", {"X-Repo-Commit": commit.oid})
        headers = {"X-Repo-Commit": commit.oid, "Accept-Ranges": "bytes"}
        if blob.lfs:
            sig = self.hub._sign(repo_id, blob.sha256, "get")
            headers.update({"Location": f"{self.hub.cdn_url}/__cdn/{repo_id}/{blob.sha256}?sig={sig}",
                            "X-Linked-Etag": f'"{blob.sha256}"', "X-Linked-Size": str(len(blob.data)),
                            "ETag": f'"{blob.git_oid}"'})
            return self._send(302, b"", headers, head=head)
        headers["ETag"] = f'"{blob.git_oid}"'
        self._send_content(blob.data, headers, head)

    def cdn(self, repo_id: str, sha256: str, query: dict[str, str], head: bool) -> None:
        """The signed download URL of an LFS object (no Authorization header: file_download.py drops it)."""
        if not hmac.compare_digest(query.get("sig", ""), self.hub._sign(repo_id, sha256, "get")):
            raise HubError(403, "SignatureDoesNotMatch")
        self.hub._fault("cdn")
        data = self._repo(repo_id).lfs.get(sha256)
        if data is None:
            raise HubError(404, "NoSuchKey")
        self._send_content(data, {"ETag": f'"{sha256}"', "Accept-Ranges": "bytes"}, head)

    def _send_content(self, data: bytes, headers: dict[str, str], head: bool) -> None:
        rng = self.headers.get("Range", "")
        if rng.startswith("bytes=") and not head:  # file_download.py http_get resumes with `bytes=N-`
            start_s, _, end_s = rng[len("bytes="):].partition("-")
            start = int(start_s or 0)
            end = int(end_s) if end_s else len(data) - 1
            part = data[start:end + 1]
            headers = {**headers, "Content-Range": f"bytes {start}-{start + len(part) - 1}/{len(data)}"}
            return self._send(206, part, headers, "application/octet-stream")
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(data)
        self.hub.requests.append((self.command, urlsplit(self.path).path, 200))

