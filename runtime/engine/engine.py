"""In-process Engine: one background step loop serving many concurrent callers (threads or asyncio)."""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Any, Iterator

import torch

from ..config import EngineConfig
from ..sampling_params import SamplingParams
from .detokenizer import IncrementalDetokenizer
from .request_builder import RequestSpec, normalize_request
from ..model.loader import resolve_model_path
from ..model.runner import ModelRunner
from .output import build_output
from .processor import OutputProcessor
from ..memory.kv_manager import KVManager
from ..memory.kv_pool import KVPool, ReqToTokenPool
from ..memory.radix_cache import RadixCache
from ..core import FinishReason, Req
from .sampler import Sampler
from .scheduler import Scheduler

logger = logging.getLogger(__name__)


class Engine:
    """Continuous-batching engine. generate() is thread-safe; results use SGLang's /generate shape."""

    def __init__(self, model: str | None = None, **kwargs: Any):
        self.config = EngineConfig.from_kwargs(model=model, **kwargs)
        cfg = self.config
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        from transformers import AutoTokenizer

        self.model_path = resolve_model_path(cfg.model)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.runner = ModelRunner(cfg, self.model_path)
        self.max_context = self.runner.max_context
        r = self.runner
        self.kv = KVManager(KVPool(r.num_layers, cfg.max_total_tokens, r.num_kv_heads, r.head_dim, r.dtype, r.device),
                            ReqToTokenPool(cfg.max_running_requests, self.max_context, r.device),
                            RadixCache(disable=cfg.disable_radix_cache))
        self.scheduler = Scheduler(cfg, self.kv, self.max_context)
        self.eos_ids = self._eos_ids()
        from .constrained import ConstrainedDecoding

        self.constrained = ConstrainedDecoding(self.tokenizer, self.runner.vocab_size, self.eos_ids,
                                               jump_forward=not cfg.disable_jump_forward)
        self.processor = OutputProcessor(Sampler(cfg.seed, self.runner.device), self.eos_ids,
                                         self.max_context, self.constrained)
        self.stats = {"num_requests": 0, "prompt_tokens": 0, "generation_tokens": 0, "cached_tokens": 0,
                      "num_steps": 0, "num_aborted": 0, "step_s": 0.0}
        self._reqs: dict[str, Req] = {}
        self._inbox: queue.Queue = queue.Queue()
        self._stopped = False
        self._thread = threading.Thread(target=self._loop, name="sglpy-engine", daemon=True)
        self._thread.start()

    def _eos_ids(self) -> set[int]:
        ids = set()
        for src in (self.tokenizer.eos_token_id, getattr(self.runner.hf_config, "eos_token_id", None)):
            if isinstance(src, int):
                ids.add(src)
            elif isinstance(src, (list, tuple)):
                ids.update(int(x) for x in src)
        try:
            from transformers import GenerationConfig

            gen = GenerationConfig.from_pretrained(self.model_path).eos_token_id
            ids.update([gen] if isinstance(gen, int) else list(gen or []))
        except (OSError, ValueError):
            pass
        return ids

    # ------------------------------------------------------------------ public API
    def generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                 logprob_start_len=None, top_logprobs_num=None, return_text_in_logprobs=False,
                 rid=None, stream=False, extra_key=None):
        """Generate for one prompt (dict result) or a list (list of dicts, input order); stream=True yields chunks."""
        specs, is_batch = normalize_request(self, prompt, sampling_params, input_ids, return_logprob,
                                            logprob_start_len, top_logprobs_num, return_text_in_logprobs,
                                            rid, extra_key)
        if stream:
            if is_batch:
                raise ValueError("stream=True takes a single prompt, not a list")
            return self._stream(specs[0])
        waits = [self._submit(s, stream=False) for s in specs]
        outs = [w.result() for w in waits]
        return outs if is_batch else outs[0]

    def generate_stream(self, prompt=None, sampling_params=None, **kwargs) -> Iterator[dict]:
        """Yield {"delta": new text, "text": cumulative text, "output_ids", "meta_info"} per step."""
        seen = ""
        for chunk in self.generate(prompt, sampling_params, stream=True, **kwargs):
            delta, seen = chunk["text"][len(seen):], chunk["text"]
            if delta or chunk["meta_info"]["finish_reason"] is not None:
                yield dict(chunk, delta=delta)

    async def async_generate(self, prompt=None, sampling_params=None, stream=False, **kwargs):
        """Asyncio variant of generate(); with stream=True returns an async iterator of chunks."""
        args = [kwargs.pop(k, d) for k, d in (("input_ids", None), ("return_logprob", False),
                                                ("logprob_start_len", None), ("top_logprobs_num", None),
                                                ("return_text_in_logprobs", False), ("rid", None), ("extra_key", None))]
        if kwargs:
            raise ValueError(f"unknown argument(s) {sorted(kwargs)}")
        # tokenizing and grammar compilation run off the event loop
        specs, is_batch = await asyncio.get_running_loop().run_in_executor(
            None, lambda: normalize_request(self, prompt, sampling_params, *args))
        if stream:
            if is_batch:
                raise ValueError("stream=True takes a single prompt, not a list")
            return self._astream(specs[0])
        outs = await asyncio.gather(*(asyncio.wrap_future(self._submit(s, stream=False)) for s in specs))
        return list(outs) if is_batch else outs[0]

    def abort(self, rid: str) -> None:
        """Abort a waiting or running request (its KV is freed); unknown rids are ignored."""
        self._inbox.put(("abort", rid))

    def flush_cache(self) -> bool:
        """Empty the radix cache; refused (False) while any request is waiting or running."""
        return self._call(self._flush)

    def get_server_info(self) -> dict:
        """Config, pool/cache sizes, queue lengths and counters."""
        return self._call(self._info)

    def is_alive(self) -> bool:
        """True while the step loop thread runs (the server's watchdog polls this)."""
        return self._thread.is_alive()

    def shutdown(self) -> None:
        """Abort everything and stop the loop thread."""
        if not self._stopped:
            self._inbox.put(("stop", None))
            self._thread.join(timeout=30)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    # ------------------------------------------------------------------ submission plumbing
    def _make_req(self, spec: RequestSpec, on_output) -> Req:
        req = Req(rid=spec.rid, input_ids=spec.input_ids, sampling=spec.sampling,
                  return_logprob=spec.return_logprob, logprob_start_len=spec.logprob_start_len,
                  top_logprobs_num=spec.top_logprobs_num, return_text_in_logprobs=spec.return_text_in_logprobs,
                  extra_key=spec.extra_key, on_output=on_output)
        s = spec.sampling
        req.detok = IncrementalDetokenizer(self.tokenizer, spec.input_ids, s.skip_special_tokens,
                                           s.spaces_between_special_tokens)
        if spec.guide is not None:
            self.constrained.attach(req, spec.guide)
        return req

    def _submit(self, spec: RequestSpec, stream: bool) -> Future:
        fut: Future = Future()

        def on_output(req: Req, finished: bool) -> None:
            if finished and not fut.done():
                fut.set_result(build_output(req, self.tokenizer))

        self._inbox.put(("add", self._make_req(spec, on_output)))
        return fut

    def _stream(self, spec: RequestSpec) -> Iterator[dict]:
        q: queue.Queue = queue.Queue()
        req = self._make_req(spec, lambda r, fin: q.put((build_output(r, self.tokenizer), fin)))
        self._inbox.put(("add", req))
        try:
            while True:
                out, fin = q.get()
                yield out
                if fin:
                    return
        finally:
            if not req.finished:
                self.abort(req.rid)  # the consumer stopped early

    async def _astream(self, spec: RequestSpec):
        loop = asyncio.get_running_loop()
        q: asyncio.Queue = asyncio.Queue()
        req = self._make_req(spec, lambda r, fin: loop.call_soon_threadsafe(
            q.put_nowait, (build_output(r, self.tokenizer), fin)))
        self._inbox.put(("add", req))
        try:
            while True:
                out, fin = await q.get()
                yield out
                if fin:
                    return
        finally:
            if not req.finished:
                self.abort(req.rid)

    def _call(self, fn):
        if threading.current_thread() is self._thread:
            return fn()
        fut: Future = Future()
        self._inbox.put(("call", (fn, fut)))
        return fut.result()

    # ------------------------------------------------------------------ the loop (engine thread only)
    def _loop(self) -> None:
        while True:
            block = not self.scheduler.has_work()
            try:
                msg = self._inbox.get(block=block)
            except queue.Empty:
                msg = None
            while msg is not None:
                if msg[0] == "stop":
                    self._abort_all("engine shut down")
                    self._stopped = True
                    return
                self._handle(msg)
                try:
                    msg = self._inbox.get_nowait()
                except queue.Empty:
                    msg = None
            if self.scheduler.has_work():
                self.step()

    def _handle(self, msg) -> None:
        kind, payload = msg
        if kind == "add":
            req = payload
            self._reqs[req.rid] = req
            self.stats["num_requests"] += 1
            self.scheduler.add(req)
        elif kind == "abort":
            req = self._reqs.get(payload)
            if req is not None and not req.finished:
                req.finish_reason = FinishReason("abort", message="aborted by the client")
                self._emit_finished([req])
        elif kind == "call":
            fn, fut = payload
            try:
                fut.set_result(fn())
            except Exception as e:  # noqa: BLE001 - delivered to the caller
                fut.set_exception(e)

    def step(self) -> None:
        """One scheduling round: schedule -> forward -> postprocess -> emit."""
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        if batch is None:
            return
        finished = list(batch.aborted)
        if batch.entries:
            try:
                out = self.runner.forward(batch.entries, batch.num_decode, self.kv.buffers)
                finished += self.processor.process(batch.entries, out)
                finished += self.constrained.jump_forward([e.req for e in batch.entries], self.kv)
            except Exception as e:  # noqa: BLE001 - one bad batch must not kill the engine
                logger.exception("step failed; aborting its requests")
                for entry in batch.entries:
                    if not entry.req.finished:
                        entry.req.finish_reason = FinishReason("abort", message=f"internal error: {e}")
                        finished.append(entry.req)
            self.stats["num_steps"] += 1
            self.stats["step_s"] += time.perf_counter() - t0
        self._emit_finished(finished)
        for e in batch.entries[batch.num_decode:]:
            # publish prompt KV for sharing; output KV stays request-owned so jump-forward can roll it back
            if not e.req.finished and e.prefix_len < len(e.req.input_ids):
                self.scheduler.cache_unfinished(e.req)
        for e in batch.entries:
            r = e.req
            if not r.finished and r.on_output is not None and e.prefix_len + e.extend_len >= len(r.input_ids):
                r.on_output(r, False)
        if self.config.debug_invariants:
            self.scheduler.check_invariants()

    def _emit_finished(self, reqs: list[Req]) -> None:
        for r in reqs:
            self.scheduler.remove(r)
            self._reqs.pop(r.rid, None)
            if r.finish_reason.type == "abort":
                self.stats["num_aborted"] += 1
            self.stats["prompt_tokens"] += len(r.input_ids)
            self.stats["generation_tokens"] += len(r.output_ids)
            self.stats["cached_tokens"] += r.cached_tokens
            if r.on_output is not None:
                r.on_output(r, True)

    def _abort_all(self, message: str) -> None:
        reqs = list(self.scheduler.waiting) + list(self.scheduler.running)
        for r in reqs:
            r.finish_reason = FinishReason("abort", message=message)
        self._emit_finished(reqs)

    def _flush(self) -> bool:
        if self.scheduler.has_work():
            return False
        self.kv.flush()
        return True

    def _info(self) -> dict:
        kv = self.kv.stats()
        info = {k: getattr(self.config, k) for k in self.config.__dataclass_fields__}
        info.update({
            "model_path": self.model_path,
            "max_total_num_tokens": kv.total,
            "max_context_len": self.max_context,
            "kv_free": kv.free,
            "kv_evictable": kv.evictable,
            "kv_protected": kv.protected,
            "kv_used": kv.used,
            "num_running_reqs": len(self.scheduler.running),
            "num_waiting_reqs": len(self.scheduler.waiting),
            "total_retractions": self.scheduler.total_retractions,
            "time": time.time(),
        })
        info.update(self.stats)
        info["grammar"] = dict(self.constrained.stats)
        return info
