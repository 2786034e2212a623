"""HTTP plumbing shared by the native and OpenAI routes: errors, auth, body parsing, field checks, SSE."""

from __future__ import annotations

import hmac
import json
import logging
from typing import Callable

from aiohttp import web

from ..messages import EngineError

logger = logging.getLogger("sglpy.server")

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error", 500: "server_error",
               503: "service_unavailable"}


class ApiError(Exception):
    """An HTTP error answered with an OpenAI-style body {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers or {}


def error_body(status: int, message: str, param: str | None = None) -> dict:
    """The OpenAI error object; `code` repeats the HTTP status."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None, headers: dict | None = None):
    """A JSON error response with the OpenAI error body."""
    return web.json_response(error_body(status, message, param), status=status, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler):
    """Turn every failure into a JSON error body; never leak a traceback to the client."""
    try:
        return await handler(request)
    except ApiError as e:
        return error_response(e.status, e.message, e.param, e.headers)
    except EngineError as e:
        return error_response(e.status, e.message)
    except web.HTTPRequestEntityTooLarge as e:
        return error_response(413, f"request body too large: {e.text}")
    except web.HTTPException as e:
        if e.status < 400:
            raise
        return error_response(e.status, f"{e.reason}: {request.method} {request.path}", headers=None)
    except Exception:  # noqa: BLE001
        logger.exception("unhandled error on %s %s", request.method, request.path)
        return error_response(500, "internal server error")


def auth_middleware(api_key: str | None, open_paths: tuple[str, ...] = ("/health",)):
    """Bearer-token check on every path but `open_paths` (constant-time comparison)."""
    expected = f"Bearer {api_key}".encode() if api_key else None

    @web.middleware
    async def middleware(request: web.Request, handler):
        if expected is not None and request.path not in open_paths:
            got = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(got, expected):
                raise ApiError(401, "invalid or missing API key (send 'Authorization: Bearer <key>')")
        return await handler(request)

    return middleware


def _no_constants(name: str):
    raise ValueError(f"{name} is not valid JSON")


async def read_json_object(request: web.Request) -> dict:
    """The request body as a JSON object; 400 for empty/malformed/non-object bodies, 413 for oversized."""
    try:
        body = await request.read()
    except web.HTTPRequestEntityTooLarge as e:
        raise ApiError(413, f"request body too large (limit {request.app['config'].max_request_bytes} bytes)") \
            from e
    if not body.strip():
        raise ApiError(400, "the request body is empty; expected a JSON object")
    try:
        obj = json.loads(body, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError) as e:
        raise ApiError(400, f"malformed JSON body: {e}") from None
    except RecursionError:
        raise ApiError(400, "malformed JSON body: nested too deeply") from None
    if not isinstance(obj, dict):
        raise ApiError(400, f"the request body must be a JSON object, got {type(obj).__name__}")
    return obj


# ---- field checks: predicate + description used in the error message ----
def is_int(v) -> bool:
    """An int that is not a bool."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_num(v) -> bool:
    """An int or float that is not a bool."""
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_bool(v) -> bool:
    """A JSON true/false."""
    return isinstance(v, bool)


def is_str(v) -> bool:
    """A string."""
    return isinstance(v, str)


def is_dict(v) -> bool:
    """A JSON object."""
    return isinstance(v, dict)


def is_int_list(v) -> bool:
    """A list of ints (empty allowed)."""
    return isinstance(v, list) and all(is_int(x) for x in v)


def is_str_list(v) -> bool:
    """A list of strings (empty allowed)."""
    return isinstance(v, list) and all(is_str(x) for x in v)


def one_of(*preds: Callable) -> Callable:
    """A predicate true when any of `preds` is."""
    return lambda v: any(p(v) for p in preds)


def nullable(pred: Callable) -> Callable:
    """`pred`, or None."""
    return lambda v: v is None or pred(v)


def check_fields(obj: dict, spec: dict[str, tuple[Callable, str]], where: str, ignored: tuple = ()) -> None:
    """400 naming the first unknown field or the first field of the wrong type."""
    unknown = sorted(k for k in obj if k not in spec and k not in ignored)
    if unknown:
        raise ApiError(400, f"unknown field(s) in {where}: {unknown}", param=unknown[0])
    for name, (pred, desc) in spec.items():
        if name in obj and not pred(obj[name]):
            raise ApiError(400, f"{where}.{name} must be {desc}, got {json.dumps(obj[name])[:80]}", param=name)


# ---- server-sent events ----
async def start_sse(request: web.Request, rid: str) -> web.StreamResponse:
    """Send the headers of a text/event-stream response."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       "X-Request-Id": rid})
    await resp.prepare(request)
    return resp


async def send_sse(resp: web.StreamResponse, obj) -> None:
    """One `data: <json>` event; `obj` may be the literal string "[DONE]"."""
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    await resp.write(f"data: {data}\n\n".encode())
