"""The storm benchmark's traffic: the honest mix (openai client and /generate) and the hostile requests.

Every honest request ends in one `Fate`; every hostile one in a `HostileResult` (status, JSON error body or not,
whether the status was the documented one). benchmarks/storm.py drives both and writes the report.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass

import aiohttp
import openai

HANG_S = 120.0  # an honest request without an answer for this long is counted as hung
FEWSHOT = "".join(f"Q: What is {a} plus {b}?\nA: {a + b}.\n" for a, b in ((2, 3), (7, 5), (10, 4), (6, 6), (9, 1))) * 3
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120}},
          "required": ["name", "age"], "additionalProperties": False}
TOPICS = ("rivers", "mountains", "the sea", "bread", "trains", "owls", "winter", "music", "clocks", "bees")
HONEST_KINDS = ("chat", "chat_stream", "json_schema", "n2", "regex", "select", "fewshot", "generate_stream")


@dataclass
class Fate:
    """What happened to one honest request."""

    kind: str
    phase: str
    t_start: float  # time.monotonic()
    latency: float
    fate: str  # ok | retryable | error (see classify in storm.py)
    status: int | None = None
    detail: str = ""
    ttft: float | None = None  # streams only
    retry_after: str | None = None


@dataclass
class HostileResult:
    kind: str
    status: int | None
    expected: tuple
    json_error: bool  # the body was {"error": {...}} (or the status needs none: 200 for streams left early)
    detail: str = ""
    retry_after: str | None = None

    @property
    def as_documented(self) -> bool:
        """The documented status with a JSON error body; or 503 + Retry-After (the engine restarting, a full queue),
        which any request may get."""
        retryable = self.status == 503 and self.retry_after is not None
        return (self.status in self.expected or retryable) and self.json_error


class Traffic:
    """Shared clients of one storm run: an aiohttp session for /generate and raw calls, an openai client."""

    def __init__(self, url: str, api_key: str, max_tokens: int, rng: random.Random):
        self.url, self.key, self.max_tokens, self.rng = url, api_key, max_tokens, rng
        self.headers = {"Authorization": f"Bearer {api_key}"}
        # an idle pooled connection is dropped after 4 s, before the server's --timeout-keep-alive closes it (a
        # request sent on a connection the server is closing at that instant fails: the client's race, not the server's)
        self.session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=4.0),
                                             timeout=aiohttp.ClientTimeout(total=HANG_S))
        self.oai = openai.AsyncOpenAI(base_url=url + "/v1", api_key=api_key, max_retries=0, timeout=HANG_S)

    async def close(self):
        await self.session.close()
        await self.oai.close()

    # ---- honest ----
    async def honest(self, kind: str, phase: str) -> Fate:
        """Send one honest request of `kind`; never raises."""
        t0 = time.monotonic()
        fate = Fate(kind, phase, t0, 0.0, "ok")
        try:
            await asyncio.wait_for(getattr(self, "_" + kind)(fate), HANG_S)
        except asyncio.TimeoutError:
            fate.fate, fate.detail = "error", f"hung: no answer in {HANG_S:.0f} s"
        except openai.APIStatusError as e:
            fate.status, fate.retry_after = e.status_code, e.response.headers.get("Retry-After")
            fate.fate, fate.detail = "status", str(e.message)[:200]
        except openai.APIError as e:  # an error event inside a stream, or a broken connection
            code = e.body.get("code") if isinstance(e.body, dict) else None
            if isinstance(code, int):  # the stream ended with an error event naming its status
                fate.fate, fate.status, fate.detail = "status", code, f"stream error event: {e.message[:200]}"
            else:
                fate.fate, fate.detail = "error", f"{type(e).__name__}: {str(e)[:200]}"
        except StatusError as e:
            fate.status, fate.retry_after, fate.fate, fate.detail = e.status, e.retry_after, "status", e.text[:200]
        except (aiohttp.ClientError, ValueError, KeyError) as e:
            fate.fate, fate.detail = "error", f"{type(e).__name__}: {str(e)[:200]}"
        fate.latency = time.monotonic() - t0
        return fate

    def _topic(self) -> str:
        return self.rng.choice(TOPICS)

    async def _chat(self, fate: Fate):
        r = await self.oai.chat.completions.create(
            model="default", messages=[{"role": "user", "content": f"Write one sentence about {self._topic()}."}],
            max_tokens=self.max_tokens)
        _need(r.choices[0].finish_reason in ("stop", "length"), f"finish_reason {r.choices[0].finish_reason}")

    async def _chat_stream(self, fate: Fate):
        stream = await self.oai.chat.completions.create(
            model="default", messages=[{"role": "user", "content": f"Tell me about {self._topic()}."}],
            max_tokens=self.max_tokens, stream=True)
        finish = None
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and fate.ttft is None:
                fate.ttft = time.monotonic() - fate.t_start
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
        _need(finish in ("stop", "length"), f"stream ended without its terminal event (finish_reason {finish})")

    async def _json_schema(self, fate: Fate):
        r = await self.oai.chat.completions.create(
            model="default", messages=[{"role": "user", "content": "Invent a person. Answer in JSON."}],
            max_tokens=48, response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": PERSON}})
        c = r.choices[0]
        if c.finish_reason == "stop":
            obj = json.loads(c.message.content)
            _need(set(obj) == {"name", "age"} and isinstance(obj["age"], int), f"not the schema: {obj}")

    async def _n2(self, fate: Fate):
        r = await self.oai.chat.completions.create(
            model="default", messages=[{"role": "user", "content": f"Name a word about {self._topic()}."}],
            max_tokens=8, n=2, temperature=0.8)
        _need(len(r.choices) == 2, f"{len(r.choices)} choices for n=2")

    async def _regex(self, fate: Fate):
        out = await self._generate({"text": f"A phone number for {self._topic()}: ",
                                    "sampling_params": {"max_new_tokens": 12, "regex": r"[0-9]{3}-[0-9]{4}"}})
        _need(len(out["text"]) == 8 and out["text"][3] == "-", f"regex output {out['text']!r}")

    async def _select(self, fate: Fate):
        out = await self._generate({"text": f"Is {self._topic()} nice? Answer: ",
                                    "sampling_params": {"max_new_tokens": 4, "choices": ["yes", "no", "maybe"]}})
        _need(out["text"] in ("yes", "no", "maybe"), f"select output {out['text']!r}")

    async def _fewshot(self, fate: Fate):
        a, b = self.rng.randrange(100), self.rng.randrange(100)
        await self._generate({"text": FEWSHOT + f"Q: What is {a} plus {b}?\nA:",
                              "sampling_params": {"max_new_tokens": 6, "temperature": 0, "stop": "\n"}})

    async def _generate_stream(self, fate: Fate):
        body = {"text": f"Once upon a time, {self._topic()}", "stream": True,
                "sampling_params": {"max_new_tokens": self.max_tokens}}
        async with self.session.post(self.url + "/generate", json=body, headers=self.headers) as resp:
            await _check_status(resp)
            done, last, error = False, None, None
            async for line in resp.content:
                line = line.strip()
                if not line.startswith(b"data: "):
                    continue
                data = line[6:]
                if data == b"[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    error = event["error"]
                    continue
                last = event
                if fate.ttft is None and last.get("text"):
                    fate.ttft = time.monotonic() - fate.t_start
        _need(done, "stream ended without data: [DONE]")
        if error is not None:
            raise StatusError(error.get("code"), f"stream error event: {error.get('message')}", None)
        _need(last is not None and last["meta_info"]["finish_reason"] is not None, "no finish_reason before [DONE]")

    async def _generate(self, body: dict) -> dict:
        async with self.session.post(self.url + "/generate", json=body, headers=self.headers) as resp:
            await _check_status(resp)
            out = await resp.json()
        _need(out["meta_info"]["finish_reason"]["type"] in ("stop", "length"), f"finish {out['meta_info']}")
        return out

    # ---- hostile ----
    async def hostile(self, kind: str) -> HostileResult:
        """One hostile request of `kind` (a key of HOSTILE); never raises."""
        fn, expected = HOSTILE[kind]
        try:
            status, body, retry_after = await asyncio.wait_for(fn(self), HANG_S)
        except asyncio.TimeoutError:
            return HostileResult(kind, None, expected, False, f"no answer in {HANG_S:.0f} s")
        except aiohttp.ClientError as e:
            return HostileResult(kind, None, expected, False, f"{type(e).__name__}: {e}"[:200])
        return HostileResult(kind, status, expected, status == 200 or _is_error_body(body), str(body)[:160],
                             retry_after)

    async def raw(self, method: str, path: str, data: bytes | None = None, headers: dict | None = None,
                  key: bool = True) -> tuple[int, object, str | None]:
        """(status, JSON body or text, Retry-After)."""
        h = {**(self.headers if key else {}), "Content-Type": "application/json", **(headers or {})}
        async with self.session.request(method, self.url + path, data=data, headers=h) as resp:
            text = await resp.text(errors="replace")
            try:
                body = json.loads(text)
            except ValueError:
                body = text[:200]
            return resp.status, body, resp.headers.get("Retry-After")

    async def post_json(self, path: str, obj) -> tuple[int, object, str | None]:
        return await self.raw("POST", path, json.dumps(obj).encode())


class StatusError(Exception):
    def __init__(self, status: int, text: str, retry_after: str | None):
        super().__init__(f"{status}: {text}")
        self.status, self.text, self.retry_after = status, text, retry_after


async def _check_status(resp):
    if resp.status != 200:
        raise StatusError(resp.status, await resp.text(errors="replace"), resp.headers.get("Retry-After"))


def _need(ok: bool, what: str):
    if not ok:
        raise ValueError(what)


def _is_error_body(body) -> bool:
    return isinstance(body, dict) and isinstance(body.get("error"), dict) and "message" in body["error"]


def deep_schema_text(depth: int) -> str:
    """A JSON schema of `depth` nested objects, as text (too deep for Python's own json.dumps)."""
    return '{"type":"object","required":["a"],"properties":{"a":' * depth + '{"type":"string"}' + "}}" * depth


def wide_schema(approx_bytes: int) -> dict:
    n = approx_bytes // 40
    return {"type": "object", "properties": {f"field_{i:07d}": {"type": "integer"} for i in range(n)}}


async def _slow_reader(t: Traffic):
    """Open a long stream and never read it (the server must not block on this client)."""
    body = {"text": "Tell a long story.", "stream": True, "sampling_params": {"max_new_tokens": 512, "ignore_eos": True}}
    reader, writer = await asyncio.open_connection(*_host_port(t.url))
    data = json.dumps(body).encode()
    writer.write(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Authorization: Bearer {t.key}\r\nContent-Length: {len(data)}\r\n\r\n".encode() + data)
    await writer.drain()
    status = int((await reader.readline()).split()[1])  # the status line
    if status != 200:  # an error: read it whole
        head, _, body = (await reader.read(1 << 16)).partition(b"\r\n\r\n")
        writer.close()
        retry = next((line.split(b":", 1)[1].strip().decode() for line in head.split(b"\r\n")
                      if line.lower().startswith(b"retry-after:")), None)
        return status, json.loads(body) if body.startswith(b"{") else body, retry
    await asyncio.sleep(20)  # nothing more is read
    writer.close()
    return status, None, None


async def _disconnect_stream(t: Traffic):
    body = {"text": "Tell a story.", "stream": True, "sampling_params": {"max_new_tokens": 256, "ignore_eos": True}}
    async with t.session.post(t.url + "/generate", json=body, headers=t.headers) as resp:
        if resp.status != 200:
            return resp.status, await resp.json(), resp.headers.get("Retry-After")
        await resp.content.readline()
        resp.close()  # leave mid-stream
    return 200, None, None


async def _disconnect_waiting(t: Traffic):
    body = {"text": "Tell a story.", "sampling_params": {"max_new_tokens": 256, "ignore_eos": True}}
    try:
        async with asyncio.timeout(0.5):
            await t.post_json("/generate", body)
    except TimeoutError:
        pass
    return 200, None, None  # nothing to check here but that the server frees its KV (the report's drain check)


async def _no_key_sweep(t: Traffic):
    """Every route without the key: 401 (the caller checks the per-route list in storm.py)."""
    statuses = {}
    for method, path in ROUTES_NEEDING_KEY:
        statuses[f"{method} {path}"], _, _ = await t.raw(method, path, b"{}", key=False)
    bad = {k: v for k, v in statuses.items() if v != 401}
    return (401 if not bad else 200), ({"error": {"message": "ok"}} if not bad else {"answered": bad}), None


def _host_port(url: str) -> tuple[str, int]:
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    return host, int(port)


def _post(obj_fn):
    async def run(t: Traffic):
        path, obj = obj_fn(t)
        return await t.raw("POST", path, obj if isinstance(obj, bytes) else json.dumps(obj).encode())
    return run


def _letters(t: Traffic) -> str:
    return "".join(t.rng.choice("cdefgh") for _ in range(8))  # a new constraint each time (no compile cache hit)


def _chat(**fields):
    return {"model": "default", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, **fields}


ROUTES_NEEDING_KEY: list[tuple[str, str]] = []  # filled by storm.py from the server's own route table

# kind -> (coroutine(t) -> (status, body), documented statuses)
HOSTILE = {
    "malformed_json": (_post(lambda t: ("/generate", b'{"text": "x", "sampling_params": {')), (400,)),
    "wrong_types": (_post(lambda t: ("/v1/chat/completions", _chat(max_tokens="10"))), (400,)),
    "lone_surrogate": (_post(lambda t: ("/generate", b'{"text": "x\\ud800y"}')), (400,)),
    "huge_max_tokens": (_post(lambda t: ("/v1/chat/completions", _chat(max_tokens=10 ** 12))), (400,)),
    "deep_schema": (_post(lambda t: ("/v1/chat/completions", json.dumps(_chat(response_format={
        "type": "json_schema", "json_schema": {"name": "d", "schema": "SCHEMA"}})).replace(
        '"SCHEMA"', deep_schema_text(1000)).encode())), (400,)),
    "deep_schema_text": (_post(lambda t: ("/generate", {"text": "x", "sampling_params": {
        "max_new_tokens": 8, "json_schema": deep_schema_text(1000)}})), (400,)),
    "big_schema": (_post(lambda t: ("/generate", {"text": "x", "sampling_params": {
        "max_new_tokens": 8, "json_schema": json.dumps(wide_schema(2_000_000))}})), (400,)),
    "10mb_schema": (_post(lambda t: ("/generate", {"text": "x", "sampling_params": {
        "max_new_tokens": 8, "json_schema": json.dumps(wide_schema(10_000_000))}})), (413,)),
    "catastrophic_regex": (_post(lambda t: ("/generate", {"text": "x", "sampling_params": {
        "max_new_tokens": 8, "regex": "(a{0,100}){0,100}(b{0,100}){0,100}" + _letters(t)}})), (400,)),
    "catastrophic_stop_regex": (_post(lambda t: ("/generate", {"text": "x", "sampling_params": {
        "max_new_tokens": 16, "stop_regex": ["(x|x)+z"]}})), (200, 400)),
    "huge_prompt": (_post(lambda t: ("/generate", {"text": "lorem ipsum " * 600_000,
                                                   "sampling_params": {"max_new_tokens": 4}})), (400,)),
    "body_over_limit": (_post(lambda t: ("/generate", b'{"text": "' + b"x" * (9 << 20) + b'"}')), (413,)),
    "path_values": (_post(lambda t: ("/generate", {"text": "x", "lora_path": "/etc/passwd", "sampling_params": {
        "max_new_tokens": 4, "ebnf": "%import etc.passwd (X)\nstart: X"}})), (400,)),
    "model_path_value": (_post(lambda t: ("/v1/chat/completions", _chat(model="../../etc/passwd"))), (200, 400, 404)),
    "slow_reader": (_slow_reader, (200,)),
    "disconnect_stream": (_disconnect_stream, (200,)),
    "disconnect_waiting": (_disconnect_waiting, (200,)),
    "no_api_key": (_no_key_sweep, (401,)),
}
