"""A stand-in for the Hugging Face hub on 127.0.0.1, in the hub's API layout, so that `pull` runs
huggingface_hub's real download code against it (HF_ENDPOINT): repo info, the tree listing with
LFS sha256s, and `resolve` with HEAD metadata and Range requests. It records every request, and
can serve a file's bytes corrupted, cut off, slowly, or not at all."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COMMIT = "c0ffee" + "0" * 34
LFS = (".safetensors", ".gguf")        # the files the hub keeps in LFS (sha256 listed)


def git_blob_sha1(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def blob_name(path: str, data: bytes) -> str:
    """The name huggingface_hub's cache gives a file's blob: its ETag (sha256 for LFS files)."""
    return hashlib.sha256(data).hexdigest() if path.endswith(LFS) else git_blob_sha1(data)


@dataclass
class Hub:
    repos: dict[str, dict[str, bytes]]                        # repo id -> path -> bytes
    corrupt: set[str] = field(default_factory=set)            # paths served with their bytes altered
    cut_once: set[str] = field(default_factory=set)           # paths whose first transfer stops half-way
    failing: set[str] = field(default_factory=set)            # listed, but answered 404 (gone meanwhile)
    dead: set[str] = field(default_factory=set)               # cut half-way, then connections dropped unanswered
    slow: set[str] = field(default_factory=set)               # 1 KB every 0.2 s (a 70 KB file: 14 s)
    was_cut: set[str] = field(default_factory=set)
    requests: list[tuple[str, str, str | None]] = field(default_factory=list)   # (method, path, Range)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def fetched(self) -> list[str]:
        """The repo files whose bytes were asked for (GET on resolve)."""
        return [p.split("/resolve/", 1)[1].split("/", 1)[1] for m, p, _ in self.requests if m == "GET" and "/resolve/" in p]

    def start(self) -> "Hub":
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):            # quiet: the test reads hub.requests instead
                pass

            def do_HEAD(self):
                self.answer(body=False)

            def do_GET(self):
                self.answer(body=True)

            def answer(self, body: bool):
                hub.requests.append((self.command, self.path.split("?")[0], self.headers.get("Range")))
                path = self.path.split("?")[0]
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path):
                    return self.repo_info(m[1])
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)", path):
                    return self.tree(m[1])
                if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
                    return self.resolve(m[1], m[3], body)
                self.reply(404, {"error": "not found"})

            def missing(self, repo: str) -> bool:
                if repo in hub.repos:
                    return False
                self.reply(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
                return True

            def repo_info(self, repo):
                if not self.missing(repo):
                    self.reply(200, {"id": repo, "modelId": repo, "sha": COMMIT, "private": False,
                                     "siblings": [{"rfilename": p} for p in hub.repos[repo]]})

            def tree(self, repo):
                if self.missing(repo):
                    return
                entries = []
                for p, data in hub.repos[repo].items():
                    entry = {"type": "file", "oid": git_blob_sha1(data), "size": len(data), "path": p}
                    if p.endswith(LFS):                # LFS files: the hub gives their sha256
                        entry["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                    entries.append(entry)
                self.reply(200, entries)

            def resolve(self, repo, name, body):
                if self.missing(repo):
                    return
                if name not in hub.repos[repo]:
                    return self.reply(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
                if name in hub.failing:                    # no retries: huggingface_hub retries 5xx for 30 s
                    return self.reply(404, {"error": "Entry not found"}, {"X-Error-Code": "EntryNotFound"})
                if body and name in hub.dead and name in hub.was_cut:
                    self.close_connection = True           # the hub went away: no answer at all
                    return
                data = hub.repos[repo][name]
                lfs = name.endswith(LFS)
                etag = blob_name(name, data)
                if name in hub.corrupt:
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                start = 0
                if (r := self.headers.get("Range")) and (m := re.fullmatch(r"bytes=(\d+)-", r)):
                    start = int(m[1])
                self.send_response(206 if start else 200)
                self.send_header("Content-Length", str(len(data) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.send_header("ETag", f'"{etag}"')
                self.send_header("X-Repo-Commit", COMMIT)
                if lfs:
                    self.send_header("X-Linked-Etag", f'"{etag}"')
                    self.send_header("X-Linked-Size", str(len(data)))
                self.end_headers()
                if body and (name in hub.cut_once or name in hub.dead):   # half the bytes, then the connection drops
                    hub.cut_once.discard(name)
                    hub.was_cut.add(name)
                    self.wfile.write(data[start:len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    return
                if body and name in hub.slow:
                    try:
                        for i in range(start, len(data), 1024):
                            self.wfile.write(data[i:i + 1024])
                            self.wfile.flush()
                            time.sleep(0.2)
                    except OSError:                         # the client went away
                        self.close_connection = True
                elif body:
                    self.wfile.write(data[start:])

            def reply(self, status, obj, headers=None):
                raw = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
