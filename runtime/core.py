"""Core types: Req (the one request object inside the engine), its finish reason and logprobs, batch types, EngineProtocol."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Protocol, runtime_checkable

from .messages import EngineInfo, EngineProgress, GenerateReq, GenerateReqInput, StepOutputs  # noqa: F401
from .sampling_params import LogprobOptions, SamplingParams

if TYPE_CHECKING:  # the types of Req's engine-side state (annotations only: core imports no engine module)
    import torch

    from .engine.constrained import GuideState
    from .engine.detokenizer import IncrementalDetokenizer
    from .engine.penalties import RowState
    from .engine.request_trace import RequestTrace
    from .engine.spec.ngram import SpecState
    from .lora.adapter import LoraAdapter
    from .memory.radix_cache import TreeNode
    from .model.image_processor import MultimodalInputs

_arrival = itertools.count()

# Where an engine delivers outputs: called once per step with that step's outputs for this sink.
OutputSink = Callable[[StepOutputs], None]


class ReqStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(frozen=True)
class FinishReason:
    """Why a request ended: type is 'length', 'stop' or 'abort'."""

    type: str
    matched: int | str | None = None  # stop token id, stop string or stop_regex pattern (type == 'stop')
    length: int | None = None  # completion length (type == 'length')
    message: str | None = None  # error text (type == 'abort')

    def to_json(self) -> dict:
        """SGLang's meta_info.finish_reason shape."""
        if self.type == "stop":
            return {"type": "stop", "matched": self.matched}
        if self.type == "length":
            return {"type": "length", "length": self.length}
        return {"type": "abort", "message": self.message}


@dataclass(frozen=True)
class TokenLogprob:
    """A (logprob, token id) pair with the top-k alternatives at that position."""

    logprob: float | None
    token_id: int
    top: tuple[tuple[float, int], ...] = ()


@dataclass(eq=False)  # compared and hashed by identity: a field-wise __eq__ made every `req in list` O(fields)
class Req:
    """One generation request. KV holds all_ids[:kv_len]; the next forward extends kv_len forward."""

    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    logprob: LogprobOptions = field(default_factory=LogprobOptions)
    extra_key: str | None = None
    sink: OutputSink | None = None  # receives this request's outputs (grouped per step with others of the sink)
    stream: bool = False  # an output after every step; otherwise only the final one

    output_ids: list[int] = field(default_factory=list)
    status: ReqStatus = ReqStatus.WAITING
    finish_reason: FinishReason | None = None
    arrival: int = field(default_factory=lambda: next(_arrival))
    created: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None

    # KV state
    slots: list[int] = field(default_factory=list)  # KV slots of all_ids[:kv_len]
    row: int | None = None  # row in ReqToTokenPool
    cache_node: TreeNode | None = None  # locked radix node covering slots[:cached_len_locked]
    locked_len: int = 0  # tokens of `slots` owned by the radix cache (not freed by us)
    cached_tokens: int = 0  # prompt tokens served from the cache (reported)
    num_preemptions: int = 0

    # logprobs
    input_logprobs: list[TokenLogprob] = field(default_factory=list)
    input_logprobs_done: bool = False  # set once every requested prompt position is scored
    output_logprobs: list[TokenLogprob] = field(default_factory=list)

    # output text
    detok: IncrementalDetokenizer | None = None
    text: str = ""  # output text so far (stop strings trimmed at finish)
    num_jumped_tokens: int = 0  # tokens appended by jump-forward (no model step)
    trace: RequestTrace | None = None  # when the request asked for a trace; None: nothing recorded
    grammar: GuideState | None = None  # the request's guide and its state (constrained decoding)
    generator: torch.Generator | None = None  # torch.Generator of a seeded request (created on first sample)
    sampler_state: RowState | None = None  # the sampler's per-request arrays (built on first sample)
    spec: SpecState | None = None  # under speculative decoding (draft length, counters); else None
    lora: LoraAdapter | None = None  # the adapter the request runs with; None = the base model
    mm: MultimodalInputs | None = None  # the prompt's images (vision models); else None

    @property
    def all_ids(self) -> list[int]:
        """Prompt followed by outputs."""
        return self.input_ids + self.output_ids

    @property
    def kv_len(self) -> int:
        """Tokens whose K/V is in the pool."""
        return len(self.slots)

    @property
    def seq_len(self) -> int:
        """Prompt + output tokens."""
        return len(self.input_ids) + len(self.output_ids)

    @property
    def pending(self) -> int:
        """Tokens the next forward must extend."""
        return self.seq_len - self.kv_len

    @property
    def finished(self) -> bool:
        """True once a finish reason is set."""
        return self.finish_reason is not None

    def wants_input_logprobs(self) -> bool:
        """Prompt-token logprobs still to compute: some entry from logprob_start_len on carries a value."""
        start = self.logprob.logprob_start_len
        return (self.logprob.return_logprob and 0 <= start < len(self.input_ids)
                and (start > 0 or len(self.input_ids) > 1) and not self.input_logprobs_done)

    def input_logprob_start(self) -> int:
        """First prompt position with an input_token_logprobs entry: logprob_start_len, or for -1 the last
        prompt token (the pre-0.5 SGLang rule its frontend's select relies on; docs/server.md). Only the entry
        of position 0 and the single entry of -1 carry no logprob."""
        start = self.logprob.logprob_start_len
        return start if start >= 0 else len(self.input_ids) - 1


