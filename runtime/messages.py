"""The engine's message vocabulary: requests in, per-step outputs out; the same dataclasses in-process and on the pipe.

In-process, `Engine.submit(GenerateReq, sink)` and the Engine's inbox carry these types; between the server
process and the engine process they are pickled over two one-way pipes (a frozen dataclass is not
re-validated when unpickled, so a request validated once in the server stays validated).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from concurrent.futures import Future
from typing import TYPE_CHECKING

from .sampling_params import LogprobOptions, SamplingParams

if TYPE_CHECKING:
    from .model.image_processor import MultimodalInputs


# ---------------------------------------------------------------- requests (to the engine)
TRACE_MODES = (None, "final", "live")  # GenerateReqInput.trace


@dataclass(frozen=True)
class GenerateReqInput:
    """One prompt before tokenization (text or input_ids) with its validated parameters (server -> engine process)."""

    rid: str
    text: str | None = None
    input_ids: list[int] | None = None
    sampling: SamplingParams = field(default_factory=SamplingParams)
    logprob: LogprobOptions = field(default_factory=LogprobOptions)
    extra_key: str | None = None  # prefix-cache namespace (SGLang's cache salt)
    stream: bool = False  # an output after every step, not only the final one
    # record a per-token trace, delivered as meta_info["trace"] (engine/request_trace.py): "final" with the final
    # output only, "live" with every output (the web console's stream); None: nothing recorded
    trace: str | None = None
    max_thinking_tokens: int | None = None  # reasoning models: this request's thinking bound (None: the engine's)
    lora_path: str | None = None  # the LoRA adapter to run with (its name, SGLang's field); None = the base model
    image_data: tuple[bytes, ...] | None = None  # the prompt's images in order, encoded and checked (runtime/images.py)

    def __post_init__(self):
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("give exactly one of prompt (text) or input_ids")
        if self.text is not None and not isinstance(self.text, str):
            raise ValueError(f"prompt must be a string, got {type(self.text).__name__}")
        if self.text == "":
            raise ValueError("prompt is empty")
        if self.input_ids is not None and (not isinstance(self.input_ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in self.input_ids)):
            raise ValueError("input_ids must be lists of ints")
        if self.trace not in TRACE_MODES:
            raise ValueError(f"trace must be one of {TRACE_MODES}, got {self.trace!r}")
        if self.extra_key is not None and not isinstance(self.extra_key, str):
            raise ValueError(f"extra_key must be a string, got {type(self.extra_key).__name__}")
        if self.lora_path is not None and (not isinstance(self.lora_path, str) or not self.lora_path):
            raise ValueError(f"lora_path must be an adapter's name (a non-empty string), got {self.lora_path!r}")


@dataclass(frozen=True)
class GenerateReq:
    """A request ready for the scheduler: validated and tokenized once (engine/request_builder.py)."""

    rid: str
    input_ids: list[int]
    sampling: SamplingParams  # max_new_tokens resolved (never None)
    logprob: LogprobOptions
    extra_key: str | None
    stream: bool
    # the constraint's compile: a concurrent.futures.Future of its grammar Guide (None without a constraint)
    guide: Future | None = field(default=None, repr=False, compare=False)
    trace: str | None = None  # GenerateReqInput.trace
    max_thinking_tokens: int | None = None  # GenerateReqInput.max_thinking_tokens
    lora_path: str | None = None  # GenerateReqInput.lora_path
    mm: MultimodalInputs | None = None  # of a prompt with images (its ids then hold image ids)


@dataclass(frozen=True)
class AbortReq:
    """Abort a waiting or running request; an unknown rid is ignored."""

    rid: str


@dataclass(frozen=True)
class FlushCacheReq:
    """Empty the prefix cache (refused while requests run). Reply: bool."""


@dataclass(frozen=True)
class GetServerInfoReq:
    """The engine's configuration, pool, queue and counters. Reply: dict."""


@dataclass(frozen=True)
class TokenizeReq:
    """Token ids of each text. Reply: list[list[int]]."""

    texts: list[str]
    add_special_tokens: bool = True


