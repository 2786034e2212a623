"""ServerConfig (HTTP server settings + the EngineConfig it starts) and its `sglpy serve` flag mapping."""

from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field

from ..config import EngineConfig
from ..tools.registry import PARSER_NAMES

DEFAULT_ENGINE_FACTORY = "sglpy.runtime.engine:Engine"
STANDBY_CHOICES = ("off", "imports", "model")  # engine_process.STANDBY_MODES (not imported: it pulls the engine side)
LOG_LEVELS = ("debug", "info", "warning", "error")
ROUTER_POLICIES = ("cache_aware", "round_robin", "power_of_two", "random")  # sglang-router's --policy values

# One help line per EngineConfig field; a field added later still gets a flag (with a generic help).
ENGINE_FLAG_HELP = {
    "model": "model: an HF folder (config.json + safetensors + tokenizer) or a .gguf file; "
    "default: the embedded SmolLM2-135M-Instruct",
    "dtype": "weight/activation dtype",
    "device": "auto (cuda when available, else cpu), cpu, or cuda[:N]",
    "max_total_tokens": "KV pool size in tokens; default: what --mem-fraction-static leaves after the weights "
    "(on CPU at most 65536)",
    "mem_fraction_static": "share of the device's total memory (CPU: the machine's, or the cgroup limit) for "
    "weights + KV pool; the pool gets what remains of it after loading the weights (printed at start)",
    "max_running_requests": "most requests decoded together in one batch",
    "max_prefill_tokens": "token budget of one prefill step",
    "chunked_prefill_size": "a longer uncached prompt is prefilled in chunks of this many tokens",
    "max_context_len": "longest prompt + output in tokens; default: the model's max_position_embeddings",
    "schedule_policy": "waiting-queue order: lpm (longest cached prefix first), dfs-weight, or fcfs",
    "disable_radix_cache": "do not reuse KV across requests (prefix cache off)",
    "disable_jump_forward": "decode forced constrained text token by token instead of jumping forward",
    "num_threads": "torch CPU threads of the engine process; default: torch's default",
    "seed": "random seed of the engine",
    "debug_invariants": "check KV accounting after every engine step (slow; for tests)",
    "quantization": "weight-only quantization at load: auto (CPU: int4 when the weights already sit on a 4-bit "
    "grid, else int8; GPU: none), none (fp32, exact HF equality), int8 (per output channel) or int4 (per group of "
    "32); the lm_head gets an int8 copy, the embedding stays exact",
    "kv_cache_dtype": "KV cache storage: auto (bf16 for a quantized model on CPU, else the model dtype), "
    "bfloat16/bf16, float16/fp16 (converted to float32 while attention reads it) or float32",
    "grammar_workers": "constraint compile worker processes (0: compile on a thread of the engine process, "
    "which stalls the step loop while it runs)",
    "grammar_compile_timeout": "CPU seconds one regex / json_schema / ebnf / choices compile may use before it "
    "is refused with 400 (wall-clock cap: 10x this + 10 s)",
    "grammar_max_states": "largest automaton (DFA states) one constraint may compile to; larger ones get 400",
    "tp_size": "tensor-parallel ranks (alias --tp): the model's heads, MLP and vocabulary split over N processes "
    "(gloo on CPU, NCCL on CUDA); num_attention_heads must divide by N",
    "nnodes": "machines the tensor-parallel ranks span (tp_size / nnodes ranks each); needs --dist-init-addr",
    "node_rank": "this machine's index: 0 serves HTTP and runs rank 0; K > 0 only runs its node's ranks",
    "dist_init_addr": "host:port where rank 0 hosts the rendezvous (node 0's address, reachable from every "
    "node); default with one node: a free loopback port",
    "dist_timeout": "seconds a tensor-parallel collective or the rendezvous may wait for a rank before the "
    "engine fails (503, then restarted)",
    "disable_cuda_graph": "decode without CUDA graphs (default: graphs on CUDA, none on CPU; "
    "--no-disable-cuda-graph on CPU runs the padded-bucket decode path eagerly, for tests)",
    "cuda_graph_max_bs": "largest decode batch captured in a CUDA graph (buckets 1, 2, 4, 8, 16, 24, ...; capped "
    "by max_running_requests); larger batches run eagerly",
    "cuda_graph_extend_tokens": "tokens per request of the captured multi-token steps (jump-forward spans, "
    "speculative drafts stay on a CUDA graph when no request extends by more); 1 = off",
    "disable_overlap_schedule": "do not prepare step n+1 on the CPU while the GPU runs step n (default: overlap on "
    "CUDA, off on CPU; --no-disable-overlap-schedule forces it on, e.g. on CPU for tests)",
    "reasoning_parser": "thinking section of reasoning models: qwen3 or deepseek-r1; chat responses then carry "
    "reasoning_content, and constraints (json_schema, regex, ebnf, tools) start after </think>",
    "max_thinking_tokens": "with --reasoning-parser: a request thinks at most this many tokens, then </think> is "
    "forced (per request: max_thinking_tokens, custom_params.thinking_budget)",
    "enable_deterministic_inference": "a request's output does not depend on what it is batched with, on the radix "
    "cache or on the prefill chunking (batch-invariant kernels; see docs/determinism.md for the cost)",
    "speculative_algorithm": "speculative decoding: NGRAM (prompt lookup) or STANDALONE (a draft model from "
    "--speculative-draft-model-path); guesses are verified in one forward, outputs unchanged",
    "speculative_draft_model_path": "STANDALONE: the draft model (HF folder or .gguf, same tokenizer as the target)",
    "jump_forward_min_tokens": "a jump-forward appending fewer tokens is left to the decode steps (default: 1 on "
    "CPU, more under CUDA graphs, where a jump's extend runs the whole step eagerly)",
    "speculative_num_draft_tokens": "most tokens guessed per request per step",
    "speculative_ngram_min_match_window_size": "NGRAM: shortest suffix of the sequence matched against its prompt "
    "and output",
    "speculative_ngram_max_match_window_size": "NGRAM: longest suffix tried first",
    "speculative_num_steps": "STANDALONE: draft model decode steps per round (tokens guessed per request; default: "
    "--speculative-num-draft-tokens)",
    "speculative_draft_model_quantization": "STANDALONE: the draft model's weight-only quantization (auto, none, "
    "int8, int4; default auto), e.g. an int4 draft of the target's own weights",
    "enable_lora": "serve LoRA adapters per request (default: on when --lora-paths is given; on without adapters, "
    "load them with POST /load_lora_adapter)",
    "lora_paths": "LoRA adapters to serve (PEFT folders): name=path, a path, or the JSON object "
    "{\"lora_name\", \"lora_path\", \"pinned\"}; requests name them in lora_path or the OpenAI model field",
    "max_loras_per_batch": "distinct LoRA adapters one batch mixes (adapter pool slots)",
    "max_loaded_loras": "LoRA adapters loaded at once (default: no limit)",
    "lora_eviction_policy": "which adapter pool slot a newly needed adapter overwrites: lru or fifo",
    "max_lora_rank": "the adapter pool's rank (default: the largest --lora-paths adapter's, 16 without any); "
    "a larger adapter is refused at load",
    "lora_target_modules": "the adapter pool's modules (q_proj k_proj v_proj o_proj gate_proj up_proj down_proj, or "
    "all; default: those of the --lora-paths adapters, all without any)",
    "lora_dtype": "the adapter pool's dtype: auto (bfloat16 under an int8/int4 CPU base, else the model's), float32 "
    "or bfloat16",
    "max_image_bytes": "vision models: largest encoded image in bytes (a larger one is a 400)",
    "max_image_pixels": "vision models: most pixels one image may declare (width x height; more is a 400)",
    "max_images_per_request": "vision models: most images in one prompt",
    "allow_image_paths": "vision models: read image_data strings that are server-side file paths (off by default)",
    "vision_cache_tokens": "vision models: encoder outputs cached by image content hash, in image tokens (LRU)",
}

