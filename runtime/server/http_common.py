"""HTTP plumbing shared by the native and OpenAI routes: errors, auth, body parsing (valid UTF-8), SSE."""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import re
from urllib.parse import quote

from aiohttp import web

from ..messages import EngineError
from ..request import RequestError

logger = logging.getLogger("sglpy.server")
request_log = logging.getLogger("sglpy.server.requests")

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
               405: "invalid_request_error", 413: "invalid_request_error", 500: "server_error",
               503: "service_unavailable"}


class ApiError(Exception):
    """An HTTP error answered with an OpenAI-style body {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers or {}


@contextlib.contextmanager
def request_errors():
    """The one mapping of a request the parser refused (runtime/request.py) to a 400 naming the field."""
    try:
        yield
    except RequestError as e:
        raise ApiError(400, e.message, param=e.param) from None


async def first_item(gen):
    """The first item of an async generator (EngineError if it ends at once)."""
    try:
        return await anext(gen)
    except StopAsyncIteration:
        raise EngineError(500, "the engine finished the request without output") from None


def request_id_header(rid: str) -> dict:
    """{"X-Request-Id": rid}, percent-encoded when rid has characters a header value cannot carry.

    A client picks the rid (SGLang's `rid` field): a control character in it made aiohttp drop the connection
    after the response was built (found by the fuzz test)."""
    return {"X-Request-Id": rid if _HEADER_SAFE.fullmatch(rid) else quote(rid, safe="")}


_HEADER_SAFE = re.compile(r"[\x20-\x7e]*")  # visible ASCII and space


def error_body(status: int, message: str, param: str | None = None) -> dict:
    """The OpenAI error object; `code` repeats the HTTP status."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": status}}


def error_response(status: int, message: str, param: str | None = None, headers: dict | None = None):
    """A JSON error response with the OpenAI error body."""
    return web.json_response(error_body(status, message, param), status=status, headers=headers)


@web.middleware
async def error_middleware(request: web.Request, handler):
    """Turn every failure into a JSON error body (never a traceback); every 503 carries Retry-After."""
    resp = await _errors_as_json(request, handler)
    if resp.status == 503 and "Retry-After" not in resp.headers and not resp.prepared:
        # an engine death, a restart, a stalled engine: the client may retry, and is told when
        config = request.app.get("config")
        resp.headers["Retry-After"] = str(config.retry_after if config is not None else 1)
    return resp


async def _errors_as_json(request: web.Request, handler):
    try:
        return await handler(request)
    except ApiError as e:
        config = request.app.get("config")
        if e.status != 401 and (config is None or config.log_requests):
            # one line per request refused at the door (engine-side failures are logged by the request log)
            request_log.info("rejected route=%s status=%d param=%s message=%s", request.path, e.status, e.param,
                             " ".join(e.message.split())[:300])
        return error_response(e.status, e.message, e.param, e.headers)
    except EngineError as e:
        return error_response(e.status, e.message,
                              headers=None if e.retry_after is None else {"Retry-After": str(e.retry_after)})
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
    bad = first_bad_string(obj)
    if bad is not None:
        raise ApiError(400, f"{bad} is not valid UTF-8 text (it holds a lone surrogate escape such as \\ud800)",
                       param=bad)
    return obj


def first_bad_string(obj, path: str = "body") -> str | None:
    """The path of the first string (value or key) that is not valid Unicode text (a lone surrogate), else None."""
    stack = [(obj, path)]
    while stack:
        v, p = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                return p
        elif isinstance(v, list):
            stack.extend((x, f"{p}[{i}]") for i, x in enumerate(v) if isinstance(x, (str, list, dict)))
        elif isinstance(v, dict):
            for k, x in v.items():
                try:
                    k.encode("utf-8")
                except UnicodeEncodeError:
                    return f"{p} (a key)"
                if isinstance(x, (str, list, dict)):
                    stack.append((x, f"{p}.{k}"))
    return None


# ---- server-sent events ----
async def start_sse(request: web.Request, rid: str) -> web.StreamResponse:
    """Send the headers of a text/event-stream response."""
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
                                       **request_id_header(rid)})
    await resp.prepare(request)
    return resp


async def send_sse(resp: web.StreamResponse, obj) -> None:
    """One `data: <json>` event; `obj` may be the literal string "[DONE]"."""
    data = obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)
    await resp.write(f"data: {data}\n\n".encode())