@dataclass(frozen=True)
class DetokenizeReq:
    """The text of token ids (400 for ids outside the vocabulary). Reply: str."""

    ids: list[int]
    skip_special_tokens: bool = False


@dataclass(frozen=True)
class ChatPromptReq:
    """The prompt the model's chat template renders for messages. Reply: str."""

    messages: list[dict]
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    template_kwargs: dict | None = None


@dataclass(frozen=True)
class ShutdownReq:
    """Abort everything and stop."""


@dataclass(frozen=True)
class LoadLoraReq:
    """Load a LoRA adapter (PEFT folder) and serve it under lora_name (SGLang's /load_lora_adapter)."""

    lora_name: str
    lora_path: str


@dataclass(frozen=True)
class UnloadLoraReq:
    """Stop serving a LoRA adapter; refused while a waiting or running request uses it."""

    lora_name: str


@dataclass(frozen=True)
class ListLorasReq:
    """The LoRA adapters served now (name, path, rank, alpha, target modules)."""


CallRequest = (FlushCacheReq | GetServerInfoReq | TokenizeReq | DetokenizeReq | ChatPromptReq | LoadLoraReq
               | UnloadLoraReq | ListLorasReq)


@dataclass(frozen=True)
class Call:
    """A call across the pipe: the request and the id its CallResult carries back (server -> engine process)."""

    call_id: int
    request: CallRequest


# ---------------------------------------------------------------- outputs (from the engine)
@dataclass(frozen=True)
class ReqOutput:
    """One request's cumulative output after a step (SGLang's /generate object) and whether it is the last."""

    rid: str
    text: str
    output_ids: list[int]
    meta_info: dict
    finished: bool

    def to_json(self) -> dict:
        """The SGLang /generate response object."""
        return {"text": self.text, "output_ids": list(self.output_ids), "meta_info": self.meta_info}


@dataclass(frozen=True)
class StepOutputs:
    """Every output one engine step produced for one sink (one pipe message per step in the engine process)."""

    outputs: list[ReqOutput]


@dataclass(frozen=True)
class EngineInfo:
    """What the server needs to know about the model once: path, context, tokenizer facts."""

    model_path: str
    context_len: int
    vocab_size: int
    chat_template: str | None
    special_tokens: dict
    model_type: str | None = None
    architectures: tuple[str, ...] = ()
    supports_constraints: bool = True  # False: regex / json_schema / ebnf / choices requests are refused
    image_placeholder: str | None = None  # vision models: the prompt text that stands for one image; None: text-only


@dataclass(frozen=True)
class LoadModel:
    """Server -> a standby engine process (imports done, waiting): build the engine now."""


# ---------------------------------------------------------------- engine process -> server process
@dataclass(frozen=True)
class Ready:
    """The model is loaded."""

    info: EngineInfo


@dataclass(frozen=True)
class StartupFailed:
    """The engine could not be built."""

    message: str


@dataclass(frozen=True)
class EngineProgress:
    """Step-loop liveness (EngineProtocol.progress), sent as a heartbeat: /health calls a loop that stays busy
    without progress for --health-stall-timeout stalled."""

    steps: int  # scheduling rounds that did work since start
    busy: bool  # work is waiting (queued, running, or a message the loop has not taken yet)
    idle_s: float  # seconds since the loop last finished a step (or woke up with work)


@dataclass(frozen=True)
class Failed:
    """A generation was rejected before it started (status 400) or failed in the engine (500; 503: engine gone)."""

    rid: str
    message: str
    status: int


CallValue = bool | str | dict | list | None  # what a CallRequest is answered with (its docstring says which)


@dataclass(frozen=True)
class CallResult:
    """The answer to a Call."""

    call_id: int
    value: CallValue = None
    error: str | None = None
    status: int = 200


class EngineError(Exception):
    """A request the engine rejected or could not finish; `status` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str, retry_after: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.retry_after = retry_after  # seconds for a 503's Retry-After (None: the server's --retry-after)
