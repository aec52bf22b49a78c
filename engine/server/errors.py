"""The engine's own request errors; their shape, {"error": {"code", "type", "message"}}, is contract.middleware's."""

from __future__ import annotations

from aiohttp import web

from contract.middleware import error_body


class ApiError(Exception):
    def __init__(self, status: int, message: str, type_: str | None = None, close: bool = False,
                 extra: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.extra = status, message, type_, extra
        self.close = close  # the request's body was not read to its end: the connection cannot carry another

    def body(self) -> dict:
        return error_body(self.status, self.message, self.type, self.extra)

    def response(self) -> web.Response:
        response = web.json_response(self.body(), status=self.status)
        if self.close:
            response.force_close()
        return response


def bad_request(message: str) -> ApiError:
    return ApiError(400, message)
