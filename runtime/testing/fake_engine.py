"""A small fake of the Engine contract (docs/architecture.md) for server tests: fast, deterministic, breakable.

Outputs are letters derived from the prompt ids, one per `token_delay` seconds; it keeps KV accounting
(prompt + output tokens held while a request runs) so tests can check nothing leaks. Special prompts:
"__die__" kills the engine process (os._exit), "__crash__" raises a RuntimeError inside generate.
"""

from __future__ import annotations

import os
import re
import threading
import time

from sglpy.runtime.config import EngineConfig
from sglpy.runtime.sampling_params import SamplingParams

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

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
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
    """Same public surface as sglpy.runtime.engine.Engine; every request runs on its own timer."""

    def __init__(self, model=None, **fields):
        self.config = EngineConfig(model=model, **fields)
        time.sleep(float(os.environ.get("SGLPY_FAKE_STARTUP_DELAY", "0")))
        if os.environ.get("SGLPY_FAKE_STARTUP_FAIL"):
            raise OSError("the fake weights are missing")
        self.model_path = "fake-model"
        self.context_len = self.config.max_context_len or 4096
        self.token_delay = float(os.environ.get("SGLPY_FAKE_TOKEN_DELAY", "0.005"))
        self.tokenizer = FakeTokenizer()
        self._lock = threading.Lock()
        self._used = 0
        self._active: dict[str, bool] = {}  # rid -> abort requested
        self._loop_alive = True

    def generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                 logprob_start_len=-1, top_logprobs_num=0, return_text_in_logprobs=False, rid=None, stream=False):
        if (prompt is None) == (input_ids is None):
            raise ValueError("give exactly one of prompt or input_ids")
        sp = SamplingParams.from_dict(sampling_params)
        if sp.regex is not None:
            try:
                re.compile(sp.regex)
            except re.error as e:
                raise ValueError(f"invalid regex: {e}") from None
        if prompt == "__die__":
            os._exit(3)
        if prompt == "__crash__":
            raise RuntimeError("the fake engine crashed on purpose")
        if prompt == "__stall__":  # the step loop dies: this request (and any other) would wait forever
            self._loop_alive = False
            threading.Event().wait()
        ids = list(input_ids) if input_ids is not None else self.tokenizer.encode(prompt)
        if any(not 0 <= i < len(self.tokenizer) for i in ids):
            raise ValueError("input_ids out of vocabulary range")
        gen = self._run(ids, sp, rid or f"fake-{time.time_ns()}", return_logprob, logprob_start_len,
                        top_logprobs_num, return_text_in_logprobs)
        if stream:
            return gen
        last = None
        for last in gen:
            pass
        return last

    def _triple(self, lp, tid, with_text):
        return [lp, tid, self.tokenizer.decode([tid]) if with_text else None]

    def _run(self, ids, sp, rid, want_lp, lp_start, top_n, with_text):
        t0 = time.perf_counter()
        with self._lock:
            if rid in self._active:
                raise ValueError(f"duplicate rid {rid}")
            self._active[rid] = False
            self._used += len(ids)
        out: list[int] = []
        try:
            finish = {"type": "length", "length": sp.max_new_tokens} if sp.max_new_tokens == 0 else None
            while finish is None:
                time.sleep(self.token_delay)
                with self._lock:
                    aborted = self._active[rid]
                if aborted:
                    finish = {"type": "abort", "message": "aborted"}
                    break
                out.append(OFFSET + ord("a") + (sum(ids) + len(out)) % 26)
                with self._lock:
                    self._used += 1
                text = self.tokenizer.decode(out)
                hit = next((s for s in sp.stop if s in text), None)
                if hit is not None:
                    finish = {"type": "stop", "matched": hit}
                elif len(out) >= sp.max_new_tokens:
                    finish = {"type": "length", "length": sp.max_new_tokens}
                if finish is None:
                    yield self._chunk(rid, ids, out, None, t0, want_lp, lp_start, top_n, with_text, sp)
            yield self._chunk(rid, ids, out, finish, t0, want_lp, lp_start, top_n, with_text, sp)
        finally:
            with self._lock:
                self._used -= len(ids) + len(out)
                self._active.pop(rid, None)

    def _chunk(self, rid, ids, out, finish, t0, want_lp, lp_start, top_n, with_text, sp):
        text = self.tokenizer.decode(out)
        if finish and finish["type"] == "stop" and not sp.no_stop_trim:
            text = text[: text.index(finish["matched"])]
        meta = {"id": rid, "finish_reason": finish, "prompt_tokens": len(ids), "completion_tokens": len(out),
                "cached_tokens": 0, "e2e_latency": time.perf_counter() - t0}
        if want_lp:
            start = 0 if lp_start < 0 else lp_start
            meta["input_token_logprobs"] = [self._triple(None if p == 0 else -1.0, ids[p], with_text)
                                            for p in range(start, len(ids))] if lp_start >= 0 else []
            meta["output_token_logprobs"] = [self._triple(-0.5, t, with_text) for t in out]
            if top_n:
                meta["output_top_logprobs"] = [[self._triple(-0.5 - k, t + k, with_text) for k in range(top_n)]
                                               for t in out]
        return {"text": text, "output_ids": list(out), "meta_info": meta}

    def is_alive(self) -> bool:
        return self._loop_alive

    def abort(self, rid):
        with self._lock:
            if rid in self._active:
                self._active[rid] = True

    def flush_cache(self) -> bool:
        with self._lock:
            return not self._active

    def get_server_info(self) -> dict:
        with self._lock:
            total = self.config.max_total_tokens
            return {"model_path": self.model_path, "max_total_num_tokens": total, "max_context_len": self.context_len,
                    "kv_free": total - self._used, "kv_evictable": 0, "kv_used": self._used,
                    "num_running_reqs": len(self._active), "num_waiting_reqs": 0, "prompt_tokens": 0,
                    "cached_tokens": 0}

    def shutdown(self):
        pass
