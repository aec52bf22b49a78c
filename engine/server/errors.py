"""Errors as llama-server and OpenAI clients expect them: {"error": {"code", "type", "message"}}."""

from __future__ import annotations

from aiohttp import web

TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "invalid_request_error",
    413: "invalid_request_error",
    500: "server_error",
    501: "not_supported_error",
    503: "unavailable_error",
}


def error_body(status: int, message: str, type_: str | None = None, extra: dict | None = None) -> dict:
    return {"error": {"code": status, "type": type_ or TYPES.get(status, "server_error"), "message": message,
                      **(extra or {})}}


def error_response(status: int, message: str, type_: str | None = None) -> web.Response:
    return web.json_response(error_body(status, message, type_), status=status)


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
