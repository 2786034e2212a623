"""SGLang's offline Engine API (generate, generate_stream, async_generate) on top of build_request and submit.

A mixin of the runtime Engine: results come back through the in-process sinks of engine/delivery.py.
"""

from __future__ import annotations

import asyncio
from typing import Iterator

from ..messages import GenerateReq
from .delivery import AsyncSink, BatchWaiter, StreamQueue
from .request_builder import generate_inputs


class OfflineAPI:
    """generate() and friends for an engine with build_request, submit and abort (EngineProtocol)."""

    def generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                 logprob_start_len=None, top_logprobs_num=None, return_text_in_logprobs=False,
                 rid=None, stream=False, extra_key=None):
        """Generate for one prompt (dict result) or a list (list of dicts, input order); stream=True yields chunks."""
        inputs, is_batch = generate_inputs(prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                                           top_logprobs_num, return_text_in_logprobs, rid, extra_key, stream)
        reqs = [self.build_request(i) for i in inputs]
        if stream:
            return self._stream(reqs[0])
        waiter = BatchWaiter([r.rid for r in reqs])
        for r in reqs:
            self.submit(r, waiter)
        outs = waiter.results([r.rid for r in reqs])
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
        names = ("input_ids", "return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs",
                 "rid", "extra_key")
        if set(kwargs) - set(names):
            raise ValueError(f"unknown argument(s) {sorted(set(kwargs) - set(names))}")

        def build():  # tokenizing and grammar compilation run off the event loop
            inputs, is_batch = generate_inputs(prompt, sampling_params, stream=stream, **kwargs)
            return [self.build_request(i) for i in inputs], is_batch

        reqs, is_batch = await asyncio.get_running_loop().run_in_executor(None, build)
        if stream:
            return self._astream(reqs[0])
        waiter = BatchWaiter([r.rid for r in reqs])
        for r in reqs:
            self.submit(r, waiter)
        outs = await asyncio.gather(*(asyncio.wrap_future(waiter.futures[r.rid]) for r in reqs))
        return list(outs) if is_batch else outs[0]

    def _stream(self, req: GenerateReq) -> Iterator[dict]:
        sink = StreamQueue()
        self.submit(req, sink)
        finished = False
        try:
            while not finished:
                out = sink.get()
                finished = out.finished
                yield out.to_json()
        finally:
            if not finished:
                self.abort(req.rid)  # the consumer stopped early

    async def _astream(self, req: GenerateReq):
        sink = AsyncSink(asyncio.get_running_loop())
        self.submit(req, sink)
        finished = False
        try:
            while not finished:
                out = await sink.queue.get()
                finished = out.finished
                yield out.to_json()
        finally:
            if not finished:
                self.abort(req.rid)
