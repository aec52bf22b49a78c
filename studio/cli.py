"""`lockstep`: the TUI by default, `lockstep serve` for the REST API alone."""

from __future__ import annotations

import argparse
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
    serve.add_argument("--api-key", help="require this key as 'Authorization: Bearer KEY' on every request "
                                         "(default: the api.api_key setting or LOCKSTEP_API_KEY; none: open)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "serve":
        return serve(args.host, args.port, args.api_key)
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


def serve(host: str | None, port: int | None, api_key: str | None) -> int:
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

    async def make_app() -> web.Application:
        # The manager's lock and child processes belong to the loop run_app creates.
        return build_app(LoadManager(store), api_key=api_key)

    print(f"lockstep: REST API on http://{host}:{port} (config {store.path})", file=sys.stderr)
    # Cancelling a handler whose client went away is what stops a proxied generation at once.
    web.run_app(make_app(), host=host, port=port, print=None, handler_cancellation=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
