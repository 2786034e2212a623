"""SGLang's offline Engine API (generate, generate_stream, async_generate) on top of build_request and submit.

A mixin of the runtime Engine: results come back through the in-process sinks of engine/delivery.py.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from typing import Iterator

from ..messages import GenerateReq, ReqOutput, StepOutputs
from .delivery import AsyncSink, BatchWaiter, StreamQueue
from .output import aborted_output
from .request_builder import generate_inputs


def _cancelled(req: GenerateReq) -> ReqOutput:
    return aborted_output(req.rid, len(req.input_ids), "aborted by the client while its constraint compiled")


def wait_guides(reqs: list[GenerateReq]) -> list[ReqOutput | None]:
    """Wait for the requests' compiles in this thread; a final abort output for each compile that was cancelled.

    A failed compile raises its GrammarError (a ValueError) after cancelling the batch's other compiles.
    """
    done: list[ReqOutput | None] = []
    try:
        for r in reqs:
            try:
                if r.guide is not None:
                    r.guide.result()
                done.append(None)
            except concurrent.futures.CancelledError:
                done.append(_cancelled(r))
    except BaseException:
        for r in reqs:
            if r.guide is not None:
                r.guide.cancel()
        raise
    return done


async def async_wait_guides(reqs: list[GenerateReq]) -> list[ReqOutput | None]:
    """wait_guides for an event loop: cancelling the awaiting task cancels the compiles."""
    done: list[ReqOutput | None] = []
    try:
        for r in reqs:
            try:
                if r.guide is not None:
                    await asyncio.wrap_future(r.guide)
                done.append(None)
            except asyncio.CancelledError:
                if asyncio.current_task().cancelling():
                    raise  # the awaiting task itself was cancelled (its compiles are cancelled below)
                done.append(_cancelled(r))
    except BaseException:
        for r in reqs:
            if r.guide is not None:
                r.guide.cancel()
        raise
    return done


async def _one_chunk(chunk: dict):
    yield chunk


class OfflineAPI:
    """generate() and friends for an engine with build_request, submit and abort (EngineProtocol)."""

    def generate(self, prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                 logprob_start_len=None, top_logprobs_num=None, return_text_in_logprobs=False,
                 rid=None, stream=False, extra_key=None, lora_path=None):
        """Generate for one prompt (dict result) or a list (list of dicts, input order); stream=True yields chunks.
        lora_path: a LoRA adapter's name, or one per prompt (None: the base model)."""
        inputs, is_batch = generate_inputs(prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                                           top_logprobs_num, return_text_in_logprobs, rid, extra_key, stream,
                                           lora_path)
        reqs = [self.build_request(i) for i in inputs]
        done = wait_guides(reqs)  # compile errors raise here, in the caller (ValueError)
        if stream:
            return self._stream(reqs[0]) if done[0] is None else iter([done[0].to_json()])
        waiter = BatchWaiter([r.rid for r in reqs])
        for r, early in zip(reqs, done):
            if early is None:
                self.submit(r, waiter)
            else:
                waiter(StepOutputs([early]))
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
                 "rid", "extra_key", "lora_path")
        if set(kwargs) - set(names):
            raise ValueError(f"unknown argument(s) {sorted(set(kwargs) - set(names))}")

        def build():  # tokenizing runs off the event loop; compiles run in the engine's worker processes
            inputs, is_batch = generate_inputs(prompt, sampling_params, stream=stream, **kwargs)
            return [self.build_request(i) for i in inputs], is_batch

        reqs, is_batch = await asyncio.get_running_loop().run_in_executor(None, build)
        done = await async_wait_guides(reqs)  # a cancelled task cancels the compiles it waits for
        if stream:
            return self._astream(reqs[0]) if done[0] is None else _one_chunk(done[0].to_json())
        waiter = BatchWaiter([r.rid for r in reqs])
        for r, early in zip(reqs, done):
            if early is None:
                self.submit(r, waiter)
            else:
                waiter(StepOutputs([early]))
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
