"""RuntimeEndpoint against a stub HTTP server (no model): the exact SGLang-native requests, streaming,
select with and without /tokenize, templates from /get_model_info, and clear errors."""

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

import sglpy as sgl
from sglpy.backend_http import RuntimeEndpoint, _window_by_text
from sglpy.grammar import DTYPE_REGEX

pytestmark = pytest.mark.timeout(60)

SMOL_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SRT_SAMPLING_KEYS = {"skip_special_tokens", "spaces_between_special_tokens", "max_new_tokens", "min_new_tokens", "n",
                     "stop", "stop_token_ids", "temperature", "top_p", "top_k", "min_p", "frequency_penalty",
                     "presence_penalty", "ignore_eos", "regex", "json_schema"}


class Stub:
    """A scripted server: char-level tokens; prompt logprobs favour the characters in `liked`."""

    def __init__(self, tokenize=True, api_key=None, answer="stub answer", liked="B"):
        self.requests, self.tokenize, self.api_key = [], tokenize, api_key
        self.answer, self.liked, self.fail_generate = answer, liked, None
        self.overloaded, self.retry_after = 0, "0"  # the next N /generate answers: 503 (+ Retry-After unless None)
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def _send(self, code, obj, ctype="application/json"):
                data = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _auth(self):
                if stub.api_key and self.headers.get("Authorization") != f"Bearer {stub.api_key}":
                    self._send(401, {"error": {"message": "bad api key"}})
                    return False
                return True

            def do_GET(self):
                if not self._auth():
                    return
                stub.requests.append(("GET", self.path, None))
                if self.path == "/get_model_info":
                    self._send(200, {"model_path": "stub/SmolLM2-135M-Instruct", "chat_template": SMOL_TEMPLATE,
                                     "special_tokens": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>"}})
                elif self.path == "/get_server_info":
                    self._send(200, {"version": "stub", "max_total_num_tokens": 1000})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self):
                if not self._auth():
                    return
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"null")
                stub.requests.append(("POST", self.path, body))
                if self.path == "/tokenize" and stub.tokenize:
                    texts = body["text"] if isinstance(body["text"], list) else [body["text"]]
                    self._send(200, {"tokens": [[ord(c) for c in t] for t in texts]})
                elif self.path == "/generate":
                    if stub.overloaded:
                        stub.overloaded -= 1
                        data = json.dumps({"error": {"message": "server overloaded"}}).encode()
                        self.send_response(503)
                        if stub.retry_after is not None:
                            self.send_header("Retry-After", stub.retry_after)
                        self.send_header("Content-Length", str(len(data)))
                        self.end_headers()
                        self.wfile.write(data)
                        return
                    if stub.fail_generate:
                        self._send(400, {"error": {"message": stub.fail_generate}})
                        return
                    self._generate(body)
                elif self.path == "/flush_cache":
                    self._send(200, b"Cache flushed.", "text/plain")
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def _one(self, ids, body):
                sp = body.get("sampling_params", {})
                meta = {"id": "r", "prompt_tokens": len(ids), "completion_tokens": 0, "cached_tokens": 0,
                        "finish_reason": {"type": "length", "length": 0}}
                if body.get("return_logprob"):
                    start = body.get("logprob_start_len", -1)
                    start = len(ids) - 1 if start == -1 else start
                    # SGLang's rule: entries from the start position on, the first one without a logprob
                    meta["input_token_logprobs"] = [
                        [None if i == start else (-0.1 if chr(t) in stub.liked else -2.0), t, chr(t)]
                        for i, t in enumerate(ids) if i >= start]
                text = "" if sp.get("max_new_tokens") == 0 else stub.answer
                return {"text": text, "output_ids": [], "meta_info": meta}

            def _generate(self, body):
                if "input_ids" in body:
                    batch = body["input_ids"] if body["input_ids"] and isinstance(body["input_ids"][0], list) \
                        else None
                    items = batch if batch is not None else [body["input_ids"]]
                else:
                    batch = body["text"] if isinstance(body["text"], list) else None
                    items = [[ord(c) for c in t] for t in (batch if batch is not None else [body["text"]])]
                n = body.get("sampling_params", {}).get("n", 1)
                outs = [self._one(ids, body) for ids in items for _ in range(n)]
                if body.get("stream"):
                    self.send_response(200)
                    self.send_header("Content-Type", "text/event-stream")
                    self.end_headers()
                    for k in range(1, len(stub.answer) + 1, 3):
                        chunk = dict(outs[0], text=stub.answer[:k + 2])
                        self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.write(b"data: [DONE]\n\n")
                    return
                self._send(200, outs if (batch is not None or n > 1) else outs[0])

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def posts(self, path="/generate"):
        return [b for m, p, b in self.requests if m == "POST" and p == path]

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    s = Stub()
    yield s
    s.close()


