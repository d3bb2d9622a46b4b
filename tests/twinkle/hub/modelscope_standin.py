"""A loopback stand-in of the ModelScope hub's HTTP endpoints, for upload tests without network.

It serves just what modelscope's ``HubApi`` calls to check a token (``whoami``), create a model
repository and upload a folder (LFS batch check, blob PUT, commit), and records every request:
tests see which token arrived, which repository, and the committed files byte for byte. Point
``HubApi`` at it with ``endpoint=hub.url`` or ``MODELSCOPE_ENDPOINT``.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


@dataclass
class Recorded:
    """One request as it arrived."""

    method: str
    path: str
    token: str | None  # the bearer token
    body: bytes


@dataclass
class StandinHub:
    """What the stand-in knows and saw.

    Attributes:
        users: Accepted tokens -> user names; any other token is answered 401.
        repos: Created repositories (``owner/name``) -> visibility code.
        files: Committed files per repository: path -> bytes.
        requests: Every request, in order.
    """

    users: dict[str, str]
    url: str = ""
    repos: dict[str, int] = field(default_factory=dict)
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)
    blobs: dict[str, bytes] = field(default_factory=dict)
    requests: list[Recorded] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def tokens_used(self, repo_id: str | None = None) -> set[str | None]:
        """Tokens of the requests (about ``repo_id``, when given)."""
        return {
            r.token
            for r in self.requests
            if repo_id is None or repo_id in r.path or repo_id.encode() in r.body
        }

    def writes(self) -> list[Recorded]:
        """Requests that change something (create, upload, commit)."""
        return [r for r in self.requests if r.method in ("POST", "PUT") and "lfs" not in r.path]

    def reset(self) -> None:
        with self.lock:
            self.repos.clear(), self.files.clear(), self.blobs.clear(), self.requests.clear()


_COMMIT = re.compile(r"/api/v1/repos/models/([^/]+/[^/]+)/commit/[^/]+")
_LFS_BATCH = re.compile(r"/api/v1/repos/models/([^/]+/[^/]+)/info/lfs/objects/batch")
_BLOB = re.compile(r"/lfs-blobs/([0-9a-f]{64})")


def _handler(hub: StandinHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # quiet
            pass

        def _reply(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            auth = self.headers.get("Authorization") or ""
            token = auth[len("Bearer ") :] if auth.startswith("Bearer ") else None
            path = urlsplit(self.path).path
            with hub.lock:
                hub.requests.append(Recorded(self.command, path, token, body))
            user = hub.users.get(token or "")
            if user is None:
                self._reply(401, {"Code": 10010106, "Success": False, "Message": "invalid token"})
                return
            with hub.lock:
                status, reply = self._route(path, body, user)
            self._reply(status, reply)

        def _route(self, path: str, body: bytes, user: str) -> tuple[int, dict]:
            if self.command == "GET" and path == "/openapi/v1/users/me":
                return 200, {"success": True, "data": {"username": user, "email": f"{user}@x"}}
            if self.command == "POST" and path == "/api/v1/models":
                request = json.loads(body)
                repo_id = f"{request['Path']}/{request['Name']}"
                if request["Path"] != user:
                    return 403, {"Code": 403, "Success": False, "Message": "no permission"}
                if repo_id in hub.repos:
                    return 409, {"Success": False, "Message": f"model {repo_id} already exists"}
                hub.repos[repo_id] = request.get("Visibility")
                return 200, {"Code": 200, "Success": True, "Data": {"Path": repo_id}}
            if self.command == "POST" and (match := _LFS_BATCH.fullmatch(path)):
                objects = json.loads(body)["objects"]
                return 200, {"Code": 200, "Success": True, "Data": {"objects": [
                    {"oid": o["oid"], "size": o["size"], "actions": {"upload": {
                        "href": f"{hub.url}/lfs-blobs/{o['oid']}"}}}
                    if o["oid"] not in hub.blobs else {"oid": o["oid"], "size": o["size"]}
                    for o in objects
                ]}}  # fmt: skip
            if self.command == "PUT" and (match := _BLOB.fullmatch(path)):
                if hashlib.sha256(body).hexdigest() != match.group(1):
                    return 400, {"Success": False, "Message": "sha256 mismatch"}
                hub.blobs[match.group(1)] = body
                return 200, {"Code": 200, "Success": True}
            if self.command == "POST" and (match := _COMMIT.fullmatch(path)):
                repo_id = match.group(1)
                if repo_id not in hub.repos:
                    return 404, {"Success": False, "Message": f"model {repo_id} not found"}
                files = hub.files.setdefault(repo_id, {})
                for action in json.loads(body)["actions"]:
                    if action["type"] == "lfs":
                        files[action["path"]] = hub.blobs[action["sha256"]]
                    else:
                        files[action["path"]] = base64.b64decode(action["content"])
                return 200, {"Code": 200, "Success": True, "Data": {"commit": "abc"}}
            return 404, {"Success": False, "Message": f"stand-in has no {self.command} {path}"}

        do_GET = do_POST = do_PUT = do_DELETE = _handle

    return Handler


@contextlib.contextmanager
def serve_standin(users: dict[str, str]):
    """Yields a running :class:`StandinHub` on a free loopback port; stops it on exit."""
    hub = StandinHub(users=dict(users))
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    hub.url = f"http://127.0.0.1:{server.server_port}"
    thread = threading.Thread(target=server.serve_forever, name="standin-hub", daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


__all__ = ["Recorded", "StandinHub", "serve_standin"]
