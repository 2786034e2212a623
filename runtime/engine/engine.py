"""The runtime Engine: one background step loop (schedule -> forward -> process -> emit) serving many callers.

Requests enter as GenerateReq (built once by request_builder) with a sink; the loop's inbox carries the
typed messages of runtime/messages.py; every step emits one StepOutputs per sink. `generate()` is SGLang's
offline API on top (engine/offline_api.py: thread-safe; async and streaming variants). Not to be confused with the frontend
backend `sgl.Engine` (sglpy/backend_engine.py), which wraps this class.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import sys
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..config import CPU_MAX_TOTAL_TOKENS, EngineConfig
from ..core import EngineProgress, OutputSink, Req
from ..memory.kv_manager import KVManager
from ..memory.kv_pool import KVPool, ReqToTokenPool
from ..memory.radix_cache import RadixCache
from ..memory.sizing import CPU_MIN_TOTAL_TOKENS, MemoryPlan, kv_bytes_per_token, plan_cpu_kv_pool, plan_cuda_kv_pool
from ..messages import AbortReq, EngineInfo, FlushCacheReq, GenerateReq, GenerateReqInput, GetServerInfoReq, ShutdownReq
from ..model.image_processor import VisionProcessor, attach_images
from ..model.loader import resolve_model_path
from ..model.runner import ModelRunner
from .detokenizer import IncrementalDetokenizer
from ..images import ImageLimits
from .isolation import Isolation
from .reasoning_guide import reasoning_tokens
from .processor import OutputProcessor
from .request_trace import RequestTrace
from .offline_api import OfflineAPI
from .request_builder import RequestLimits, build_request
from .penalties import Penalties
from .sampler import Sampler
from .scheduler import Scheduler
from .admission import Admission, SubmitMsg
from .spec.drafter import check_speculation, make_drafter
from .spec.verify import Verifier
from .step import Stepper
from .step_loop import CallMsg, EngineLoop
from .tokenizer_ops import TokenizerOps

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _LoraOp:
    """A change to (or a read of) the loaded LoRA adapters, run on the loop thread between steps."""

    run: Callable[["Engine"], Any]


def _later(kind, value):
    """A constraint's compile deferred until the request's images are checked (Engine.build_request)."""
    return None


class Engine(OfflineAPI):
    """Continuous-batching engine. Implements EngineProtocol; generate() results use SGLang's /generate shape."""

    def __init__(self, model: str | None = None, **kwargs: Any):
        self.config = cfg = EngineConfig.from_kwargs(model=model, **kwargs)
        check_speculation(cfg)  # settings it does not honour are refused by name, before any memory is taken
        if cfg.num_threads:
            torch.set_num_threads(cfg.num_threads)
        from transformers import AutoTokenizer

        self.model_path = resolve_model_path(cfg.model)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        self.text = TokenizerOps(self.tokenizer)
        self.stats = {"num_requests": 0, "prompt_tokens": 0, "generation_tokens": 0, "cached_tokens": 0,
                      "num_steps": 0, "num_aborted": 0, "step_s": 0.0}
        self._inbox: queue.Queue = queue.Queue()
        # requests wait for their constraint compile here, and enter the scheduler on the loop thread
        self.admission = Admission(self._new_req, lambda r: self.loop.admit(r), self._inbox.put)
        self.loop: EngineLoop | None = None  # built on the loop thread with the model
        self._stopped = False
        self.failure: str | None = None  # why the engine stopped serving (a tensor-parallel rank failed)
        # The model is loaded on the loop thread, not here: torch's OpenMP (libgomp) gives every thread that runs a
        # parallel op its own worker pool, and once two pools exist on a machine with few cores their workers stop
        # spinning between ops, which made every decode step 1.5-2x slower (docs/runtime.md, "CPU threads").
        started: Future = Future()
        self._thread = threading.Thread(target=self._run, args=(started,), name="sglpy-engine", daemon=True)
        self._thread.start()
        started.result()  # a failed load raises here, in the caller

    def _run(self, started: Future) -> None:
        """Loop thread: load the model and build around it, report the start, then serve until shutdown."""
        try:
            self.runner = r = ModelRunner(self.config, self.model_path)
            try:
                self._build_around(self.config, r)
            except BaseException:
                r.close()  # tensor-parallel ranks already started must not outlive a failed start
                raise
        except BaseException as e:  # noqa: BLE001 - re-raised in the constructing thread
            self._stopped = True
            started.set_exception(e)
            return
        started.set_result(None)
        failure = self.loop.run()
        if failure is not None:
            self.failure = failure
        self._stopped = True

    def _build_around(self, cfg: EngineConfig, r: ModelRunner) -> None:
        """KV memory, scheduler, constrained decoding and the output processor around a loaded runner."""
        self.max_context = r.max_context
        kv_dtype = r.kv_dtype(cfg.kv_cache_dtype)
        self.memory_plan, total = self._pool_size(kv_bytes_per_token(r.num_layers, r.num_kv_heads, r.head_dim,
                                                                     torch.empty((), dtype=kv_dtype).element_size()))
        self.kv = KVManager(KVPool(r.num_layers, total, r.num_kv_heads, r.head_dim, kv_dtype, r.device),
                            ReqToTokenPool(cfg.max_running_requests, self.max_context, r.device),
                            RadixCache(disable=cfg.disable_radix_cache))
        r.init_decode_graphs(cfg, self.kv.buffers, self.kv.padding)
        self.limits = RequestLimits(r.vocab_size, self.max_context, total)
        self.image_limits = ImageLimits(cfg.max_image_bytes, cfg.max_image_pixels, cfg.max_images_per_request,
                                        cfg.allow_image_paths)
        from transformers import AutoConfig

        self.vision = VisionProcessor(self.model_path, AutoConfig.from_pretrained(self.model_path),
                                      r.model.tokens_per_image) if r.vision else None
        self.scheduler = Scheduler(cfg, self.kv, self.max_context,
                                   span_cap=cfg.cuda_graph_extend_tokens if r.extend_graphs is not None else None)
        self.eos_ids = self._eos_ids()
        drafter = make_drafter(cfg, self.eos_ids, self.tokenizer, r.vocab_size, self.max_context, total)
        from .constrained import ConstrainedDecoding, jump_min_tokens

        self.isolation = Isolation()  # per-request failures in the step; `.hook` injects faults in tests
        captured = bool(r.graphs is not None and r.graphs.graphs)  # decode off the graph costs a whole step
        self.constrained = ConstrainedDecoding(self.tokenizer, r.vocab_size, self.eos_ids,
                                               jump_forward=not cfg.disable_jump_forward, isolation=self.isolation,
                                               workers=cfg.grammar_workers, timeout_s=cfg.grammar_compile_timeout,
                                               max_states=cfg.grammar_max_states,
                                               think=reasoning_tokens(cfg, self.tokenizer),
                                               min_jump_tokens=jump_min_tokens(cfg, captured))
        penalties = Penalties()
        sampler = Sampler(cfg.seed, r.device, batch_invariant=cfg.enable_deterministic_inference, penalties=penalties)
        self.processor = OutputProcessor(sampler, self.eos_ids, self.max_context, self.constrained, self.isolation)
        verifier = (Verifier(self.processor, sampler, penalties, self.constrained.masks, self.eos_ids, self.kv)
                    if drafter is not None else None)
        cuda = r.device.type == "cuda"
        overlap = cfg.disable_overlap_schedule is False or (cfg.disable_overlap_schedule is None and cuda)
        if cfg.tp_size > 1 or cfg.speculative_algorithm:
            overlap = False  # placeholders would travel to other ranks unresolved; drafts are verified in order
        stepper = Stepper(scheduler=self.scheduler, runner=r, kv=self.kv, processor=self.processor,
                          constrained=self.constrained, isolation=self.isolation, tokenizer=self.tokenizer,
                          stats=self.stats, reqs={}, overlap=overlap, max_running_requests=cfg.max_running_requests,
                          debug_invariants=cfg.debug_invariants, max_context=self.max_context, drafter=drafter,
                          verifier=verifier)
        self.loop = EngineLoop(stepper, self.admission, self._inbox, self._answer)

    @property
    def drafter(self):
        """The step's drafter under speculative decoding (engine/spec/), else None."""
        return self.loop.stepper.drafter if self.loop is not None else None

    @property
    def overlap(self) -> Stepper | None:
        """The stepper when it runs the overlapped order (engine/step.py), else None."""
        return self.loop.stepper if self.loop is not None and self.loop.stepper.overlap else None

    def _pool_size(self, per_token: int) -> tuple[MemoryPlan | None, int]:
        """KV pool size: max_total_tokens when given; on CUDA from free memory (printed); else the CPU default."""
        cfg = self.config
        if cfg.max_total_tokens is not None:
            return None, cfg.max_total_tokens
        if cfg.tp_size > 1:
            # every rank sizes its pool alike: under tensor parallelism the pool is not planned from one rank's
            # free memory (pass --max-total-tokens on CUDA)
            return None, CPU_MAX_TOTAL_TOKENS
        if self.runner.device.type == "cpu":
            plan = plan_cpu_kv_pool(cfg.mem_fraction_static, per_token, CPU_MAX_TOTAL_TOKENS)
        else:
            plan = plan_cuda_kv_pool(self.runner.device, cfg.mem_fraction_static, per_token)
        print(f"sglpy: {plan.describe()}", file=sys.stderr, flush=True)
        return plan, plan.max_total_tokens

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

    # ------------------------------------------------------------------ EngineProtocol
    def info(self) -> EngineInfo:
        """Model path, context, vocabulary, chat template and special tokens (what the server needs once)."""
        hf = self.runner.hf_config
        return EngineInfo(model_path=str(self.model_path), context_len=self.max_context,
                          vocab_size=self.text.vocab_size, chat_template=self.text.chat_template(),
                          special_tokens=self.text.special_tokens(), model_type=getattr(hf, "model_type", None),
                          architectures=(self.vision.arch,) if self.vision else
                          tuple(getattr(hf, "architectures", None) or ()), supports_constraints=True,
                          image_placeholder=self.vision.placeholder if self.vision else None)

    def build_request(self, inp: GenerateReqInput) -> GenerateReq:
        """Tokenize and validate one prompt; its constraint compile starts in a worker (req.guide: a Future)."""
        if inp.image_data:  # images first: a bad image fails before any compile starts
            req = build_request(inp, self.text, self.limits, None if inp.sampling.constraint is None else _later)
            req = attach_images(req, inp.image_data, self.vision, self.limits, self.image_limits,
                                inp.sampling.max_new_tokens is None)
            if inp.sampling.constraint is not None:
                req = dataclasses.replace(req, guide=self.constrained.compile(*req.sampling.constraint))
        else:
            req = build_request(inp, self.text, self.limits, self.constrained.compile)
        if req.lora_path is not None:  # an unknown adapter is named now; one unloaded before admission ends it there
            self.lora_adapter(req.lora_path)
        self.admission.track(req)  # abort(rid) cancels the compile
        return req

    def submit(self, req: GenerateReq, sink: OutputSink, on_error: Callable[[Exception], None] | None = None) -> None:
        """Queue a built request; `sink` gets its outputs (every step if req.stream, else only the final one).

        Never waits: a constrained request enters the scheduler once its guide is ready (engine/admission.py,
        on the loop thread); a compile that was cancelled ends it with a final abort output, one that failed too,
        or it is passed to `on_error` (loop thread) when given.
        """
        if self._stopped or not self._thread.is_alive():
            raise RuntimeError(f"the engine is not running{': ' + self.failure if self.failure else ''}")
        self._inbox.put(SubmitMsg(req, sink, on_error))

    def _new_req(self, req: GenerateReq, sink: OutputSink, guide) -> Req:
        """The engine's Req of a built request whose guide is ready (loop thread, at admission)."""
        adapter = self.lora_adapter(req.lora_path) if req.lora_path is not None else None
        # the adapter is part of the prefix-cache key: no KV is shared between adapters or with the base
        key = req.extra_key if adapter is None else f"{req.extra_key or ''}\x00lora:{adapter.uid}"
        r = Req(rid=req.rid, input_ids=req.input_ids, sampling=req.sampling, extra_key=key, lora=adapter, sink=sink,
                stream=req.stream, trace=RequestTrace(live=req.trace == "live") if req.trace else None, mm=req.mm,
                logprob=req.logprob)
        s = req.sampling
        r.detok = IncrementalDetokenizer(self.tokenizer, req.input_ids, s.skip_special_tokens,
                                         s.spaces_between_special_tokens)
        if guide is not None:
            self.constrained.attach(r, guide, req.max_thinking_tokens)  # a forced opening is appended here
        else:  # a reasoning model's thinking bound holds without a constraint too
            self.constrained.attach_thinking_bound(r, req.max_thinking_tokens)
        return r

    def abort(self, rid: str) -> None:
        """Abort a compiling, waiting or running request (its compile stops, its KV is freed); unknown rids: no-op."""
        self.admission.cancel(rid)
        self._inbox.put(AbortReq(rid))

    def flush_cache(self) -> bool:
        """Empty the radix cache; refused (False) while any request is waiting or running."""
        return self._call(FlushCacheReq())

    def get_server_info(self) -> dict:
        """Config, pool/cache sizes, queue lengths and counters."""
        return self._call(GetServerInfoReq())

    def tokenize(self, texts: list[str], add_special_tokens: bool = True) -> list[list[int]]:
        """Token ids of each text."""
        return self.text.tokenize(texts, add_special_tokens)

    def detokenize(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        """The text of token ids."""
        return self.text.detokenize(ids, skip_special_tokens)

    def chat_prompt(self, messages: list[dict], add_generation_prompt: bool = True,
                    continue_final_message: bool = False, template_kwargs: dict | None = None) -> str:
        """The prompt the model's chat template renders for `messages`."""
        return self.text.chat_prompt(messages, add_generation_prompt, continue_final_message, template_kwargs)

    def is_alive(self) -> bool:
        """True while the step loop thread runs and every local tensor-parallel rank lives (the server polls this)."""
        if not self._thread.is_alive():
            return False
        dead = self.runner.ranks_alive()
        if dead is not None and self.failure is None:
            self.failure = dead
            logger.error("%s: the engine is failed", dead)
        return dead is None

    def progress(self) -> EngineProgress:
        """Liveness: steps done, whether work is waiting, seconds since the loop last made progress (any thread)."""
        if self.loop is None:
            return EngineProgress(0, False, 0.0)
        p = self.loop.progress
        busy = not p.idle and (self.loop.has_work() or not self._inbox.empty())
        return EngineProgress(p.steps, busy, time.monotonic() - p.last)

    def shutdown(self) -> None:
        """Abort everything and stop the loop thread and the compile workers."""
        if not self._stopped:
            self.admission.cancel_all()
            self._inbox.put(ShutdownReq())
            self._thread.join(timeout=30)
        self.runner.close()  # tensor-parallel ranks: STOP, then leave the group (after the loop's last forward)
        self.constrained.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

    def _call(self, request: FlushCacheReq | GetServerInfoReq):
        if threading.current_thread() is self._thread:
            return self._answer(request)
        reply: Future = Future()
        self._inbox.put(CallMsg(request, reply))
        return reply.result()

    def _has_work(self) -> bool:
        """Anything compiling, waiting, running or in flight (loop thread, or tests once idle)."""
        return self.loop is not None and self.loop.has_work()

    def _answer(self, request):
        """A call's answer, on the loop thread."""
        if isinstance(request, _LoraOp):
            return request.run(self)
        return self._flush() if isinstance(request, FlushCacheReq) else self._info()

    # ------------------------------------------------------------------ LoRA adapters (runtime/lora/)
    def _lora(self):
        if self.runner.lora is None:
            raise ValueError("this engine serves no LoRA adapters (start it with lora_paths or enable_lora)")
        return self.runner.lora

    def lora_adapter(self, name: str):
        """The loaded adapter a request names (ValueError naming the loaded ones)."""
        return self._lora().resolve(name)

    def load_lora_adapter(self, lora_name: str, lora_path: str) -> dict:
        """Read and check a PEFT adapter here (the step loop keeps running), then serve it under lora_name."""
        adapter = self._lora().read(lora_name, lora_path)
        self._call(_LoraOp(lambda eng: eng.runner.lora.add(adapter)))
        return adapter.describe()

    def unload_lora_adapter(self, lora_name: str) -> dict:
        """Stop serving an adapter; refused (ValueError) while a waiting or running request uses it."""
        self._lora()

        def remove(eng: "Engine"):
            live = list(eng.scheduler.waiting) + list(eng.scheduler.running)
            return eng.runner.lora.remove(lora_name, live).describe()
        return self._call(_LoraOp(remove))

    def list_lora_adapters(self) -> list[dict]:
        """The adapters served now, in load order (empty without LoRA)."""
        return [] if self.runner.lora is None else self._call(_LoraOp(lambda eng: eng.runner.lora.describe()))

    def _flush(self) -> bool:
        if self._has_work():
            return False
        self.kv.flush()
        if self.runner.encoder_cache is not None:
            self.runner.encoder_cache.clear()
        if self.drafter is not None:
            self.drafter.flush()
        return True

    def _info(self) -> dict:
        kv = self.kv.stats()
        info = {k: getattr(self.config, k) for k in self.config.__dataclass_fields__}
        info["lora_paths"] = [f"{r.name}={r.path}" for r in self.config.lora_paths or ()]
        info.update({
            "quantization": self.runner.quantization,  # the mode that runs ('auto' resolved)
            "cpu_kernels": self.runner.cpu_kernels,  # 'native: ...' or 'torch reference: <why>'; None off CPU
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
            "kv_pool_plan": self.memory_plan.describe() if self.memory_plan is not None else None,
            "cuda_graph_batch_sizes": list(self.runner.graphs.buckets) if self.runner.graphs is not None else [],
            "overlap_schedule": self.overlap is not None,
            "lora_adapters": [] if self.runner.lora is None else self.runner.lora.describe(),
            "time": time.time(),
        })
        info.update(self.stats)
        info["grammar"] = {**self.constrained.stats, **self.constrained.service.stats}
        if self.drafter is not None:
            info.update(self.drafter.info())
        info["isolated_failures"] = dict(self.isolation.failures)
        if self.runner.encoder_cache is not None:  # vision models: encoder runs and cache hits by image hash
            c = self.runner.encoder_cache
            info["vision"] = {**dataclasses.asdict(c.stats), "cached_images": len(c)}
        info["tp_rank_pids"] = self.runner.rank_pids()  # this node's ranks 1..; operators (and tests) watch them
        return info
