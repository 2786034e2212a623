"""HTTP backends: RuntimeEndpoint (SGLang-native /generate, as SGLang's frontend sends it) and Runtime."""

from __future__ import annotations

import atexit
import base64
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator, Optional

from .backend_base import (
    BaseBackend,
    ChoiceScore,
    GenResult,
    StreamChunk,
    mean_logprob,
    plan_scoring,
    scores_from_logprobs,
)
from .backend_engine import check_output
from .chat_template import ChatTemplate, from_jinja, get_chat_template, get_chat_template_by_model_path
from .nodes import GenParams, SamplingParams

# The sampling_params keys SGLang's frontend always sends (RuntimeEndpoint); any other SamplingParams field
# is sent only when it differs from its default (e.g. stop_regex), so an SGLang server sees its usual body.
SGLANG_FRONTEND_KEYS = ("skip_special_tokens", "spaces_between_special_tokens", "max_new_tokens", "min_new_tokens",
                        "n", "stop", "stop_token_ids", "temperature", "top_p", "top_k", "min_p",
                        "frequency_penalty", "presence_penalty", "ignore_eos", "regex", "json_schema")


def wire_sampling_params(sp: SamplingParams) -> dict:
    """The /generate `sampling_params` object for `sp`: SGLang's frontend keys plus every field set otherwise."""
    default = SamplingParams().to_dict()
    return {k: v for k, v in sp.to_dict().items() if k in SGLANG_FRONTEND_KEYS or v != default[k]}


class HttpClient:
    """Minimal JSON-over-HTTP client (stdlib) with Bearer auth, timeouts and clear errors."""

    def __init__(self, base_url: str, api_key: Optional[str] = None, timeout: float = 600.0,
                 max_retries: int = 8):
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries  # 503/429 answers with Retry-After: the server did not start the request

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        deadline = time.monotonic() + self.timeout
        for attempt in range(self.max_retries + 1):
            req = urllib.request.Request(self.base_url + path, data=data, headers=headers, method=method)
            try:
                return urllib.request.urlopen(req, timeout=self.timeout)
            except urllib.error.HTTPError as e:
                detail = e.read().decode(errors="replace")[:2000]
                wait = _retry_after(e)
                # a refusal for load (or a restarting engine) names when to come back: honour it, as the openai
                # client does, while the retries and the request's timeout last
                if wait is not None and attempt < self.max_retries and time.monotonic() + wait < deadline:
                    time.sleep(wait)
                    continue
                raise RuntimeError(f"{method} {path} failed with HTTP {e.code}: {detail}") from None
            except (urllib.error.URLError, ConnectionError, socket.timeout) as e:
                reason = getattr(e, "reason", e)
                raise ConnectionError(f"cannot reach the server at {self.base_url} ({method} {path}): {reason}") \
                    from None
        raise AssertionError("unreachable: the last attempt returns or raises")

    def get(self, path: str) -> Any:
        """GET and decode JSON (or return text)."""
        with self._request("GET", path) as r:
            return _decode(r.read())

    def post(self, path: str, body: Any) -> Any:
        """POST JSON and decode the JSON answer (or return text)."""
        with self._request("POST", path, body) as r:
            return _decode(r.read())

    def stream(self, path: str, body: Any) -> Iterator[dict]:
        """POST and yield each SSE `data:` JSON object until `data: [DONE]`."""
        with self._request("POST", path, body) as r:
            for raw in r:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    return
                obj = json.loads(payload)
                if isinstance(obj, dict) and "error" in obj:
                    err = obj["error"]
                    raise RuntimeError(f"stream error: {err.get('message', err) if isinstance(err, dict) else err}")
                yield obj


def _retry_after(e: urllib.error.HTTPError) -> Optional[float]:
    """Seconds to wait before resending a request refused with 503/429 + Retry-After (None: do not resend)."""
    if e.code not in (429, 503):
        return None
    try:
        return min(max(float(e.headers.get("Retry-After", "")), 0.0), 60.0)
    except ValueError:
        return None


