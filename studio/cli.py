"""`lockstep`: the TUI by default, `lockstep serve` for the REST API alone."""

from __future__ import annotations

import argparse
import asyncio
import errno
import signal
import sys

from aiohttp import web

from settings import EnvOverrideError, SettingsStore, apply_env_overrides
from studio.api import DEFAULT_HOST, DEFAULT_PORT, build_app
from studio.manager import LoadManager

DESCRIPTION = """\
Lockstep: a local LLM studio whose engine gives each chat byte-identical output however many
run at once (exact concurrency).

  lockstep          open the terminal UI (models, load, status, chat, settings, logs)
  lockstep serve    run the REST API and the /v1 OpenAI-compatible proxy without the UI

Settings live in the platformdirs config folder (LOCKSTEP_CONFIG_DIR overrides it), logs in the
platformdirs log folder (LOCKSTEP_LOG_DIR). LOCKSTEP_EXACT_CONCURRENCY=auto|off|on outranks every
other exact-concurrency setting; LOCKSTEP_PREEMPT_MODE likewise for the preemption mode.
"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lockstep", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    serve = sub.add_parser(
        "serve", help="run the REST API headless",
        description="Run the studio's REST API (/api/*) and the /v1 proxy to the loaded engine, without the UI. "
                    "Load a model with POST /api/load.")
    serve.add_argument("--host", help=f"address to listen on (default: the api.host setting, {DEFAULT_HOST}); "
                                      "anything other than a loopback address exposes the studio to the network")
    serve.add_argument("--port", type=int, help=f"port to listen on (default: the api.port setting, {DEFAULT_PORT})")
    keys = serve.add_mutually_exclusive_group()
    keys.add_argument("--api-key", help="require this key as 'Authorization: Bearer KEY' on every request "
                                        "(default: the api.api_key setting or LOCKSTEP_API_KEY; none: open); "
                                        "other users can read it in the process list, prefer --api-key-file")
    keys.add_argument("--api-key-file", metavar="PATH", help="read the key from the first line of this file")
    serve.add_argument("--cors-origin", action="append", default=None, metavar="ORIGIN",
                       help="grant CORS to this browser origin, e.g. http://localhost:3000 (repeatable; default: "
                            "the api.cors_origins setting, none)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        key = args.api_key
        if args.api_key_file:
            try:
                with open(args.api_key_file, encoding="utf-8") as f:
                    key = f.readline().strip()
            except (OSError, UnicodeDecodeError) as exc:
                print(f"lockstep: --api-key-file {args.api_key_file}: cannot be read ({exc})", file=sys.stderr)
                return 2
            if not key:
                print(f"lockstep: --api-key-file {args.api_key_file}: the first line is empty", file=sys.stderr)
                return 2
        return serve(args.host, args.port, key, args.cors_origin)
    return run_tui_or_explain()


def run_tui_or_explain() -> int:
    try:
        from studio.tui.app import run_tui
    except ImportError as exc:
        if exc.name is not None and not exc.name.startswith("studio.tui"):
            raise  # a broken dependency of the TUI is a bug to see, not a missing TUI
        print("lockstep: the terminal UI is not available in this build (studio.tui.app is missing).\n"
              "Run `lockstep serve` for the REST API instead.", file=sys.stderr)
        return 2
    result = run_tui()
    return int(result) if isinstance(result, int) else 0


def serve(host: str | None, port: int | None, api_key: str | None, cors_origins: list[str] | None = None) -> int:
    store = SettingsStore()
    for problem in store.problems:
        print(f"lockstep: {problem.message()}", file=sys.stderr)
    try:
        settings, _ = apply_env_overrides(store.settings)
    except EnvOverrideError as exc:
        print(f"lockstep: {exc}", file=sys.stderr)
        return 2
    host = host or settings.api.host
    port = port or settings.api.port
    api_key = api_key if api_key is not None else settings.api.api_key
    origins = cors_origins if cors_origins is not None else settings.api.cors_origins
    return asyncio.run(_serve(store, host, port, api_key, origins))


async def _serve(store: SettingsStore, host: str, port: int, api_key: str | None, origins: list[str]) -> int:
    # The manager's lock and child processes belong to this loop.
    app = build_app(LoadManager(store), api_key=api_key, host=host, cors_origins=origins)
    # Cancelling a handler whose client went away is what stops a proxied generation at once.
    runner = web.AppRunner(app, handler_cancellation=True)
    await runner.setup()
    try:
        await web.TCPSite(runner, host, port).start()
    except OSError as exc:
        await runner.cleanup()
        why = "the address is in use (another lockstep?)" if exc.errno == errno.EADDRINUSE else exc.strerror or exc
        print(f"lockstep: cannot listen on {host}:{port}: {why}", file=sys.stderr)
        return 2
    print(f"lockstep: REST API on http://{host}:{port} (config {store.path})", file=sys.stderr)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()  # stops the engine child
    return 0


if __name__ == "__main__":
    sys.exit(main())
