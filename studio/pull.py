"""Getting a model from the Hugging Face Hub into the first model folder, with byte progress.

`huggingface_hub` does the transfer (HF_ENDPOINT and HF_TOKEN work as users know them). A repo id with
a file name fetches that file (a GGUF); a repo id alone fetches the safetensors model (weights, configs,
tokenizer). huggingface_hub lists the repo and names the URLs and auth headers; the transfer is ours, so
that it resumes: files land in a hidden staging folder (the catalog never lists half a model) as `.part`
files, and a pull started again asks for the bytes after what is there.
"""

from __future__ import annotations

import asyncio
import contextlib
import fnmatch
import os
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from studio.errors import StudioError
from studio.hub_probe import unreachable

# What a safetensors model needs; everything else in a repo (other weight formats, images) is skipped.
MODEL_PATTERNS = ("*.safetensors", "*.safetensors.index.json", "config.json", "generation_config.json",
                  "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                  "chat_template.jinja", "chat_template.json")
STAGING = ".pulling"


class PullCancelled(Exception):
    """The client went away or the studio is quitting."""


@dataclass
class PullProgress:
    repo: str
    status: str = "listing"  # listing, downloading, success, error
    file: str | None = None
    completed: int = 0  # bytes, all files
    total: int = 0
    rate: float = 0.0  # bytes/s since the start of this pull
    eta_s: float | None = None
    path: str | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _endpoint() -> str | None:
    return os.environ.get("HF_ENDPOINT") or None  # read now: huggingface_hub reads it once at import


def _offline(exc: BaseException) -> bool:
    from huggingface_hub.errors import LocalEntryNotFoundError, OfflineModeIsEnabled

    try:  # the HTTP client huggingface_hub is built on: httpx2 in 2.x, httpx in 1.x
        import httpx2 as http
    except ImportError:
        import httpx as http
    kinds = (http.ConnectError, http.TimeoutException, OfflineModeIsEnabled, LocalEntryNotFoundError,
             ConnectionError, TimeoutError, urllib.error.URLError)
    return any(isinstance(e, kinds) for e in (exc, exc.__cause__, exc.__context__) if e is not None)


def hub_error(repo: str, exc: BaseException) -> StudioError:
    from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError

    where = _endpoint() or "https://huggingface.co"
    if isinstance(exc, GatedRepoError):
        return StudioError(403, "pull_forbidden", f"{repo} is gated: accept its terms on the Hub and set HF_TOKEN")
    if isinstance(exc, RepositoryNotFoundError):
        return StudioError(404, "pull_not_found", f"no repository {repo!r} on {where} (or it is private)")
    if isinstance(exc, EntryNotFoundError):
        return StudioError(404, "pull_not_found", f"{repo}: {exc}")
    if isinstance(exc, urllib.error.HTTPError):
        kinds = {401: "pull_forbidden", 403: "pull_forbidden", 404: "pull_not_found"}
        return StudioError(exc.code if exc.code in kinds else 502, kinds.get(exc.code, "pull_failed"),
                           f"{repo}: the Hub answered HTTP {exc.code} for {exc.url}")
    if _offline(exc):
        return hub_unreachable()
    return StudioError(502, "pull_failed", f"{repo}: {type(exc).__name__}: {exc}")


def hub_unreachable() -> StudioError:
    where = _endpoint() or "https://huggingface.co"
    return StudioError(503, "hub_unreachable", f"cannot reach the Hugging Face Hub at {where}: this machine "
                       "looks offline (check the network, a proxy, or HF_ENDPOINT)")


def choose_files(repo: str, listing: list[tuple[str, int]], file: str | None) -> list[tuple[str, int]]:
    """(path, size) to fetch from the repo's file list, or a StudioError naming what is there."""
    if file:
        chosen = [(p, s) for p, s in listing if p == file]
        if not chosen:
            ggufs = ", ".join(p for p, _ in listing if p.endswith(".gguf")) or "none"
            raise StudioError(404, "pull_not_found", f"{repo} has no file {file!r}; its GGUF files: {ggufs}")
        return chosen
    chosen = [(p, s) for p, s in listing if "/" not in p and any(fnmatch.fnmatch(p, g) for g in MODEL_PATTERNS)]
    if not any(p.endswith(".safetensors") for p, _ in chosen):
        ggufs = ", ".join(p for p, _ in listing if p.endswith(".gguf"))
        hint = f"; name one of its GGUF files: {ggufs}" if ggufs else ""
        raise StudioError(400, "pull_no_weights", f"{repo} has no safetensors weights at its top level{hint}")
    return chosen


CHUNK = 1 << 20


def fetch(url: str, headers: dict[str, str], part: Path, size: int, on_bytes: Callable[[int], None],
          cancelled: threading.Event) -> None:
    """Download `url` into `part`, continuing from the bytes already there (an HTTP range request)."""
    have = part.stat().st_size if part.exists() else 0
    if have > size:
        part.unlink()
        have = 0
    if have == size and size:
        on_bytes(have)
        return
    ranged = {**headers, "Range": f"bytes={have}-"} if have else dict(headers)
    with urllib.request.urlopen(urllib.request.Request(url, headers=ranged), timeout=30) as resp:
        if have and resp.status != 206:
            have = 0  # the server sent the whole file: start over
        on_bytes(have)
        with open(part, "ab" if have else "wb") as f:
            while chunk := resp.read(CHUNK):
                if cancelled.is_set():
                    raise PullCancelled()
                f.write(chunk)
                on_bytes(len(chunk))


def pull_blocking(repo: str, file: str | None, folder: Path, report: Callable[[PullProgress], None],
                  cancelled: threading.Event) -> Path:
    """Fetch into `folder`; returns the model's path. Runs in a worker thread."""
    from huggingface_hub import HfApi, hf_hub_url
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import build_hf_headers

    progress = PullProgress(repo)
    report(progress)
    endpoint = _endpoint()
    if unreachable(endpoint or "https://huggingface.co") is not None:
        raise hub_unreachable()  # at once, not after huggingface_hub's ~23 s of retries
    try:
        tree = HfApi(endpoint=endpoint).list_repo_tree(repo, recursive=True)
        entries = {e.path: e for e in tree if isinstance(e, RepoFile)}
        headers = build_hf_headers(library_name="lockstep")
    except StudioError:
        raise
    except Exception as exc:
        raise hub_error(repo, exc) from exc
    files = choose_files(repo, [(p, e.size or 0) for p, e in entries.items()], file)
    name = repo.replace("/", "--")
    staging = folder / STAGING / name
    final = folder / name
    progress.status, progress.total = "downloading", sum(s for _, s in files)
    start = time.monotonic()
    done_before = 0  # bytes of the files already finished in this pull

    def on_bytes(n: int) -> None:
        progress.completed = min(progress.total, progress.completed + n)
        elapsed = max(time.monotonic() - start, 1e-6)
        progress.rate = progress.completed / elapsed
        left = progress.total - progress.completed
        progress.eta_s = left / progress.rate if progress.rate > 0 else None
        report(progress)

    for path, size in files:
        progress.file = path
        # A part file is named for the blob it holds, so a file changed on the Hub starts over.
        part = staging / f"{path}.{(entries[path].blob_id or '')[:12]}.part"
        part.parent.mkdir(parents=True, exist_ok=True)
        try:
            fetch(hf_hub_url(repo, path, endpoint=endpoint), headers, part, size, on_bytes, cancelled)
        except PullCancelled:
            raise
        except Exception as exc:
            raise hub_error(repo, exc) from exc
        if part.stat().st_size != size:
            raise StudioError(502, "pull_failed", f"{repo}: {path} arrived with {part.stat().st_size} of {size} bytes")
        os.replace(part, staging / path)
        done_before += size
        progress.completed = done_before
        report(progress)
    final.mkdir(parents=True, exist_ok=True)
    for path, _ in files:
        target = final / path
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / path, target)
    shutil.rmtree(staging, ignore_errors=True)
    model_path = final / file if file else final
    progress.status, progress.path, progress.file, progress.eta_s = "success", str(model_path), None, 0.0
    report(progress)
    return model_path


