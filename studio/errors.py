"""Errors the studio answers with, carrying the HTTP status and error type of the API's JSON body."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from contract.middleware import error_body


class StudioError(Exception):
    def __init__(self, status: int, type_: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_
        self.message = message
        self.extra = extra

    def body(self) -> dict[str, Any]:
        return error_body(self.status, self.message, self.type, self.extra)


def validation_message(exc: ValidationError) -> str:
    """pydantic's errors in one line: `where: what; ...`."""
    return "; ".join(f"{'.'.join(str(p) for p in err['loc']) or 'body'}: {err['msg']}" for err in exc.errors())
