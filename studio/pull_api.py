"""POST /api/models/pull: a Hub download streamed as JSON lines of progress (as Ollama's /api/pull does).

The status line is held back until the transfer starts, so an unknown repo or file is a plain 4xx JSON
error; after that each line is a PullProgress, the last one `success` (with the model's catalog id) or
`error`. A client that disconnects stops the transfer (its partial file stays for a resume).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

from aiohttp import web
from platformdirs import user_data_dir

from studio.errors import StudioError
from studio.manager import LoadManager
from studio.pull import PullProgress, pull


def target_folder(manager: LoadManager) -> Path:
    """The first model folder; with none configured, a data folder that is stored as the first one."""
    folders = manager.effective_settings().model_folders
    if folders:
        return Path(folders[0]).expanduser()
    folder = Path(user_data_dir("lockstep")) / "models"
    manager.store.update({"model_folders": [str(folder)]})
    return folder


def model_id(manager: LoadManager, path: str) -> str | None:
    return next((m.id for m in manager.catalog.scan() if m.path == path), None)


def _line(p: PullProgress | dict[str, Any]) -> bytes:
    return (json.dumps(p.as_dict() if isinstance(p, PullProgress) else p) + "\n").encode()


async def stream_pull(request: web.Request, manager: LoadManager, body: Any) -> web.StreamResponse:
    if not isinstance(body, dict) or not isinstance(body.get("repo"), str):
        raise StudioError(400, "invalid_request_error", 'expected {"repo": "owner/name", "file": optional}')
    file = body.get("file")
    if file is not None and not isinstance(file, str):
        raise StudioError(400, "invalid_request_error", "file must be a string (a path inside the repo)")
    queue: asyncio.Queue[PullProgress] = asyncio.Queue()
    folder = await asyncio.to_thread(target_folder, manager)
    task = asyncio.ensure_future(pull(body["repo"], file or None, folder, queue.put_nowait))
    response: web.StreamResponse | None = None
    try:
        while True:
            getter = asyncio.ensure_future(queue.get())
            await asyncio.wait({getter, task}, return_when=asyncio.FIRST_COMPLETED)
            if not getter.done():
                getter.cancel()
                break
            progress = getter.result()
            if progress.status == "listing":
                continue  # nothing said yet: an unknown repo is still a plain 4xx
            if response is None:
                response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
                await response.prepare(request)
            await response.write(_line(progress))
        while not queue.empty():
            progress = queue.get_nowait()
            if response is not None and progress.status != "listing":
                await response.write(_line(progress))
        path = await task  # raises the StudioError of a failed pull
    except StudioError as exc:
        if response is None:
            raise
        await response.write(_line({"status": "error", "error": exc.body()["error"]}))
        await response.write_eof()
        return response
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
    done = {"status": "success", "repo": body["repo"], "path": str(path),
            "model": await asyncio.to_thread(model_id, manager, str(path))}
    if response is None:
        return web.json_response(done)
    await response.write(_line(done))
    await response.write_eof()
    return response