async def pull(repo: str, file: str | None, folder: Path, report: Callable[[PullProgress], None]) -> Path:
    """`pull_blocking` in a thread; cancelling this coroutine stops the transfer at its next chunk."""
    if not repo or repo.count("/") != 1 or any(part.strip() != part or not part for part in repo.split("/")):
        raise StudioError(400, "invalid_request_error", f"a Hub repo id looks like 'owner/name', not {repo!r}")
    if file is not None and (file.startswith("/") or ".." in Path(file).parts):
        raise StudioError(400, "invalid_request_error", f"file must be a path inside the repo, not {file!r}")
    loop = asyncio.get_running_loop()
    cancelled = threading.Event()

    def report_in_loop(p: PullProgress) -> None:
        snapshot = PullProgress(**p.as_dict())
        loop.call_soon_threadsafe(report, snapshot)

    task = asyncio.ensure_future(asyncio.to_thread(pull_blocking, repo, file, folder, report_in_loop, cancelled))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        cancelled.set()  # the thread raises PullCancelled at its next chunk; its partial file stays
        with contextlib.suppress(BaseException):
            await task
        raise


def human_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    return f"{n:.1f} GB"


def progress_text(p: PullProgress) -> str:
    """'Pulling owner/name: model.safetensors 12.3 MB / 50.0 MB · 4.1 MB/s · ETA 9 s'."""
    if p.status == "listing":
        return f"Pulling {p.repo}: listing its files…"
    if p.status == "success":
        return f"Pulled {p.repo} into {p.path}"
    if p.status == "error":
        return f"Pull of {p.repo} failed: {p.error}"
    eta = f" · ETA {p.eta_s:.0f} s" if p.eta_s is not None else ""
    return (f"Pulling {p.repo}: {p.file or ''} {human_bytes(p.completed)} / {human_bytes(p.total)} · "
            f"{human_bytes(p.rate)}/s{eta}")