def _decode(raw: bytes) -> Any:
    text = raw.decode(errors="replace")
    try:
        return json.loads(text)
    except ValueError:
        return text


class RuntimeEndpoint(BaseBackend):
    """Talks to an sglpy (or SGLang) server's native API; fails fast if the server is down."""

    supports_concate_and_append = False  # join(concate_and_append) is done at text level by the interpreter

    def __init__(self, base_url: str, api_key: Optional[str] = None, verify: Any = None,
                 chat_template_name: Optional[str] = None, timeout: float = 600.0):
        self.base_url = base_url.rstrip("/")
        self.client = HttpClient(self.base_url, api_key, timeout)
        self.model_info = self.client.get("/get_model_info")
        if not isinstance(self.model_info, dict):
            raise RuntimeError(f"{self.base_url}/get_model_info did not return JSON: {self.model_info!r}"[:300])
        self.chat_template = self._pick_template(chat_template_name)
        self._has_tokenize: Optional[bool] = None

    def _pick_template(self, name: Optional[str]) -> ChatTemplate:
        if name:
            return get_chat_template(name)
        jinja = self.model_info.get("chat_template")
        special = self.model_info.get("special_tokens") or {}
        if isinstance(jinja, str) and jinja:
            try:
                return from_jinja(jinja, bos_token=special.get("bos_token") or "",
                                  eos_token=special.get("eos_token") or "", name=self.get_model_name())
            except Exception:  # an unusual template: fall back to name matching, like SGLang
                pass
        return get_chat_template_by_model_path(self.get_model_name())

    def get_model_name(self) -> str:
        """The served model path."""
        return str(self.model_info.get("model_path") or "")

    def get_chat_template(self) -> ChatTemplate:
        return self.chat_template

    def image_placeholder(self) -> str:
        """The served vision model's image placeholder (from /get_model_info); a text-only server refuses."""
        placeholder = self.model_info.get("image_placeholder")
        if not placeholder:
            raise ValueError(f"sgl.image needs a vision model; the server at {self.base_url} serves "
                             f"{self.get_model_name() or 'a model'} without images")
        return placeholder

    # ------------------------------------------------------------ generation

    def _gen_body(self, text: str, params: GenParams, images=()) -> dict:
        body = {"text": text, "sampling_params": wire_sampling_params(params.sampling), **params.request_fields()}
        return _with_images(body, images)

    def generate(self, text: str, params: GenParams, images=()) -> GenResult:
        out = self.client.post("/generate", self._gen_body(text, params, images))
        outs = out if isinstance(out, list) else [out]  # n > 1 returns one object per sample
        for o in outs:
            if not isinstance(o, dict) or "text" not in o:
                raise RuntimeError(f"unexpected /generate response: {o!r}"[:300])
            check_output(o)
        return GenResult(outs[0]["text"], outs[0].get("meta_info", {}), tuple(o["text"] for o in outs))

    def generate_stream(self, text: str, params: GenParams, images=()) -> Iterator[StreamChunk]:
        body = self._gen_body(text, params, images)
        body["stream"] = True
        pos = 0
        for obj in self.client.stream("/generate", body):
            check_output(obj)
            delta, pos = obj["text"][pos:], len(obj["text"])
            yield StreamChunk(delta, obj.get("meta_info", {}))

    # ------------------------------------------------------------ select

    def _tokenize_many(self, texts: list[str]) -> Optional[list[list[int]]]:
        """Token ids via POST /tokenize (None when the server has no usable route)."""
        if self._has_tokenize is False:
            return None
        try:
            out = self.client.post("/tokenize", {"text": texts, "add_special_tokens": True})
        except RuntimeError:
            self._has_tokenize = False
            return None
        tokens = out.get("tokens") if isinstance(out, dict) else None
        if not (isinstance(tokens, list) and len(tokens) == len(texts) and all(isinstance(t, list) for t in tokens)):
            self._has_tokenize = False
            return None
        self._has_tokenize = True
        return tokens

    def _prompt_metas(self, input_ids: list[list[int]], start: int, images=()) -> list[dict]:
        body = {"input_ids": input_ids, "sampling_params": {"max_new_tokens": 0, "temperature": 0},
                "return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": start}
        if images:
            body["image_data"] = [_b64(images)] * len(input_ids)
        out = self.client.post("/generate", body)
        return [check_output(o)["meta_info"] for o in out]

    def _prompt_logprobs(self, input_ids: list[list[int]], start: int) -> list[list]:
        return [m["input_token_logprobs"] for m in self._prompt_metas(input_ids, start)]

    def score_choices(self, prefix: str, choices: list[str], need_unconditional: bool,
                      images=()) -> list[ChoiceScore]:
        texts = [prefix] + [prefix + c for c in choices]
        ids = self._tokenize_many(texts)
        if ids is None and images:
            raise ValueError("select after sgl.image needs a server with /tokenize (sglpy serve)")
        if ids is None:
            return self._score_by_text(prefix, choices, need_unconditional)
        table = dict(zip(texts, ids))
        plan = plan_scoring(lambda t: table[t] if t else [], prefix, choices)
        start = plan.logprob_start_len
        if plan.shared_prefix_len > 0 and not images:  # prefill the shared prefix once: the choices hit the cache
            self.client.post("/generate", {"input_ids": plan.prefix_ids[:plan.shared_prefix_len],
                                           "sampling_params": {"max_new_tokens": 0}})
        elif images:  # the whole prefix with its images (the choices then share its image tokens)
            self.client.post("/generate", _with_images({"text": prefix, "sampling_params": {"max_new_tokens": 0}},
                                                       images))
        metas = self._prompt_metas(plan.full_ids, start, images)
        uncond = None
        if need_unconditional:
            uncond = self._prompt_logprobs([f[s:] for f, s in zip(plan.full_ids, plan.window_starts)], 0)
        return scores_from_logprobs(plan, [m["input_token_logprobs"] for m in metas], start, uncond,
                                    [m.get("cached_tokens") for m in metas])

    def _score_by_text(self, prefix: str, choices: list[str], need_unconditional: bool) -> list[ChoiceScore]:
        """Servers without /tokenize (SGLang's server, sglang-router): score text, locate the window by token texts.

        One request per choice, sent together: sglang-router refuses a batch `text: [...]` (422) and has no
        /tokenize route, and under its cache_aware policy each choice follows the prefix to its worker."""
        res = self.client.post("/generate", {"text": prefix, "sampling_params": {"max_new_tokens": 0}})
        start = max(check_output(res)["meta_info"]["prompt_tokens"] - 2, 0)
        bodies = [{"text": prefix + c, "sampling_params": {"max_new_tokens": 0, "temperature": 0},
                   "return_logprob": True, "return_text_in_logprobs": True, "logprob_start_len": start}
                  for c in choices]
        with ThreadPoolExecutor(max_workers=min(len(bodies), 16)) as pool:
            out = list(pool.map(lambda body: self.client.post("/generate", body), bodies))
        windows = []
        for c, o in zip(choices, out):
            entries = check_output(o)["meta_info"]["input_token_logprobs"]
            windows.append(_window_by_text(prefix, c, entries))
        uncond = None
        if need_unconditional:
            uncond = self._prompt_logprobs([[e[1] for e in w] for w in windows], 0)
        return [ChoiceScore(w, mean_logprob(w), uncond[i] if uncond else None) for i, w in enumerate(windows)]

    # ------------------------------------------------------------ misc

    def cache_prefix(self, text: str, images=()) -> None:
        if text:
            check_output(self.client.post("/generate", _with_images({"text": text, "sampling_params":
                                                                     {"max_new_tokens": 0}}, images)))

    def flush_cache(self) -> bool:
        try:
            self.client.post("/flush_cache", {})
        except RuntimeError:
            return False
        return True

    def get_server_info(self) -> dict:
        return self.client.get("/get_server_info")