LIST_FLAGS = ("lora_paths", "lora_target_modules")  # several values after one flag (SGLang's nargs)

FLAG_ALIASES = {"tp_size": ("--tp",)}  # SGLang's docs write --tp N

SERVER_FLAG_HELP = {
    "host": "interface to bind; loopback by default, use 0.0.0.0 only behind a trusted network",
    "port": "TCP port to listen on",
    "api_key": "when set, every endpoint but /health needs 'Authorization: Bearer KEY' (401 otherwise)",
    "served_model_name": "model id reported by /v1/models and in OpenAI responses; default: the model path",
    "max_request_bytes": "largest accepted request body in bytes (413 above)",
    "max_prompt_chars": "longest prompt text in characters, checked before tokenization (400 above; 0: no limit)",
    "max_constraint_bytes": "largest constraint text (json_schema, regex, ebnf, structural_tag, choices) in bytes "
    "(400 above; 0: no limit)",
    "max_schema_depth": "deepest nesting of JSON objects and arrays in a json_schema or structural_tag (400 above; "
    "0: no limit)",
    "timeout_keep_alive": "seconds an idle connection (no request in progress, or none sent yet) stays open before "
    "the server closes it (uvicorn's name, as SGLang's server uses it)",
    "max_queued_requests": "requests allowed to wait beyond max_running_requests; more get 503 + Retry-After",
    "max_queue_wait": "seconds a new generation may expect to wait (generations in flight / generations finished "
    "per busy second over the last 30 s); past it the server answers 503 + Retry-After at once instead of queueing "
    "it (at least 8 generations are always admitted; 0: off)",
    "retry_after": "seconds suggested in the Retry-After header of a 503",
    "graceful_shutdown_timeout": "on SIGTERM: seconds to let in-flight requests finish before aborting them",
    "engine_startup_timeout": "seconds to wait for the engine process to load the model",
    "health_generate_timeout": "seconds /health_generate waits for its one-token generation",
    "health_stall_timeout": "/health answers 503 when the engine's step loop has work and made no progress for "
    "this many seconds (or its process sent no heartbeat); 0 disables the check",
    "engine_restart_attempts": "when the engine process dies: start attempts before giving up (0: never restart)",
    "engine_restart_backoff": "seconds before a retried engine start (doubling per failure, at most 30 s); the "
    "first restart after a death is immediate",
    "engine_standby": "a spare engine process kept while the engine serves, so a restart after an engine death "
    "skips its work: imports (torch, transformers, the model's config and tokenizer; ~0.4 GB for the runtime "
    "engine), model (the whole engine built and waiting: a restart takes about a second; costs a second copy of "
    "the weights, and on a GPU of its KV pool), or off",
    "log_level": "logging level",
    "log_requests": "log one line per finished request (id, route, tokens, latency)",
    "engine_factory": "import path 'module:callable' that builds the engine in the engine process "
    "(tests swap in a fake engine; operators keep the default)",
    "dp_size": "data-parallel replicas: N > 1 starts N workers on 127.0.0.1 ports PORT+1..PORT+N (torch threads "
    "split between them) behind sglang-router on HOST:PORT; the launcher exits non-zero if any of them dies",
    "router_policy": "sglang-router's --policy when --dp-size > 1",
    "tool_call_parser": "tool-call format (SGLang's flag): generic, hermes (qwen25), llama3 or mistral; default: "
    "detected from the chat template (generic when it does not render tools)",
    "enable_trace": "keep a per-token trace (origins, logprobs, timeline) of the newest --trace-capacity requests "
    "in memory for GET /trace/{rid} and the web console; traces hold prompts and outputs (docs/console.md)",
    "trace_capacity": "requests kept by --enable-trace (oldest dropped first)",
}


