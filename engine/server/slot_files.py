"""llama-server's /slots/{id}?action=save|restore|erase: a slot's prompt cache to a file under
--slot-save-path and back (Lockstep's own file format: the tokens and their KV pages, as NumPy arrays)."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import numpy as np
from aiohttp import web

from engine.server.errors import ApiError, bad_request
from engine.server.params import Fields, read_json
from engine.server.state import EngineState, state_of
from engine.slot_state import SlotBusy, erase_slot, read_slot, write_slot

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")


def _path(state: EngineState, f: Fields) -> Path:
    root = getattr(state.opts, "slot_save_path", None)
    if not root:
        raise ApiError(501, "slot save/restore is off; start the engine with --slot-save-path DIR")
    name = f.str("filename")
    if not name or not _NAME.match(name) or ".." in name:
        raise bad_request("'filename' must be a plain file name (letters, digits, '.', '_', '-')")
    return Path(root) / name


def _save(path: Path, tokens: list[int], layers: list[tuple]) -> int:
    arrays = {"tokens": np.asarray(tokens, dtype=np.int64)}
    for i, layer in enumerate(layers):
        for j, a in enumerate(layer):
            arrays[f"l{i}_{j}"] = np.asarray(a)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    return path.stat().st_size


def _load(path: Path, n_layers: int) -> tuple[list[int], list[tuple]]:
    with np.load(path, allow_pickle=False) as z:
        tokens = [int(t) for t in z["tokens"]]
        layers = [tuple(z[k] for k in sorted((k for k in z.files if k.startswith(f"l{i}_")),
                                             key=lambda k: int(k.split("_")[1]))) for i in range(n_layers)]
    return tokens, layers if tokens else []


async def slot_action(request: web.Request) -> web.Response:
    state = state_of(request)
    if not getattr(state.opts, "slots_endpoint", True):
        raise ApiError(501, "This server does not support slots endpoint. Start it with `--slots`")
    try:
        slot_id = int(request.match_info["id_slot"])
    except ValueError:
        raise bad_request("the slot id must be an integer") from None
    if not 0 <= slot_id < state.opts.parallel:
        raise bad_request(f"slot {slot_id} does not exist (there are {state.opts.parallel})")
    action = request.query.get("action", "")
    sched = state.scheduler

    async def on_compute(fn, *args):
        return await asyncio.wrap_future(sched.call(lambda s: fn(s, slot_id, *args)))

    t0 = time.perf_counter()
    try:
        if action == "erase":
            return web.json_response({"id_slot": slot_id, "n_erased": await on_compute(erase_slot)})
        f = Fields(await read_json(request))
        path = _path(state, f)
        if action == "save":
            tokens, layers = await on_compute(read_slot)
            size = await asyncio.to_thread(_save, path, tokens, layers)
            return web.json_response({"id_slot": slot_id, "filename": path.name, "n_saved": len(tokens),
                                      "n_written": size, "timings": {"save_ms": (time.perf_counter() - t0) * 1e3}})
        if action == "restore":
            if not path.is_file():
                raise bad_request(f"'filename': {path.name} does not exist under --slot-save-path")
            try:
                tokens, layers = await asyncio.to_thread(_load, path, len(sched.pool.layers))
            except (OSError, ValueError, KeyError) as e:
                raise bad_request(f"'filename': {path.name} is not a slot file saved by this engine ({e})") from None
            await on_compute(write_slot, tokens, layers)
            return web.json_response({"id_slot": slot_id, "filename": path.name, "n_restored": len(tokens),
                                      "n_read": path.stat().st_size,
                                      "timings": {"restore_ms": (time.perf_counter() - t0) * 1e3}})
    except SlotBusy as e:
        raise bad_request(str(e)) from None
    except MemoryError as e:
        raise ApiError(503, f"cannot restore: {e}") from None
    raise bad_request("'action' must be save, restore or erase")