def _b64(images) -> list[str]:
    """A program's images (encoded bytes) as the base64 strings /generate's image_data takes."""
    return [base64.b64encode(b).decode("ascii") for b in images]


def _with_images(body: dict, images) -> dict:
    """A /generate body with the program's images (none: unchanged, so a text-only server sees no new field)."""
    return {**body, "image_data": _b64(images)} if images else body


def _window_by_text(prefix: str, choice: str, entries: list) -> list:
    """Entries whose token text reaches past the end of `prefix` (the tokens carrying the choice)."""
    texts = [e[2] or "" for e in entries]
    full, joined = prefix + choice, "".join(texts)
    if full.endswith(joined):
        pos = len(full) - len(joined)
        for i, t in enumerate(texts):
            if pos + len(t) > len(prefix):
                return [list(e) for e in entries[i:]]
            pos += len(t)
    # Token texts do not line up with the string: drop a leading token that the prefix ends with.
    if entries and texts[0] and prefix.endswith(texts[0]):
        entries = entries[1:]
    return [list(e) for e in entries]


# ---------------------------------------------------------------- Runtime: our server as a subprocess


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _flags(server_args: dict) -> list[str]:
    out = []
    for key, value in server_args.items():
        if value is None:
            continue
        flag = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out.append(flag if value else "--no-" + key.replace("_", "-"))
        else:
            out += [flag, str(value)]
    return out


