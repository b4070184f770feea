"""A Hugging Face Hub stand-in on loopback, for tests that must never reach the real Hub.

Two threaded HTTP servers, as the Hub is two services:

- the **Hub** (``endpoint``, what ``HF_ENDPOINT`` points at) answers
  ``GET /api/models/{repo}[/revision/{rev}]`` (the repo's commit and ``siblings``, with sizes
  and LFS sha256 when ``?blobs=true``) and ``HEAD|GET /{repo}/resolve/{rev}/{path}``: a 302 to
  the CDN carrying ``X-Repo-Commit``, ``X-Linked-Etag`` (the sha256) and ``X-Linked-Size``, as
  the Hub does for LFS files; errors carry the ``X-Error-Code`` huggingface_hub maps to its
  exceptions (RepoNotFound, GatedRepo, RevisionNotFound, EntryNotFound);
- the **CDN** (another port, so another origin: huggingface_hub takes the metadata from the
  redirect itself and drops the Authorization header, as for the real CDN) serves the bytes
  with ``Range`` support.

Files are served from disk (real GGUF files of the test models). Faults are injected per
file: ``drop_after`` closes the connection mid-body once, after that many bytes;
``stall_after`` stops sending after that many bytes until ``release`` is set (a client can
be killed mid-download there), then drops the connection. Every
request is logged (``requests``) so a test can assert what huggingface_hub asked for.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

_CHUNK = 1 << 20


@dataclass
class Blob:
    source: Path
    sha256: str
    size: int


@dataclass
class Repo:
    commit: str
    files: dict[str, Blob] = field(default_factory=dict)  # path in repo -> blob
    gated: bool = False  # needs ``Authorization: Bearer <one of StandIn.tokens>``
    branches: dict[str, str] = field(default_factory=dict)  # name -> commit


@dataclass
class Logged:
    server: str  # "hub" | "cdn"
    method: str
    path: str
    range: str | None
    authorization: str | None


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(4 << 20):
            h.update(block)
    return h.hexdigest()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, *args):
        super().__init__(*args)
        self.open: set[socket.socket] = set()

    def process_request(self, request, client_address):
        self.open.add(request)
        super().process_request(request, client_address)

    def shutdown_request(self, request):
        self.open.discard(request)
        super().shutdown_request(request)

    def close_open(self) -> None:
        """Close kept-alive connections too: a stopped Hub must not answer on old sockets."""
        for sock in list(self.open):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def handle_error(self, request, client_address):
        pass  # a client killed mid-body (a test's doing) is not an error worth a traceback


class StandIn:
    """``with StandIn() as hub: hub.add_file("o/r", "m.gguf", path)``; ``hub.endpoint``."""

    def __init__(self):
        self.repos: dict[str, Repo] = {}
        self.tokens: set[str] = set()
        self.requests: list[Logged] = []
        self.drop_after: dict[str, int] = {}  # sha256 -> bytes sent before the connection drops
        self.stall_after: dict[str, int] = {}  # sha256 -> bytes sent before the body stalls
        self.release = threading.Event()
        self._sha_cache: dict[tuple[str, int, int], str] = {}
        self._lock = threading.Lock()
        self._hub = _Server(("127.0.0.1", 0), _handler(self, "hub"))
        self._cdn = _Server(("127.0.0.1", 0), _handler(self, "cdn"))
        self._threads: list[threading.Thread] = []

    # ------------------------------------------------------------------ setup
    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self._hub.server_address[1]}"

    @property
    def cdn(self) -> str:
        return f"http://127.0.0.1:{self._cdn.server_address[1]}"

    def add_file(self, repo: str, path_in_repo: str, source: Path, *, commit: str | None = None,
                 sha256: str | None = None) -> Blob:
        """Serve `source` as `path_in_repo` of `repo` (created on first use, branch main)."""
        st = source.stat()
        key = (str(source), st.st_size, st.st_mtime_ns)
        sha = sha256 or self._sha_cache.get(key) or _sha256(source)
        self._sha_cache[key] = sha
        r = self.repos.get(repo)
        if r is None:
            r = self.repos[repo] = Repo(commit=commit or hashlib.sha1(repo.encode()).hexdigest())
            r.branches["main"] = r.commit
        blob = Blob(source=source, sha256=sha, size=st.st_size)
        r.files[path_in_repo] = blob
        return blob

    def start(self) -> "StandIn":
        for s in (self._hub, self._cdn):
            t = threading.Thread(target=s.serve_forever, kwargs={"poll_interval": 0.05},
                                 daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self.release.set()
        for s in (self._hub, self._cdn):
            s.shutdown()
            s.server_close()
            s.close_open()
        for t in self._threads:
            t.join(timeout=5)
        self._threads.clear()

    def __enter__(self) -> "StandIn":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def log(self, server: str | None = None, method: str | None = None) -> list[Logged]:
        with self._lock:
            return [r for r in self.requests if (server is None or r.server == server)
                    and (method is None or r.method == method)]

    def clear_log(self) -> None:
        with self._lock:
            self.requests.clear()

    # ------------------------------------------------------------------ lookups
    def _blob_by_sha(self, sha: str) -> Blob | None:
        for r in self.repos.values():
            for b in r.files.values():
                if b.sha256 == sha:
                    return b
        return None

    def _authorized(self, repo: Repo, auth: str | None) -> bool:
        if not repo.gated:
            return True
        return bool(auth) and auth.removeprefix("Bearer ").strip() in self.tokens


def _handler(hub: StandIn, server: str):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # keep test output clean
            pass

        def _record(self) -> None:
            with hub._lock:
                hub.requests.append(Logged(server, self.command, self.path,
                                           self.headers.get("Range"),
                                           self.headers.get("Authorization")))

        def do_HEAD(self):
            self._record()
            self._route(body=False)

        def do_GET(self):
            self._record()
            self._route(body=True)

        # --------------------------------------------------------------- helpers
        def _send(self, status: int, headers: dict[str, str] | None = None,
                  body: bytes = b"", send_body: bool = True) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if send_body and body:
                self.wfile.write(body)

        def _error(self, status: int, code: str, message: str, send_body: bool,
                   commit: str | None = None) -> None:
            headers = {"X-Error-Code": code, "X-Error-Message": message,
                       "Content-Type": "application/json"}
            if commit:
                headers["X-Repo-Commit"] = commit
            self._send(status, headers, json.dumps({"error": message}).encode(), send_body)

        def _route(self, body: bool) -> None:
            url = urlsplit(self.path)
            path = unquote(url.path)
            if server == "cdn":
                return self._serve_blob(path, body)
            m = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/(.+))?", path)
            if m:
                return self._model_info(m.group(1), m.group(2) or "main", "blobs=true" in url.query,
                                        body)
            m = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
            if m:
                return self._resolve(m.group(1), m.group(2), m.group(3), body)
            self._send(404, {"Content-Type": "text/plain"}, b"not a Hub route", body)

        def _repo(self, repo_id: str, body: bool) -> Repo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                # the Hub answers 401 to anonymous requests for a missing (or private) repo
                auth = self.headers.get("Authorization")
                self._error(404 if auth else 401, "RepoNotFound", "Repository not found", body)
            return repo

        def _commit(self, repo: Repo, rev: str) -> str | None:
            if rev in repo.branches:
                return repo.branches[rev]
            return rev if rev == repo.commit else None

        def _model_info(self, repo_id: str, rev: str, blobs: bool, body: bool) -> None:
            repo = self._repo(repo_id, body)
            if repo is None:
                return
            commit = self._commit(repo, rev)
            if commit is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", body)
            siblings = []
            for name, b in sorted(repo.files.items()):
                s = {"rfilename": name}
                if blobs:
                    s.update(size=b.size, blobId=hashlib.sha1(b.sha256.encode()).hexdigest(),
                             lfs={"size": b.size, "sha256": b.sha256, "pointerSize": 134})
                siblings.append(s)
            info = {"_id": repo_id, "id": repo_id, "modelId": repo_id, "sha": commit,
                    "private": False, "gated": "manual" if repo.gated else False,
                    "disabled": False, "downloads": 0, "likes": 0, "tags": ["gguf"],
                    "library_name": "gguf", "siblings": siblings,
                    "lastModified": "2026-01-01T00:00:00.000Z",
                    "createdAt": "2026-01-01T00:00:00.000Z"}
            self._send(200, {"Content-Type": "application/json"}, json.dumps(info).encode(), body)

        def _resolve(self, repo_id: str, rev: str, name: str, body: bool) -> None:
            repo = self._repo(repo_id, body)
            if repo is None:
                return
            commit = self._commit(repo, rev)
            if commit is None:
                return self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", body)
            if not hub._authorized(repo, self.headers.get("Authorization")):
                status = 403 if self.headers.get("Authorization") else 401
                return self._error(status, "GatedRepo",
                                   f"Access to model {repo_id} is restricted. You must have "
                                   "access to it and be authenticated to access it.", body)
            blob = repo.files.get(name)
            if blob is None:
                return self._error(404, "EntryNotFound", f"{name} does not exist on {rev}",
                                   body, commit)
            self._send(302, {"Location": f"{hub.cdn}/blobs/{blob.sha256}",
                             "X-Repo-Commit": commit, "X-Linked-Etag": f'"{blob.sha256}"',
                             "X-Linked-Size": str(blob.size),
                             "ETag": f'"{hashlib.sha1(blob.sha256.encode()).hexdigest()}"'},
                       b"", body)

        def _serve_blob(self, path: str, body: bool) -> None:
            m = re.fullmatch(r"/blobs/([0-9a-f]{64})", path)
            blob = hub._blob_by_sha(m.group(1)) if m else None
            if blob is None:
                return self._send(404, {"Content-Type": "text/plain"}, b"no such blob", body)
            start = 0
            rng = self.headers.get("Range")
            if rng:
                m = re.fullmatch(r"bytes=(\d+)-", rng.strip())
                if not m or int(m.group(1)) >= blob.size:
                    return self._send(416, {"Content-Range": f"bytes */{blob.size}"}, b"", body)
                start = int(m.group(1))
            length = blob.size - start
            self.send_response(206 if rng else 200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(length))
            self.send_header("ETag", f'"{blob.sha256}"')
            if rng:
                self.send_header("Content-Range", f"bytes {start}-{blob.size - 1}/{blob.size}")
            self.end_headers()
            if not body:
                return
            with hub._lock:
                drop = hub.drop_after.pop(blob.sha256, None)
                stall = hub.stall_after.pop(blob.sha256, None)
            if stall is not None:
                drop = stall
            sent = 0
            with open(blob.source, "rb") as f:
                f.seek(start)
                while sent < length:
                    n = min(_CHUNK, length - sent)
                    if drop is not None:
                        n = min(n, drop - sent)
                        if n <= 0:
                            # the connection drops mid-body, as a flaky network does
                            self.wfile.flush()
                            if stall is not None:
                                hub.release.wait(60)
                            self.close_connection = True
                            self.connection.shutdown(2)
                            return
                    data = f.read(n)
                    self.wfile.write(data)
                    sent += len(data)

    return Handler
