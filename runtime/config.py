"""EngineConfig: how the engine runs (frozen, validated; one `sglpy serve` flag per field)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

SCHEDULE_POLICIES = ("lpm", "dfs-weight", "fcfs")
DTYPES = ("float32", "bfloat16", "float16")
LORA_DTYPES = ("auto", "float32", "bfloat16")
# weight-only, quantized at load (runtime/model/quantization.py); auto = on CPU int4 for weights already on a 4-bit
# grid, else int8 (both pass benchmarks/quality_gate.py and are faster), none elsewhere (see resolve_quantization)
QUANTIZATION_MODES = ("auto", "none", "int8", "int4")
# auto = bf16 for a quantized model on CPU (native attention kernels), else the model dtype (memory/kv_pool.py)
KV_CACHE_DTYPES = ("auto", "float32", "bfloat16", "bf16", "float16", "fp16")
JUMP_MIN_TOKENS_GRAPHS = 8  # auto jump_forward_min_tokens under CUDA graphs (benchmarks/json_decode.py --jump-min-tokens)
SPECULATIVE_ALGORITHMS = ("NGRAM", "STANDALONE")  # SGLang's names; EAGLE/MTP need trained heads we do not have
CPU_MAX_TOTAL_TOKENS = 65536  # the most KV pool tokens on CPU when max_total_tokens is not given (memory/sizing.py)


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs. Every field maps onto a `sglpy serve` flag of the same name."""

    model: str | None = None  # HF folder or .gguf; None = embedded default model
    dtype: str = "float32"  # float32 on CPU: measured far faster than bf16 on this class of CPU
    device: str = "auto"  # auto = cuda when available, else cpu
    max_total_tokens: int | None = None  # KV pool size in tokens; None: from free memory (at most 65536 on CPU)
    mem_fraction_static: float = 0.85  # share of total device (CPU: machine) memory for weights + KV pool (SGLang's)
    max_running_requests: int = 128
    max_prefill_tokens: int = 4096  # token budget of one prefill step
    chunked_prefill_size: int = 1024  # a longer uncached prompt is prefilled in chunks of this size
    max_context_len: int | None = None  # None = the model's max_position_embeddings
    schedule_policy: str = "lpm"
    disable_radix_cache: bool = False
    disable_jump_forward: bool = False
    # a jump that appends fewer tokens than this is left to the decode steps (it would not pay); None = auto:
    # 1 where decode runs eagerly (CPU), JUMP_MIN_TOKENS_GRAPHS where it runs through CUDA graphs, since there
    # the jumped tokens' extend takes the whole step off the graph (docs/runtime.md, measured)
    jump_forward_min_tokens: int | None = None
    num_threads: int | None = None  # torch CPU threads; None = torch default
    seed: int = 0
    debug_invariants: bool = False  # check KV accounting after every step (tests)
    quantization: str = "auto"  # weight-only quantization at load: auto (= none for now), none, int8, int4
    kv_cache_dtype: str = "auto"  # KV pool storage (auto: bf16 for quantized CPU models); converted while reading
    grammar_workers: int = 2  # compile worker processes; 0 = compile on a thread of the engine (holds its GIL)
    grammar_compile_timeout: float = 5.0  # compile budget: CPU seconds (= sglpy.grammar.budget.COMPILE_TIME_S)
    grammar_max_states: int = 20_000  # largest automaton one constraint (or EBNF terminal) may compile to
    tp_size: int = 1  # tensor-parallel ranks (SGLang's --tp-size); rank 0 is the engine process
    nnodes: int = 1  # machines the tp_size ranks are spread over (tp_size / nnodes ranks each)
    node_rank: int = 0  # this machine's index; node 0 runs the engine, others only start their ranks
    dist_init_addr: str | None = None  # host:port of rank 0's rendezvous; None = a free loopback port (one node)
    dist_timeout: float = 120.0  # seconds a tensor-parallel collective (or the rendezvous) may wait for a rank
    # CUDA graphs for decode (runtime/model/cuda_graph.py). None = on for CUDA, off on CPU; False on CPU runs
    # the same padded-bucket decode path eagerly (tests); True = off everywhere
    disable_cuda_graph: bool | None = None
    cuda_graph_max_bs: int = 160  # largest captured decode batch (capped by max_running_requests)
    # tokens per request of the captured multi-token steps (runtime/model/extend_graph.py): a step where requests
    # extend by up to this many tokens (jump-forward spans, speculative drafts) stays on a graph; 1 = off
    cuda_graph_extend_tokens: int = 8
    # overlap scheduling (engine/overlap.py): None = on for CUDA, off on CPU; False forces it on (CPU tests)
    disable_overlap_schedule: bool | None = None
    # thinking section of reasoning models (runtime/reasoning.py): qwen3 or deepseek-r1 (SGLang's --reasoning-parser);
    # constraints then apply after `</think>`, and chat responses carry reasoning_content
    reasoning_parser: str | None = None
    max_thinking_tokens: int | None = None  # past this many thinking tokens a constrained request gets `</think>`
    # deterministic inference (SGLang's --enable-deterministic-inference): a request's tokens and logprobs do not
    # depend on what it is batched with, on the radix cache or on the prefill chunking (docs/determinism.md)
    enable_deterministic_inference: bool = False
    # speculative decoding (SGLang's flag names): NGRAM (prompt lookup) or STANDALONE (a draft model); guessed tokens
    # are verified in one target forward, so greedy outputs are unchanged and sampling keeps its distribution
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None  # STANDALONE: the draft model (same tokenizer as the target)
    speculative_num_draft_tokens: int = 4  # most tokens guessed per request per step (NGRAM adapts below this)
    speculative_ngram_min_match_window_size: int = 1  # NGRAM: shortest suffix matched against prompt + output
    speculative_ngram_max_match_window_size: int = 12  # NGRAM: longest suffix tried first
    # STANDALONE: draft model decode steps per round, i.e. tokens guessed (SGLang's name; its chain verifies
    # num_steps + 1 tokens); None = speculative_num_draft_tokens
    speculative_num_steps: int | None = None
    # STANDALONE: the draft model's weight-only quantization (SGLang's name): auto, none, int8, int4; None = auto
    speculative_draft_model_quantization: str | None = None
    # LoRA adapters per request (SGLang's flag names; runtime/lora/, docs/lora.md): adapters loaded at startup as
    # `name=path`, a path, or the JSON object {"lora_name", "lora_path", "pinned"}; enable_lora None = on when given
    enable_lora: bool | None = None
    lora_paths: tuple | None = None
    max_loras_per_batch: int = 8  # distinct adapters one batch may mix (the pool's slots)
    max_loaded_loras: int | None = None  # adapters loaded at once (None: no limit)
    lora_eviction_policy: str = "lru"  # which pool slot a newly needed adapter overwrites: lru or fifo
    max_lora_rank: int | None = None  # the pool's rank; None = the largest startup adapter's (16 without any)
    lora_target_modules: tuple[str, ...] | None = None  # the pool's modules; None = the startup adapters' (all)
    # the adapter pool's dtype (vLLM's lora_dtype): auto = bfloat16 under a quantized CPU base (half the bytes a decode
    # step reads, docs/lora.md), else the model's dtype
    lora_dtype: str = "auto"
    # vision models (docs/vision.md): what one image and one prompt may hold, checked before the engine sees them
    max_image_bytes: int = 20 * 1024 * 1024
    max_image_pixels: int = 40_000_000
    max_images_per_request: int = 16
    allow_image_paths: bool = False  # read image_data given as server-side file paths (off: remote clients send data)
    vision_cache_tokens: int = 65536  # vision encoder outputs kept by image hash, in image tokens (LRU)

    def __post_init__(self):
        for name in ("max_image_bytes", "max_image_pixels", "max_images_per_request", "vision_cache_tokens"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        self._check_speculative()
        self._check_lora()
        j = self.jump_forward_min_tokens
        if j is not None and (isinstance(j, bool) or not isinstance(j, int) or j < 1):
            raise ValueError(f"jump_forward_min_tokens must be an int >= 1 or unset (auto), got {j!r}")
        if self.enable_deterministic_inference not in (True, False):
            raise ValueError(f"enable_deterministic_inference must be true or false, "
                             f"got {self.enable_deterministic_inference!r}")
        if self.reasoning_parser is not None:
            from .reasoning import reasoning_format

            reasoning_format(self.reasoning_parser)  # ValueError names the parsers
        if self.max_thinking_tokens is not None and (not isinstance(self.max_thinking_tokens, int)
                                                     or self.max_thinking_tokens < 0):
            raise ValueError(f"max_thinking_tokens must be an int >= 0, got {self.max_thinking_tokens!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda[:N], got {self.device!r}")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy must be one of {SCHEDULE_POLICIES}, got {self.schedule_policy!r}")
        t = self.cuda_graph_extend_tokens
        if isinstance(t, bool) or not isinstance(t, int) or not 1 <= t <= 64:
            raise ValueError(f"cuda_graph_extend_tokens must be an int in [1, 64], got {t!r}")
        for name in ("max_running_requests", "max_prefill_tokens", "chunked_prefill_size", "cuda_graph_max_bs"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        if self.max_total_tokens is not None and (not isinstance(self.max_total_tokens, int)
                                                  or self.max_total_tokens <= 0):
            raise ValueError(f"max_total_tokens must be a positive int, got {self.max_total_tokens!r}")
        f = self.mem_fraction_static
        if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0 < f < 1:
            raise ValueError(f"mem_fraction_static must be a number in (0, 1), got {f!r}")
        for name in ("disable_cuda_graph", "disable_overlap_schedule"):
            if getattr(self, name) not in (None, True, False):
                raise ValueError(f"{name} must be true, false or unset (auto), got {getattr(self, name)!r}")
        if self.max_context_len is not None and self.max_context_len <= 1:
            raise ValueError(f"max_context_len must be > 1, got {self.max_context_len}")
        if self.quantization not in QUANTIZATION_MODES:
            raise ValueError(f"quantization must be one of {QUANTIZATION_MODES}, got {self.quantization!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if not isinstance(self.grammar_workers, int) or not 0 <= self.grammar_workers <= 64:
            raise ValueError(f"grammar_workers must be an int in [0, 64], got {self.grammar_workers!r}")
        t = self.grammar_compile_timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 3600:
            raise ValueError(f"grammar_compile_timeout must be a number of seconds in (0, 3600], got {t!r}")
        if not isinstance(self.grammar_max_states, int) or self.grammar_max_states < 2:
            raise ValueError(f"grammar_max_states must be an int >= 2, got {self.grammar_max_states!r}")
        self._check_parallel()
        if self.num_threads is not None and self.num_threads <= 0:
            raise ValueError(f"num_threads must be positive, got {self.num_threads}")

    def _check_speculative(self) -> None:
        alg = self.speculative_algorithm
        if alg is not None and alg not in SPECULATIVE_ALGORITHMS:
            raise ValueError(f"speculative_algorithm must be one of {SPECULATIVE_ALGORITHMS} or unset, got {alg!r}")
        if alg == "STANDALONE" and not self.speculative_draft_model_path:
            raise ValueError("speculative_algorithm STANDALONE needs speculative_draft_model_path (the draft model)")
        if self.speculative_draft_model_path and alg != "STANDALONE":
            raise ValueError("speculative_draft_model_path is only used with speculative_algorithm STANDALONE, "
                             f"got {alg!r}")
        for name in ("speculative_num_draft_tokens", "speculative_ngram_min_match_window_size",
                     "speculative_ngram_max_match_window_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 64:
                raise ValueError(f"{name} must be an int in [1, 64], got {v!r}")
        for name in ("speculative_num_steps", "speculative_draft_model_quantization"):
            if getattr(self, name) is not None and alg != "STANDALONE":
                raise ValueError(f"{name} is only used with speculative_algorithm STANDALONE, got {alg!r}")
        v = self.speculative_num_steps
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 15):
            raise ValueError(f"speculative_num_steps must be an int in [1, 15] or unset, got {v!r}")
        q = self.speculative_draft_model_quantization
        if q is not None and q not in QUANTIZATION_MODES:
            raise ValueError(f"speculative_draft_model_quantization must be one of {QUANTIZATION_MODES} or unset, "
                             f"got {q!r}")
        if self.speculative_ngram_min_match_window_size > self.speculative_ngram_max_match_window_size:
            raise ValueError("speculative_ngram_min_match_window_size must be <= speculative_ngram_max_match_window_size")

    def _check_parallel(self) -> None:
        for name in ("tp_size", "nnodes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be an int >= 1, got {v!r}")
        if isinstance(self.node_rank, bool) or not isinstance(self.node_rank, int) \
                or not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be an int in [0, nnodes - 1] = [0, {self.nnodes - 1}], "
                             f"got {self.node_rank!r}")
        if self.tp_size % self.nnodes:
            raise ValueError(f"tp_size ({self.tp_size}) must be divisible by nnodes ({self.nnodes})")
        if self.dist_init_addr is not None:
            host, sep, port = str(self.dist_init_addr).rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"dist_init_addr must look like host:port, got {self.dist_init_addr!r}")
        elif self.nnodes > 1:
            raise ValueError(f"nnodes={self.nnodes} needs dist_init_addr (host:port of node 0)")
        t = self.dist_timeout
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not 0 < t <= 86400:
            raise ValueError(f"dist_timeout must be a number of seconds in (0, 86400], got {t!r}")

    def _check_lora(self) -> None:
        if self.enable_lora not in (None, True, False):
            raise ValueError(f"enable_lora must be true, false or unset (auto), got {self.enable_lora!r}")
        if self.lora_paths is not None:
            from .lora.spec import parse_lora_paths  # torch-free at import: names and paths only

            object.__setattr__(self, "lora_paths", parse_lora_paths(self.lora_paths))
            if self.enable_lora is False and self.lora_paths:
                raise ValueError("lora_paths given with enable_lora false")
        for name in ("max_loras_per_batch", "max_loaded_loras", "max_lora_rank"):
            v = getattr(self, name)
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.lora_eviction_policy not in ("lru", "fifo"):
            raise ValueError(f"lora_eviction_policy must be lru or fifo, got {self.lora_eviction_policy!r}")
        if self.lora_dtype not in LORA_DTYPES:
            raise ValueError(f"lora_dtype must be one of {LORA_DTYPES}, got {self.lora_dtype!r}")
        if self.lora_target_modules is not None:
            from .lora.spec import LORA_MODULES

            mods = (self.lora_target_modules,) if isinstance(self.lora_target_modules, str) else \
                tuple(self.lora_target_modules)
            if mods in (("all",), ("all-linear",)):
                mods = LORA_MODULES
            bad = sorted(set(mods) - set(LORA_MODULES))
            if bad:
                raise ValueError(f"lora_target_modules {bad} are not supported (supported: {list(LORA_MODULES)})")
            object.__setattr__(self, "lora_target_modules", mods)
        if self.lora_enabled:
            if self.tp_size > 1:
                raise ValueError(f"LoRA adapters are not supported with tensor parallelism (tp_size={self.tp_size})")
            if self.enable_deterministic_inference:
                raise ValueError("LoRA adapters are not supported with enable_deterministic_inference (the "
                                 "segmented LoRA matmul's reduction depends on the batch's rows per adapter)")

    @property
    def lora_enabled(self) -> bool:
        """LoRA adapters can be served: enable_lora, or lora_paths given."""
        return bool(self.enable_lora) or (self.enable_lora is None and bool(self.lora_paths))

    @property
    def ranks_per_node(self) -> int:
        """Tensor-parallel ranks each node runs."""
        return self.tp_size // self.nnodes

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "EngineConfig":
        """Build from keyword arguments, naming any unknown field."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown engine option(s) {unknown}; known: {sorted(known)}")
        return cls(**kwargs)