@dataclass(frozen=True)
class ServerConfig:
    """HTTP server settings; `engine` is handed to the engine process unchanged."""

    host: str = "127.0.0.1"
    port: int = 30000
    api_key: str | None = None
    served_model_name: str | None = None
    max_request_bytes: int = 8 * 1024 * 1024
    max_prompt_chars: int = 1_000_000
    max_constraint_bytes: int = 1024 * 1024
    max_schema_depth: int = 128
    timeout_keep_alive: float = 30.0
    max_queued_requests: int = 256
    max_queue_wait: float = 20.0
    retry_after: int = 1
    graceful_shutdown_timeout: float = 10.0
    engine_startup_timeout: float = 600.0
    health_generate_timeout: float = 20.0
    health_stall_timeout: float = 30.0
    engine_restart_attempts: int = 5
    engine_restart_backoff: float = 1.0
    engine_standby: str = "imports"
    log_level: str = "info"
    log_requests: bool = True
    engine_factory: str = DEFAULT_ENGINE_FACTORY
    dp_size: int = 1  # > 1: runtime/server/replicas.py launches workers + sglang-router instead of serving
    router_policy: str = "cache_aware"
    tool_call_parser: str | None = None  # None: detected from the chat template (runtime/tools/registry.py)
    enable_trace: bool = False  # runtime/server/trace.py: every request's trace in a bounded ring
    trace_capacity: int = 100
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self):
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"host must be a non-empty string, got {self.host!r}")
        if not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port!r}")
        if self.api_key is not None and (not isinstance(self.api_key, str) or not self.api_key):
            raise ValueError("api_key must be a non-empty string when given")
        for name in ("max_request_bytes", "retry_after"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        for name in ("max_prompt_chars", "max_constraint_bytes", "max_schema_depth"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be an int >= 0 (0: no limit), got {v!r}")
        if not isinstance(self.max_queued_requests, int) or self.max_queued_requests < 0:
            raise ValueError(f"max_queued_requests must be an int >= 0, got {self.max_queued_requests!r}")
        if not isinstance(self.engine_restart_attempts, int) or not 0 <= self.engine_restart_attempts <= 1000:
            raise ValueError(f"engine_restart_attempts must be an int in [0, 1000], "
                             f"got {self.engine_restart_attempts!r}")
        if not isinstance(self.timeout_keep_alive, (int, float)) or not math.isfinite(self.timeout_keep_alive) \
                or self.timeout_keep_alive <= 0:
            raise ValueError(f"timeout_keep_alive must be a finite number > 0, got {self.timeout_keep_alive!r}")
        for name in ("graceful_shutdown_timeout", "engine_startup_timeout", "health_generate_timeout",
                     "health_stall_timeout", "engine_restart_backoff", "max_queue_wait"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
        if self.engine_standby not in STANDBY_CHOICES:
            raise ValueError(f"engine_standby must be one of {STANDBY_CHOICES}, got {self.engine_standby!r}")
        if self.log_level not in LOG_LEVELS:
            raise ValueError(f"log_level must be one of {LOG_LEVELS}, got {self.log_level!r}")
        if ":" not in self.engine_factory:
            raise ValueError(f"engine_factory must look like 'module:callable', got {self.engine_factory!r}")
        if not isinstance(self.dp_size, int) or self.dp_size < 1:
            raise ValueError(f"dp_size must be an int >= 1, got {self.dp_size!r}")
        if self.dp_size > 1 and not 0 < self.port <= 65535 - self.dp_size - 1:
            raise ValueError(f"with dp_size {self.dp_size}, port must leave room for the workers' ports "
                             f"PORT+1..PORT+{self.dp_size} and the router's metrics port, got {self.port}")
        if self.router_policy not in ROUTER_POLICIES:
            raise ValueError(f"router_policy must be one of {ROUTER_POLICIES}, got {self.router_policy!r}")
        if self.tool_call_parser is not None and self.tool_call_parser not in PARSER_NAMES:
            raise ValueError(f"tool_call_parser must be one of {', '.join(PARSER_NAMES)}, got {self.tool_call_parser!r}")
        if not isinstance(self.enable_trace, bool):
            raise ValueError(f"enable_trace must be a bool, got {self.enable_trace!r}")
        if not isinstance(self.trace_capacity, int) or isinstance(self.trace_capacity, bool) \
                or not 1 <= self.trace_capacity <= 100_000:
            raise ValueError(f"trace_capacity must be an int in [1, 100000], got {self.trace_capacity!r}")
        if not isinstance(self.engine, EngineConfig):
            raise ValueError(f"engine must be an EngineConfig, got {type(self.engine).__name__}")

    @property
    def max_inflight_requests(self) -> int:
        """Running + waiting requests the server admits before answering 503."""
        return self.engine.max_running_requests + self.max_queued_requests

    def public_dict(self) -> dict:
        """All settings for /get_server_info, with the API key redacted."""
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "engine"}
        d["api_key"] = None if self.api_key is None else "<redacted>"
        d.update(dataclasses.asdict(self.engine))
        return d


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _arg_type(annotation: str, default):
    """argparse type for a dataclass field from its (string) annotation, e.g. 'int | None' -> int."""
    base = [p.strip() for p in str(annotation).split("|") if p.strip() != "None"]
    kind = base[0] if base else type(default).__name__
    return {"int": int, "float": float, "str": str, "bool": bool}.get(kind, str)


def _add_fields(group, cls, helps: dict, skip=()):
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        text = helps.get(f.name, f"{cls.__name__}.{f.name}")
        kind = _arg_type(f.type, default)
        if kind is bool:
            group.add_argument(_flag(f.name), dest=f.name, action=argparse.BooleanOptionalAction,
                               default=default, help=f"{text} (default: {default})")
            continue
        kw = {"choices": LOG_LEVELS} if f.name == "log_level" else {}
        if f.name == "router_policy":
            kw = {"choices": ROUTER_POLICIES}
        if f.name == "engine_standby":
            kw = {"choices": STANDBY_CHOICES}
        if f.name == "tool_call_parser":
            kw = {"choices": PARSER_NAMES}
        if cls is EngineConfig and f.name == "dtype":
            from ..config import DTYPES
            kw = {"choices": DTYPES}
        if cls is EngineConfig and f.name == "schedule_policy":
            from ..config import SCHEDULE_POLICIES
            kw = {"choices": SCHEDULE_POLICIES}
        if cls is EngineConfig and f.name == "lora_eviction_policy":
            kw = {"choices": ("lru", "fifo")}
        if cls is EngineConfig and f.name == "lora_dtype":
            from ..config import LORA_DTYPES
            kw = {"choices": LORA_DTYPES}
        if f.name in LIST_FLAGS:
            kw = {"nargs": "+"}
        group.add_argument(_flag(f.name), *FLAG_ALIASES.get(f.name, ()), dest=f.name, type=kind, default=default,
                           metavar=f.name.upper(),
                           help=f"{text} (default: {default})", **kw)


def build_arg_parser(prog: str = "sglpy serve") -> argparse.ArgumentParser:
    """The `sglpy serve` parser: one flag per ServerConfig field and per EngineConfig field."""
    p = argparse.ArgumentParser(prog=prog, description="Serve a model over HTTP: SGLang-native /generate and "
                                "OpenAI-compatible /v1/* endpoints.")
    _add_fields(p.add_argument_group("server"), ServerConfig, SERVER_FLAG_HELP, skip=("engine",))
    _add_fields(p.add_argument_group("engine"), EngineConfig, ENGINE_FLAG_HELP)
    return p


def config_from_args(argv: list[str] | None = None) -> ServerConfig:
    """Parse `sglpy serve` flags into a validated ServerConfig (ValueError names a bad value)."""
    ns = vars(build_arg_parser().parse_args(argv))
    engine_names = {f.name for f in dataclasses.fields(EngineConfig)}
    engine = EngineConfig(**{k: v for k, v in ns.items() if k in engine_names})
    server = {k: v for k, v in ns.items() if k not in engine_names}
    return ServerConfig(engine=engine, **server)


def config_to_args(config: ServerConfig) -> list[str]:
    """The `sglpy serve` flags that rebuild `config` (only fields that differ from their defaults)."""
    args = []
    for cls, obj in ((ServerConfig, config), (EngineConfig, config.engine)):
        default = cls() if cls is EngineConfig else ServerConfig(engine=config.engine)
        for f in dataclasses.fields(cls):
            value = getattr(obj, f.name)
            if f.name == "engine" or value == getattr(default, f.name):
                continue
            if isinstance(value, bool):
                args.append(_flag(f.name) if value else "--no-" + f.name.replace("_", "-"))
            elif isinstance(value, tuple):  # LIST_FLAGS (a LoraRef prints as its --lora-paths entry)
                args += [_flag(f.name), *map(str, value)]
            else:
                args += [_flag(f.name), str(value)]
    return args