@dataclass(frozen=True)
class BatchEntry:
    """One request's part of a forward: extend KV from prefix_len by extend_len tokens."""

    req: Req
    prefix_len: int
    extend_len: int
    sample: bool  # this forward reaches the sequence end: sample the next token
    draft: tuple[int, ...] = ()  # speculative tokens after the sequence end (KV slots taken; verified after the forward)


@dataclass(frozen=True)
class ForwardOutput:
    """Logits rows and, per entry, which rows belong to it (input-logprob rows, then the sample row)."""

    logits: torch.Tensor  # [m, vocab] float32
    input_rows: list[range]  # rows scoring prompt positions (empty range when not requested)
    input_first_pos: list[int]  # absolute prompt position scored by the first input row
    sample_row: list[int | None]  # row to sample from, or None


@dataclass(frozen=True)
class ScheduledBatch:
    """One step's work: decode entries first (one token each), then extend entries."""

    entries: list[BatchEntry]
    num_decode: int
    aborted: list[Req]  # requests dropped while scheduling (e.g. can never fit); to be emitted


@runtime_checkable
class EngineProtocol(Protocol):
    """What the server's engine process needs from an engine; runtime/engine.Engine and the test FakeEngine implement it.

    Requests are built (validated, tokenized, constraint compiled) once by `build_request`, then submitted
    with a sink; the engine calls each sink once per step with that step's outputs for it.
    """

    def info(self) -> EngineInfo:
        """Model path, context length, vocabulary size, chat template and special tokens."""

    def build_request(self, inp: GenerateReqInput) -> GenerateReq:
        """Validate and tokenize one prompt; ValueError names the problem. A constraint's compile starts:
        req.guide is a concurrent Future (its exception a ValueError), None without a constraint."""

    def submit(self, req: GenerateReq, sink: OutputSink,
               on_error: Callable[[Exception], None] | None = None) -> None:
        """Queue a built request without waiting for its constraint's compile; its outputs go to `sink`. A compile
        that fails is passed to `on_error` when given (else it ends the request with a final output)."""

    def abort(self, rid: str) -> None:
        """Abort a request (its final output says so); unknown rids are ignored."""

    def flush_cache(self) -> bool:
        """Empty the prefix cache; False while requests run."""

    def get_server_info(self) -> dict:
        """Configuration, pool and queue state, counters."""

    def tokenize(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of each text."""

    def detokenize(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """The text of token ids; ValueError for ids outside the vocabulary."""

    def chat_prompt(self, messages: list[dict], add_generation_prompt: bool = True,
                    continue_final_message: bool = False, template_kwargs: dict | None = None) -> str:
        """The prompt the chat template renders; ValueError when the template fails or is missing."""

    def is_alive(self) -> bool:
        """Whether the step loop still runs (the engine process's watchdog polls it)."""

    def progress(self) -> EngineProgress:
        """Step-loop liveness, callable from any thread without waiting on the loop (the heartbeat reads it)."""

    def shutdown(self) -> None:
        """Abort everything and stop."""


def missing_engine_methods(engine: object) -> list[str]:
    """EngineProtocol methods `engine` lacks (empty for a complete implementation)."""
    names = [n for n, v in vars(EngineProtocol).items() if callable(v) and not n.startswith("_")]
    return [n for n in names if not callable(getattr(engine, n, None))]
