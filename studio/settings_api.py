"""What the REST API may not do that the TUI and the command line may.

Without a key, anything that can reach the API is treated as possibly a web page driven by someone
else: it may not make the engine read a file of its choosing (the engine echoes a chat template in
/props), nor change where the studio listens or which browser origins it grants. A non-loopback
address is a decision for the command line or the TUI only, key or not.
"""

from __future__ import annotations

from typing import Any

from settings import LoadRequest, Settings
from studio.errors import StudioError
from studio.flags import file_flags
from studio.guard import is_loopback

_NEED_KEY = "through the REST API this needs a studio started with an API key (lockstep serve --api-key-file)"


def check_load_args(request: LoadRequest, *, keyed: bool) -> None:
    if keyed or not request.extra_args:
        return
    found = file_flags(request.extra_args)
    if found:
        raise StudioError(403, "forbidden_flag", f"extra args may not set {found[0]} here: it makes the engine read "
                          f"a file; {_NEED_KEY}, or set it in the TUI's Load screen")


def check_settings_patch(patch: dict[str, Any], current: Settings, *, keyed: bool) -> None:
    api = patch.get("api")
    if isinstance(api, dict):
        host = api.get("host")
        if isinstance(host, str) and host != current.api.host:
            if not is_loopback(host):
                raise StudioError(403, "forbidden_setting",
                                  f"api.host {host!r} is not a loopback address: exposing the studio to the network "
                                  "is a command-line or TUI decision (lockstep serve --host), never the API's")
            _needs_key(keyed, "api.host", "says where the studio listens")
        if "port" in api and api["port"] != current.api.port:
            _needs_key(keyed, "api.port", "says where the studio listens")
        if "cors_origins" in api and api["cors_origins"] != current.api.cors_origins:
            _needs_key(keyed, "api.cors_origins", "lets web pages read the studio's answers")
    load = patch.get("load")
    if isinstance(load, dict) and isinstance(load.get("extra_args"), list) and not keyed:
        args = load["extra_args"]
        found = file_flags(args)
        if found and args != current.load.extra_args:
            raise StudioError(403, "forbidden_setting", f"load.extra_args may not set {found[0]}: it makes the engine "
                              f"read a file; {_NEED_KEY}, or set it in the TUI's Load screen")


def _needs_key(keyed: bool, name: str, what: str) -> None:
    if not keyed:
        raise StudioError(403, "forbidden_setting", f"{name} {what}; {_NEED_KEY}, "
                          "or change it in the TUI's Settings screen")