def test_gen_sends_sglang_native_requests(stub):
    ep = RuntimeEndpoint(stub.url)
    assert ep.get_model_name() == "stub/SmolLM2-135M-Instruct"

    @sgl.function
    def prog(s):
        s += "Q: hi\nA:" + sgl.gen("a", max_tokens=7, stop="\n")
        s += " n=" + sgl.gen_int("n", return_logprob=True, logprob_start_len=0)

    st = prog.run(backend=ep, temperature=0.5)
    assert st["a"] == "stub answer"
    st.sync()
    first, second = stub.posts()
    assert first["text"] == "Q: hi\nA:"
    assert set(first["sampling_params"]) == SRT_SAMPLING_KEYS
    assert first["sampling_params"]["max_new_tokens"] == 7 and first["sampling_params"]["temperature"] == 0.5
    assert first["sampling_params"]["stop"] == ["\n", "<|im_end|>"]
    assert "return_logprob" not in first and "stream" not in first
    assert second["text"] == "Q: hi\nA:stub answer n="  # always the whole text so far
    assert second["sampling_params"]["regex"] == DTYPE_REGEX["int"] and second["sampling_params"]["stop"][-2:] == [" ", "\n"]
    assert second["return_logprob"] is True and second["logprob_start_len"] == 0


def test_chat_template_comes_from_the_servers_jinja(stub):
    ep = RuntimeEndpoint(stub.url)
    tpl = ep.get_chat_template()
    assert tpl.get_prefix_and_suffix("user") == ("<|im_start|>user\n", "<|im_end|>\n")
    assert tpl.get_prefix_and_suffix("assistant") == ("<|im_start|>assistant\n", "<|im_end|>\n")
    assert tpl.default_system_prompt == "You are a helpful AI assistant"
    assert tpl.stop_str == ("<|im_end|>",)

    @sgl.function
    def chat(s):
        s += sgl.user("hi") + sgl.assistant(sgl.gen("a", max_tokens=3))

    text = chat.run(backend=ep).text()
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
                    "<|im_start|>assistant\nstub answer<|im_end|>\n")
    assert RuntimeEndpoint(stub.url, chat_template_name="default").get_chat_template().name == "default"


def test_streaming_over_sse(stub):
    ep = RuntimeEndpoint(stub.url)

    @sgl.function
    def prog(s):
        s += "Go:" + sgl.gen("a")

    st = prog.run(backend=ep, stream=True)
    chunks = list(st.text_iter("a"))
    assert "".join(chunks) == "stub answer" == st["a"]
    assert stub.posts()[-1]["stream"] is True


def test_select_uses_tokenize_and_scores_exactly_the_choice_tokens(stub):
    ep = RuntimeEndpoint(stub.url)

    @sgl.function
    def prog(s):
        s += "Pick: " + sgl.select("x", ["AAA", "BB", "ABA"])

    st = prog.run(backend=ep)
    assert st["x"] == "BB"  # the stub favours 'B' tokens
    meta = st.get_meta_info("x")
    assert [[e[2] for e in w] for w in meta["input_token_logprobs"]] == [list("AAA"), list("BB"), list("ABA")]
    cache, batch = stub.posts()
    assert cache == {"input_ids": [ord(c) for c in "Pick: "], "sampling_params": {"max_new_tokens": 0}}
    assert batch["input_ids"] == [[ord(c) for c in "Pick: " + ch] for ch in ["AAA", "BB", "ABA"]]
    assert batch["logprob_start_len"] == len("Pick: ") and batch["return_logprob"] is True