class Runtime:
    """Start `python -m sglpy.runtime.server` on a free port; `.endpoint` is its RuntimeEndpoint."""

    def __init__(self, model_path: Optional[str] = None, *, launch_timeout: float = 300.0,
                 api_key: Optional[str] = None, **server_args):
        port = server_args.pop("port", None)
        self.port = int(port) if port else _free_port()
        host = server_args.pop("host", "127.0.0.1")
        model = server_args.pop("model", None) or model_path
        if model is not None:
            server_args["model"] = model
        if api_key:
            server_args["api_key"] = api_key
        self.url = f"http://{host}:{self.port}"
        cmd = [sys.executable, "-m", "sglpy.runtime.server", "--host", host, "--port", str(self.port),
               *_flags(server_args)]
        self.log_file = tempfile.NamedTemporaryFile(prefix="sglpy-runtime-", suffix=".log", delete=False)
        self.process = subprocess.Popen(cmd, stdout=self.log_file, stderr=subprocess.STDOUT,
                                        env={**os.environ, "PYTHONUNBUFFERED": "1"})
        atexit.register(self.shutdown)
        self._wait_ready(launch_timeout)
        self.endpoint = RuntimeEndpoint(self.url, api_key=api_key)

    def _log_tail(self) -> str:
        try:
            with open(self.log_file.name, errors="replace") as f:
                return f.read()[-3000:]
        except OSError:
            return ""

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the sglpy server exited with code {self.process.returncode} during startup:\n"
                                   f"{self._log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, socket.timeout):
                pass
            time.sleep(0.5)
        self.shutdown()
        raise TimeoutError(f"the sglpy server at {self.url} was not ready after {timeout}s:\n{self._log_tail()}")

    def shutdown(self) -> None:
        """Stop the server process (terminate, then kill)."""
        proc = getattr(self, "process", None)
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)

    def generate(self, prompt: str, sampling_params: Optional[dict] = None, return_logprob: bool = False,
                 logprob_start_len: Optional[int] = None, top_logprobs_num: Optional[int] = None) -> str:
        """POST /generate and return the JSON answer as a string (SGLang's Runtime.generate)."""
        body = {"text": prompt, "sampling_params": sampling_params or {}, "return_logprob": return_logprob}
        if logprob_start_len is not None:
            body["logprob_start_len"] = logprob_start_len
        if top_logprobs_num is not None:
            body["top_logprobs_num"] = top_logprobs_num
        return json.dumps(self.endpoint.client.post("/generate", body))

    def cache_prefix(self, prefix: str) -> None:
        self.endpoint.cache_prefix(prefix)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    def __del__(self):
        try:
            self.shutdown()
        except Exception:
            pass
