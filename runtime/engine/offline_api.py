"""SGLang's offline Engine API (generate, generate_stream, async_generate): parse (runtime/request.py), build,
submit, wait, like the server.

A mixin of the runtime Engine: results come back through the in-process sinks of engine/delivery.py. Nothing here
waits for a constraint's compile: admission does (engine/admission.py), and a compile that fails comes back through
submit's on_error and raises its ValueError in the caller.
"""

from __future__ import annotations

import asyncio
from typing import Iterator

from ..messages import GenerateReq
from ..request import RequestError, parse_request
from .delivery import AsyncSink, BatchWaiter, StreamQueue


class OfflineAPI:
    """generate() and friends for an engine with build_request, submit, abort and limits (EngineProtocol)."""

    def _build(self, fields: dict) -> tuple[list[GenerateReq], bool]:
        """The request's engine requests (compiles started) and whether the answer is a list."""
        parsed = parse_request(fields, self.limits.vocab_size, image_limits=self._image_limits())
        if fields.get("stream") and len(parsed.items) > 1:
            raise RequestError("stream=True takes a single prompt and n=1", "stream")
        reqs: list[GenerateReq] = []
        try:
            for inp in parsed.items:
                reqs.append(self.build_request(inp))
        except BaseException:
            self._abort_all(reqs)  # their compiles stop
            raise
        return reqs, parsed.batch

    def _image_limits(self):
        """The engine's image limits with local file paths readable (an in-process caller owns the machine)."""
        import dataclasses

        from ..images import ImageLimits

        return dataclasses.replace(getattr(self, "image_limits", None) or ImageLimits(), allow_paths=True)

    def _abort_all(self, reqs: list[GenerateReq]) -> None:
        for r in reqs:
            self.abort(r.rid)

    def generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                 logprob_start_len=None, top_logprobs_num=None, return_text_in_logprobs=False,
                 rid=None, stream=False, extra_key=None, **fields):
        """Generate for one prompt (dict result) or a list (list of dicts, input order); stream=True yields chunks.

        Any other field of runtime/request.py (ITEM_FIELDS, REQUEST_FIELDS) is taken by name."""
        reqs, is_batch = self._build(dict(
            fields, text=prompt, sampling_params=sampling_params, input_ids=input_ids, return_logprob=return_logprob,
            logprob_start_len=logprob_start_len, top_logprobs_num=top_logprobs_num,
            return_text_in_logprobs=return_text_in_logprobs, rid=rid, stream=stream, extra_key=extra_key))
        if stream:
            sink = StreamQueue()
            self.submit(reqs[0], sink, on_error=sink.fail)
            return self._stream(reqs[0], sink)
        waiter = BatchWaiter([r.rid for r in reqs])
        for r in reqs:
            self.submit(r, waiter, on_error=waiter.fail(r.rid))
        try:
            outs = waiter.results([r.rid for r in reqs])
        except BaseException:
            self._abort_all(reqs)  # a failed compile (raised here, a ValueError) ends the batch's other requests
            raise
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
        fields = dict(kwargs, text=prompt, sampling_params=sampling_params, stream=stream)
        # tokenizing runs off the event loop; compiles run in the engine's worker processes
        reqs, is_batch = await asyncio.get_running_loop().run_in_executor(None, self._build, fields)
        if stream:
            sink = AsyncSink(asyncio.get_running_loop())
            self.submit(reqs[0], sink, on_error=sink.fail)
            return self._astream(reqs[0], sink)
        waiter = BatchWaiter([r.rid for r in reqs])
        for r in reqs:
            self.submit(r, waiter, on_error=waiter.fail(r.rid))
        try:
            outs = await asyncio.gather(*(asyncio.wrap_future(waiter.futures[r.rid]) for r in reqs))
        except BaseException:
            self._abort_all(reqs)  # a cancelled task (or a failed compile) ends the requests it waited for
            raise
        return list(outs) if is_batch else outs[0]

    def _stream(self, req: GenerateReq, sink: StreamQueue) -> Iterator[dict]:
        finished = False
        try:
            while not finished:
                out = sink.get()
                finished = out.finished
                yield out.to_json()
        finally:
            if not finished:
                self.abort(req.rid)  # the consumer stopped early (or the request failed)

    async def _astream(self, req: GenerateReq, sink: AsyncSink):
        finished = False
        try:
            while not finished:
                out = await sink.get()
                finished = out.finished
                yield out.to_json()
        finally:
            if not finished:
                self.abort(req.rid)