def test_select_without_tokenize_falls_back_to_text_requests():
    stub = Stub(tokenize=False)
    try:
        ep = RuntimeEndpoint(stub.url)

        @sgl.function
        def prog(s):
            s += "Pick: " + sgl.select("x", ["AAA", "BB"], choices_method=sgl.unconditional_likelihood_normalized)

        st = prog.run(backend=ep)
        assert st["x"] == "BB"
        prefix_req, *per_choice, uncond = stub.posts()
        assert prefix_req == {"text": "Pick: ", "sampling_params": {"max_new_tokens": 0}}
        # one single-text request per choice (sglang-router refuses a batch `text: [...]`), sent concurrently
        assert sorted(r["text"] for r in per_choice) == ["Pick: AAA", "Pick: BB"]
        assert all(r["logprob_start_len"] == len("Pick: ") - 2 and r["return_logprob"] for r in per_choice)
        assert uncond["input_ids"] == [[ord(c) for c in "AAA"], [ord(c) for c in "BB"]]
        windows = st.get_meta_info("x")["input_token_logprobs"]
        assert [[e[2] for e in w] for w in windows] == [list("AAA"), list("BB")]
    finally:
        stub.close()


def test_window_by_text_handles_a_merged_first_token():
    entries = [[-1.0, 1, ":"], [-0.5, 2, " Yes"]]
    assert _window_by_text("Answer: ", "Yes", entries) == [[-0.5, 2, " Yes"]]
    entries = [[-1.0, 1, "er"], [-1.0, 2, ":"], [-0.5, 3, " "], [-0.2, 4, "No"]]
    assert _window_by_text("Answer: ", "No", entries) == [[-0.2, 4, "No"]]


def test_fork_sends_a_prefix_hint_and_n_samples(stub):
    ep = RuntimeEndpoint(stub.url)

    @sgl.function
    def prog(s):
        s += "Shared."
        forks = s.fork(2)
        forks += sgl.gen("t", max_tokens=2)
        forks.join()
        s += sgl.gen("many", n=2)

    st = prog.run(backend=ep)
    assert st["t"] == ["stub answer", "stub answer"] and st["many"] == ["stub answer", "stub answer"]
    assert stub.posts()[0] == {"text": "Shared.", "sampling_params": {"max_new_tokens": 0}}


def test_flush_cache_server_info_and_api_key():
    stub = Stub(api_key="secret")
    try:
        with pytest.raises(RuntimeError, match="401"):
            RuntimeEndpoint(stub.url)
        ep = RuntimeEndpoint(stub.url, api_key="secret")
        assert sgl.flush_cache(ep) is True
        assert sgl.get_server_info(ep)["version"] == "stub"
    finally:
        stub.close()


def test_backend_down_and_http_errors_are_clear(stub):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    with pytest.raises(ConnectionError, match="cannot reach the server"):
        RuntimeEndpoint(dead)

    ep = RuntimeEndpoint(stub.url)
    stub.fail_generate = "regex is invalid"

    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a")

    with pytest.warns(RuntimeWarning):
        st = prog.run(backend=ep)
        with pytest.raises(sgl.ProgramError, match="HTTP 400.*regex is invalid"):
            st["a"]
    stub.fail_generate = None
    stub.close()  # the server goes away mid-use
    with pytest.warns(RuntimeWarning):
        st = prog.run(backend=ep)
        with pytest.raises(sgl.ProgramError, match="cannot reach the server"):
            st["a"]


def test_refusals_for_load_are_resent_after_retry_after(stub):
    ep = RuntimeEndpoint(stub.url)

    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("a", max_tokens=4)

    stub.overloaded = 3  # three 503s with Retry-After: 0, then served
    assert prog.run(backend=ep)["a"] == "stub answer"
    assert len(stub.posts()) == 4

    stub.overloaded, stub.retry_after = 1, None  # a 503 without Retry-After is an error at once
    with pytest.warns(RuntimeWarning):
        with pytest.raises(sgl.ProgramError, match="HTTP 503.*overloaded"):
            prog.run(backend=ep)["a"]
    assert stub.overloaded == 0

    stub.overloaded, stub.retry_after = 100, "0"  # the retries are bounded
    with pytest.warns(RuntimeWarning):
        with pytest.raises(sgl.ProgramError, match="HTTP 503"):
            prog.run(backend=ep)["a"]
    assert stub.overloaded == 100 - 1 - ep.client.max_retries


def test_runtime_flag_translation():
    from sglpy.backend_http import _flags

    assert _flags({"max_running_requests": 4, "disable_radix_cache": True, "log_requests": False, "x": None}) == [
        "--max-running-requests", "4", "--disable-radix-cache", "--no-log-requests"]
