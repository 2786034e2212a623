"""FakeEngine: a model-free EngineProtocol implementation for server tests (fast, deterministic, breakable).

`sglpy serve --engine-factory sglpy.runtime.testing.fake_engine:FakeEngine` serves it. It shares the real
engine's request building, stop rules and output shaping (engine/request_builder.py, stops.py, output.py)
around a byte-level tokenizer, and runs one step loop: every `token_delay` seconds each running request
gets one letter derived from its prompt ids, and each sink gets that step's outputs. It keeps KV
accounting (prompt + output tokens held while a request runs) so tests can check nothing leaks.
Constraints are refused (it cannot enforce them). Special prompts: "__die__" kills the engine process
(os._exit), "__crash__" raises a RuntimeError while building the request, "__stall__" stops the step loop,
"__hang__" blocks the step loop forever while it stays alive (what /health's stall check must catch).
Environment: SGLPY_FAKE_TOKEN_DELAY (s per token), SGLPY_FAKE_ROW_DELAY (s more per step for each running
request: a step slows with the batch, as on a CPU), SGLPY_FAKE_STARTUP_DELAY, SGLPY_FAKE_STARTUP_FAIL,
SGLPY_FAKE_STARTUP_FAIL_IF (a path: starting fails while that file exists, for restart tests).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

from sglpy.runtime.config import CPU_MAX_TOTAL_TOKENS, EngineConfig
from sglpy.runtime.core import FinishReason, OutputSink, Req, TokenLogprob
from sglpy.runtime.engine.output import build_output
from sglpy.runtime.engine.request_trace import RequestTrace
from sglpy.runtime.engine.request_builder import RequestLimits, build_request
from sglpy.runtime.engine.stops import append_text, check_token_stop
from sglpy.runtime.engine.tokenizer_ops import TokenizerOps
from sglpy.runtime.messages import EngineInfo, EngineProgress, GenerateReq, GenerateReqInput, StepOutputs

OFFSET = 4  # ids 0-3 are special; id = byte + 4
EOS_ID = 1


class FakeTokenizer:
    """Byte-level tokenizer with a role-tag chat template."""

    chat_template = ("{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
                     "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    bos_token, eos_token, pad_token, unk_token = None, "</s>", None, None
    bos_token_id, eos_token_id, pad_token_id = None, EOS_ID, None
    all_special_tokens = ["</s>"]

    def __len__(self):
        return 256 + OFFSET

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [b + OFFSET for b in text.encode()]

    def decode(self, ids, skip_special_tokens: bool = False, spaces_between_special_tokens: bool = True) -> str:
        return bytes(i - OFFSET for i in ids if i >= OFFSET).decode(errors="replace")

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True,
                            continue_final_message=False, **kwargs):
        text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages)
        if continue_final_message:
            text = text[:-1]
        elif add_generation_prompt:
            text += "<|assistant|>"
        return text


class FakeEngine:
    """Implements EngineProtocol like sglpy.runtime.engine.Engine, with letters instead of a model."""

    def __init__(self, model=None, **fields):
        self.config = EngineConfig(model=model, **fields)
        time.sleep(float(os.environ.get("SGLPY_FAKE_STARTUP_DELAY", "0")))
        fail_if = os.environ.get("SGLPY_FAKE_STARTUP_FAIL_IF")
        if os.environ.get("SGLPY_FAKE_STARTUP_FAIL") or (fail_if and os.path.exists(fail_if)):
            raise OSError("the fake weights are missing")
        self.model_path = "fake-model"
        self.context_len = self.config.max_context_len or 4096
        self.token_delay = float(os.environ.get("SGLPY_FAKE_TOKEN_DELAY", "0.005"))
        self.row_delay = float(os.environ.get("SGLPY_FAKE_ROW_DELAY", "0"))
        self.tokenizer = FakeTokenizer()
        self.text = TokenizerOps(self.tokenizer)
        self.limits = RequestLimits(len(self.tokenizer), self.context_len, self.config.max_total_tokens or CPU_MAX_TOTAL_TOKENS)
        self._lock = threading.Lock()
        self._running: dict[str, Req] = {}
        self._used = 0  # KV tokens held by running requests
        self._stop = threading.Event()
        self._hang = False
        self._steps, self._last = 0, time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="fake-engine", daemon=True)
        self._thread.start()

    # ---- EngineProtocol ----
    def info(self) -> EngineInfo:
        return EngineInfo(model_path=self.model_path, context_len=self.context_len, vocab_size=len(self.tokenizer),
                          chat_template=self.text.chat_template(), special_tokens=self.text.special_tokens(),
                          supports_constraints=False)

    def build_request(self, inp: GenerateReqInput) -> GenerateReq:
        if inp.text == "__die__":
            os._exit(3)
        if inp.text == "__crash__":
            raise RuntimeError("the fake engine crashed on purpose")
        if inp.text == "__stall__":  # the step loop dies: this request (and any other) would wait forever
            self._stop.set()
            threading.Event().wait()
        if inp.text == "__hang__":
            self._hang = True
        return build_request(inp, self.text, self.limits, compile_guide=None)

    def submit(self, req: GenerateReq, sink: OutputSink,
               on_error: Callable[[Exception], None] | None = None) -> None:  # no constraints here: nothing fails
        r = Req(rid=req.rid, input_ids=req.input_ids, sampling=req.sampling, extra_key=req.extra_key, sink=sink,
                stream=req.stream, trace=RequestTrace(live=req.trace == "live") if req.trace else None,
                logprob=req.logprob)
        if r.logprob.logprob_start_len >= 0:  # every prompt token from the start on is "scored" -1.0 (position 0: null)
            r.input_logprobs = [TokenLogprob(-1.0, t) for t in r.input_ids[max(r.logprob.logprob_start_len, 1):]]
        with self._lock:
            if req.rid in self._running:
                raise ValueError(f"duplicate rid {req.rid}")
            self._running[req.rid] = r
            self._used += len(r.input_ids)

    def abort(self, rid: str) -> None:
        with self._lock:
            r = self._running.get(rid)
            if r is not None and not r.finished:
                r.finish_reason = FinishReason("abort", message="aborted")

    def flush_cache(self) -> bool:
        with self._lock:
            return not self._running

    def get_server_info(self) -> dict:
        with self._lock:
            total = self.config.max_total_tokens or CPU_MAX_TOTAL_TOKENS
            return {"model_path": self.model_path, "max_total_num_tokens": total, "max_context_len": self.context_len,
                    "kv_free": total - self._used, "kv_evictable": 0, "kv_used": self._used,
                    "num_running_reqs": len(self._running), "num_waiting_reqs": 0, "prompt_tokens": 0,
                    "cached_tokens": 0}

    def tokenize(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        return self.text.tokenize(texts, add_special_tokens)

    def detokenize(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        return self.text.detokenize(ids, skip_special_tokens)

    def chat_prompt(self, messages: list[dict], add_generation_prompt: bool = True,
                    continue_final_message: bool = False, template_kwargs: dict | None = None) -> str:
        return self.text.chat_prompt(messages, add_generation_prompt, continue_final_message, template_kwargs)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def progress(self) -> EngineProgress:
        return EngineProgress(self._steps, bool(self._running), time.monotonic() - self._last)

    def shutdown(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    # ---- the step loop ----
    def _loop(self) -> None:
        while not self._stop.wait(self.token_delay + self.row_delay * len(self._running)):
            if self._hang:
                threading.Event().wait()  # alive, never progressing
            self._steps, self._last = self._steps + 1, time.monotonic()
            with self._lock:
                reqs = list(self._running.values())
                for r in reqs:
                    if not r.finished:
                        self._append(r)
                done = [r for r in reqs if r.finished]
                for r in done:
                    del self._running[r.rid]
                    self._used -= len(r.input_ids) + len(r.output_ids)
            by_sink: dict[int, tuple[OutputSink, list]] = {}
            for r in reqs:
                if r.finished or r.stream:
                    by_sink.setdefault(id(r.sink), (r.sink, []))[1].append(build_output(r, self.tokenizer))
            for sink, outs in by_sink.values():
                sink(StepOutputs(outs))

    def _append(self, r: Req) -> None:
        """One fake token: a letter from the prompt ids, then the real stop rules."""
        if r.sampling.max_new_tokens == 0:
            r.finish_reason = FinishReason("length", length=0)
            return
        token = OFFSET + ord("a") + (sum(r.input_ids) + len(r.output_ids)) % 26
        r.output_ids.append(token)
        self._used += 1
        if r.first_token_time is None:
            r.first_token_time = time.perf_counter()
        if r.logprob.return_logprob:
            r.output_logprobs.append(TokenLogprob(-0.5, token, tuple((-0.5 - k, token + k)
                                                                     for k in range(r.logprob.top_logprobs_num))))
        reason = check_token_stop(r, token, {EOS_ID}, self.context_len)
        reason = append_text(r, self.tokenizer.decode([token])) or reason
        if reason is not None:
            r.finish_reason = reason
