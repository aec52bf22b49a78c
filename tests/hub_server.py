"""A local HTTP server in the Hugging Face Hub's layout, for pull tests (this machine has no internet).

It answers what huggingface_hub asks: the recursive file tree (/api/models/{repo}/tree/{rev}) and
/{repo}/resolve/{rev}/{path} with HEAD and ranged GET, X-Repo-Commit and ETag headers. `hold_after`
bytes into a file the body stops until `release` is set, so a test can interrupt a transfer.
"""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestServer

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class Hub:
    def __init__(self, repos: dict[str, Path]) -> None:
        self.repos = repos  # repo id -> folder holding its files
        self.ranges: list[tuple[str, str | None]] = []  # (path, Range header) of every GET
        self.hold_after: int | None = None
        self.release = asyncio.Event()
        app = web.Application()
        app.router.add_get("/api/models/{owner}/{name}/tree/{rev}", self.tree)
        app.router.add_route("*", "/{owner}/{name}/resolve/{rev}/{path:.+}", self.resolve)
        self.server = TestServer(app)

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    def _folder(self, request: web.Request) -> Path:
        repo = f"{request.match_info['owner']}/{request.match_info['name']}"
        if repo not in self.repos:
            raise web.HTTPNotFound(headers={"X-Error-Code": "RepoNotFound"},
                                   text='{"error": "Repository not found"}', content_type="application/json")
        return self.repos[repo]

    async def tree(self, request: web.Request) -> web.Response:
        folder = self._folder(request)
        files = sorted(p for p in folder.rglob("*") if p.is_file())
        return web.json_response([{"type": "file", "path": str(p.relative_to(folder)), "size": p.stat().st_size,
                                   "oid": hashlib.sha1(str(p).encode()).hexdigest()} for p in files])

    async def resolve(self, request: web.Request) -> web.StreamResponse:
        path = self._folder(request) / request.match_info["path"]
        if not path.is_file():
            raise web.HTTPNotFound(headers={"X-Error-Code": "EntryNotFound"},
                                   text='{"error": "Entry not found"}', content_type="application/json")
        data = path.read_bytes()
        headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"',
                   "Accept-Ranges": "bytes"}
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": str(len(data))})
        rng = request.headers.get("Range")
        self.ranges.append((request.match_info["path"], rng))
        start = int(rng.split("=")[1].split("-")[0]) if rng else 0
        status = 206 if rng else 200
        if rng:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        response = web.StreamResponse(status=status, headers={**headers, "Content-Length": str(len(data) - start)})
        await response.prepare(request)
        body = data[start:]
        if self.hold_after is not None and start < self.hold_after:
            await response.write(body[:self.hold_after - start])
            await self.release.wait()
            body = body[self.hold_after - start:]
        await response.write(body)
        await response.write_eof()
        return response
