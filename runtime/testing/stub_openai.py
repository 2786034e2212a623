"""A scripted OpenAI-compatible endpoint (chat and legacy completions, non-streaming) for frontend tests and benchmarks.

`StubOpenAI(responder, latency=0.0)` serves `POST /v1/chat/completions` and `POST /v1/completions` on a free
loopback port; `responder(body) -> str` gives each answer's text (the request body as the client sent it), and
the endpoint applies the request's `stop` strings and `max_tokens` (one token per character) to it, as a model
server would. `requests` records every body; `latency` (seconds) is added to every answer, standing in for a
hosted API's round trip. It has no `/get_model_info`, so sgl.OpenAI treats it as a plain OpenAI endpoint.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


def apply_limits(text: str, body: dict) -> tuple[str, str]:
    """(text cut at the first stop string or at max_tokens characters, finish_reason)."""
    stops = body.get("stop") or []
    stops = [stops] if isinstance(stops, str) else stops
    cut = min((p for p in (text.find(s) for s in stops if s) if p != -1), default=-1)
    limit = body.get("max_tokens") or body.get("max_completion_tokens")
    if limit is not None and len(text) > limit and (cut == -1 or cut > limit):
        return text[:limit], "length"
    return (text[:cut] if cut != -1 else text), "stop"


class StubOpenAI:
    """Start on construction; `url` is the `/v1` base URL; `close()` (or a `with` block) stops it."""

    def __init__(self, responder: Callable[[dict], str], latency: float = 0.0):
        self.responder = responder
        self.latency = latency
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
                with stub._lock:
                    stub.requests.append(body)
                if self.path.endswith("/chat/completions"):
                    out = stub._answer(body, chat=True)
                elif self.path.endswith("/completions"):
                    out = stub._answer(body, chat=False)
                else:
                    self.send_error(404)
                    return
                data = json.dumps(out).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self.send_error(404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()

    def _answer(self, body: dict, chat: bool) -> dict:
        if self.latency:
            time.sleep(self.latency)
        text, reason = apply_limits(self.responder(body), body)
        n = int(body.get("n") or 1)  # n samples: the same answer n times
        usage = {"prompt_tokens": 1, "completion_tokens": n * len(text), "total_tokens": 1 + n * len(text)}
        if chat:
            choices = [{"index": i, "message": {"role": "assistant", "content": text}, "finish_reason": reason}
                       for i in range(n)]
            return {"id": "chatcmpl-stub", "object": "chat.completion", "created": 0, "model": body.get("model"),
                    "choices": choices, "usage": usage}
        choices = [{"index": i, "text": text, "logprobs": None, "finish_reason": reason} for i in range(n)]
        return {"id": "cmpl-stub", "object": "text_completion", "created": 0, "model": body.get("model"),
                "choices": choices, "usage": usage}

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
